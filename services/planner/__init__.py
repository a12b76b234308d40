"""The planner service: a thin shell over the mgrpo library."""
