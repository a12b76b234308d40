"""The subagent service: a thin shell over the mgrpo library."""
