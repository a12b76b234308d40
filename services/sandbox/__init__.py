"""The sandbox service: a thin shell over the mgrpo library."""
