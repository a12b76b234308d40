"""The ``mgrpo`` command line. Each command group lives in its own module."""
