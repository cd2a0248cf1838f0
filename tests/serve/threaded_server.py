"""A pipeline served with ``ot.serve_http`` on a trio loop in a thread, for a whole test module.

pytest-trio gives each test its own ``trio.run``, and the official openai client's realtime connection
runs on asyncio, so a server shared by a module runs its own loop in a thread; tests reach its
pipeline through :meth:`ThreadServer.call`, which runs a coroutine on that loop.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import attrs
import trio

import omni_trio as ot
from omni_trio.serve.limits import SocketLimits

T = TypeVar("T")
S = TypeVar("S", bound="ThreadServer")


@attrs.define
class ThreadServer:
    """The running server: its URL, and a way into its loop."""

    url: str
    pipeline: ot.Pipeline
    token: trio.lowlevel.TrioToken

    @property
    def ws_url(self) -> str:
        """The WebSocket base URL of the OpenAI API (``.../v1``)."""
        return self.url.replace("http://", "ws://") + "/v1"

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` on the server's loop, from a test's thread."""
        return trio.from_thread.run(fn, *args, trio_token=self.token)


@contextlib.contextmanager
def server_in_thread(config: ot.PipelineConfig, kind: type[S], name: str, *, limits: SocketLimits | None = None,
                     start_timeout_s: float = 180) -> Iterator[S]:
    """Serve ``config``'s pipeline on a free port until the block ends; yields a ``kind`` for it."""
    started = threading.Event()
    stop: list[trio.Event] = []
    server: list[S] = []
    failure: list[BaseException] = []

    async def main() -> None:
        with trio.fail_after(600):  # the whole module's tests
            async with ot.open_pipeline(config) as pipeline, trio.open_nursery() as nursery:
                address = await nursery.start(
                    functools.partial(ot.serve_http, pipeline, config, "127.0.0.1", 0, limits=limits))
                stop.append(trio.Event())
                server.append(kind(address.url, pipeline, trio.lowlevel.current_trio_token()))
                started.set()
                await stop[0].wait()
                nursery.cancel_scope.cancel()

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failure.append(exc)
        finally:
            started.set()

    thread = threading.Thread(target=run, name=name)
    thread.start()
    started.wait(start_timeout_s)
    try:
        if failure or not server:
            raise RuntimeError(f"the {name} did not start: {failure!r}")
        yield server[0]
    finally:
        if stop:
            trio.from_thread.run_sync(stop[0].set, trio_token=server[0].token)
        thread.join(60)
        assert not thread.is_alive(), f"the {name} did not stop"
        if failure:
            raise failure[0]
