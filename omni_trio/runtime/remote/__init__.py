"""Worker processes on other hosts: the ``manual`` and ``ray`` launchers and the worker that joins a run
over TCP."""
