"""Compute functions that are generators: each yield is a stream chunk, the return value the result.

A ``compute_fn`` of :class:`~omni_trio.scheduling.simple.SimpleScheduler` or
:class:`~omni_trio.scheduling.threaded.ThreadedSimpleScheduler` may be a
generator function. What it yields goes out at once as the request's
``stream`` messages (to the stage's ``stream_to`` stages, or to the caller
from a terminal stage), in order and before the result; an
:class:`~omni_trio.scheduling.protocol.OutgoingMessage` of type ``stream``
is sent as it is (to name a ``target`` or a modality in ``metadata``),
anything else becomes a chunk's data. A sync generator's ``return`` value
is the request's result. An async generator cannot return a value (Python
forbids it): its result is what it was given, the payload, which it may
change. An abort closes the generator at its next yield (its ``finally``
runs). A ``batch_compute_fn`` generator yields ``(index, chunk)`` pairs,
``index`` being the payload's place in the batch, and returns the results.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Any

import attrs

from omni_trio.scheduling.protocol import OutgoingMessage

#: ``sink(chunk)``: send one yielded chunk; raises :class:`GenerationStopped` when the request is gone.
ChunkSink = Callable[[Any], None]


class GenerationStopped(Exception):
    """The request a generator computes for was aborted: the generator is closed, nothing more is sent."""


def stream_message(request_id: str, chunk: object) -> OutgoingMessage:
    """The ``stream`` message that a yielded ``chunk`` of ``request_id``'s compute becomes."""
    if isinstance(chunk, OutgoingMessage):
        if chunk.type != "stream":
            raise TypeError(f"a compute generator may yield OutgoingMessage of type 'stream' only, got {chunk.type!r}")
        return chunk if chunk.request_id == request_id else attrs.evolve(chunk, request_id=request_id)
    return OutgoingMessage(request_id, "stream", data=chunk)


def drive(generator: Generator[Any, Any, Any], sink: ChunkSink) -> Any:
    """Run ``generator`` to its end, each yield into ``sink``; return its return value. It is closed
    however this ends (an abort, an error in ``sink``), so its ``finally`` runs."""
    try:
        while True:
            try:
                chunk = next(generator)
            except StopIteration as stop:
                return stop.value
            sink(chunk)
    finally:
        generator.close()


async def drive_async(generator: AsyncGenerator[Any, Any], sink: ChunkSink) -> None:
    """:func:`drive` for an async generator (on whatever loop awaits this: asyncio or trio)."""
    try:
        while True:
            try:
                chunk = await generator.__anext__()
            except StopAsyncIteration:
                return
            sink(chunk)
    finally:
        await generator.aclose()


async def compute_async(fn: Callable[[Any], Any], payload: Any, sink: ChunkSink) -> Any:
    """Await ``fn(payload)`` on the running loop, or drive it into ``sink`` if it is an async generator
    (whose result is then ``payload``)."""
    produced = fn(payload)
    if inspect.isasyncgen(produced):
        await drive_async(produced, sink)
        return payload
    return await produced


def batch_sink(request_ids: list[str], sink_for: Callable[[str], ChunkSink]) -> ChunkSink:
    """The sink of a batch generator: each ``(index, chunk)`` goes to the ``index``-th request's sink;
    an aborted request's chunks are dropped, and the generator stops once every request is gone."""
    sinks = [sink_for(request_id) for request_id in request_ids]
    gone: set[int] = set()

    def send(pair: object) -> None:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], int)):
            raise TypeError(f"a batch_compute_fn generator must yield (index, chunk) pairs, got {pair!r}")
        index, chunk = pair
        if not 0 <= index < len(sinks):
            raise IndexError(f"a batch_compute_fn generator yielded index {index} for a batch of {len(sinks)}")
        if index in gone:
            return
        try:
            sinks[index](chunk)
        except GenerationStopped:
            gone.add(index)
            if len(gone) == len(sinks):
                raise

    return send
