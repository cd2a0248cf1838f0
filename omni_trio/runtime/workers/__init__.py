"""Worker processes on this host: the supervisor, the launchers, the template that forks workers, and
the worker's own ``trio.run``."""
