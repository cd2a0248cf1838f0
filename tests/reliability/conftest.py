"""Every reliability test leaves nothing behind: the same check as tests/process."""

from tests.process.conftest import ipc_base

__all__ = ["ipc_base"]
