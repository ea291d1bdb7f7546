"""Tools outside the library core: the launcher's on-VM checks and the options table."""
