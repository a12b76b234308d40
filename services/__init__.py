"""Service entry points (thin shells over the mgrpo library)."""
