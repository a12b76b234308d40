"""The trainer service: a thin shell over the mgrpo library."""
