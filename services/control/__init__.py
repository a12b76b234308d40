"""The control-plane worker service: a thin shell over the mgrpo library."""
