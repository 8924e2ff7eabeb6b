"""lox's core: the log primitive, the logdict, and the spool/tap/nolog transforms."""
