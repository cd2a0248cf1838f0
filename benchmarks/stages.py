"""The stage code and pipeline configs of the benchmark workloads (:mod:`benchmarks.run`).

What a user writes: ``SimpleScheduler(fn)`` with its default arguments, in a module that imports torch at
the top (workers import this module to build the stages). :data:`STAGE_FACTORY` is what every config
passes its no-op and text stages: empty (compute on the scheduler thread) or ``{"inline": True}``.
"""

from __future__ import annotations

import queue
from typing import Any

import torch

from omni_trio.comm.alloc import empty
from omni_trio.config import PipelineConfig, StageConfig
from omni_trio.payload import StagePayload
from omni_trio.scheduling import IncomingMessage, Outbox, OutgoingMessage, SimpleScheduler, StreamingSimpleScheduler

M = "benchmarks.stages"
MB = 1 << 20


# --------------------------------------------------------------------------- stage factories (imported by workers)


def create_noop(inline: bool = False) -> SimpleScheduler:
    """A stage that returns each payload unchanged (on the scheduler thread; on the event loop if ``inline``)."""
    return SimpleScheduler(lambda payload: payload, inline=inline)


def create_tensor_source() -> SimpleScheduler:
    """Returns ``{"t": <float32 tensor>}`` of the request's ``numel`` param; the tensor is made once per
    size and reused, so the measured time is the transfer, not the allocation."""

    cache: dict[int, Any] = {}

    def fn(payload: StagePayload) -> StagePayload:
        numel = int(payload.request.params["numel"])
        if numel not in cache:
            cache.clear()
            cache[numel] = torch.ones(numel, dtype=torch.float32)
        payload.data = {"t": cache[numel]}
        return payload

    return SimpleScheduler(fn)


def create_empty_tensor_source() -> SimpleScheduler:
    """Like :func:`create_tensor_source`, but each request's tensor is a fresh ``ot.empty`` (a slot of the
    stage's shared-memory pool, sent by reference); only its last element is written (the sink reads it):
    neither source computes its data, so both columns measure the transfer."""

    def fn(payload: StagePayload) -> StagePayload:
        t = empty(int(payload.request.params["numel"]), dtype=torch.float32)
        t[-1] = 1.0
        payload.data = {"t": t}
        return payload

    return SimpleScheduler(fn)


def create_tensor_sink() -> SimpleScheduler:
    """Takes ``{"t": tensor}`` and returns a small result: its element count and last element."""

    def fn(payload: StagePayload) -> StagePayload:
        t = payload.data["t"]
        payload.data = {"numel": int(t.numel()), "last": float(t[-1])}
        return payload

    return SimpleScheduler(fn)


class ChunkTalker:
    """A talker: for each request, pushes ``chunks`` (request param) int64 tensors of 8 elements as
    stream output, then its payload as the result. Blocks on its inbox (no polling)."""

    def __init__(self, chunks: int) -> None:
        self.inbox: queue.Queue[IncomingMessage] = queue.Queue()
        self.outbox = Outbox()
        self.chunks = chunks

    def warm_up_serving_thread(self) -> None:
        """Nothing to warm up."""

    def start(self) -> None:
        """Serve requests until the wakeup sentinel."""

        while True:
            msg = self.inbox.get()
            if msg.type == "wakeup":
                return
            if msg.type != "new_request":
                continue
            payload: StagePayload = msg.data
            for step in range(int(payload.request.params.get("chunks", self.chunks))):
                codes = torch.arange(step * 8, step * 8 + 8, dtype=torch.int64)
                self.outbox.put(OutgoingMessage(msg.request_id, "stream", data=codes))
            payload.data = {"chunks": int(payload.request.params.get("chunks", self.chunks))}
            self.outbox.put(OutgoingMessage(msg.request_id, "result", data=payload))

    def stop(self) -> None:
        """Wake the serving loop so that it returns."""
        self.inbox.put(IncomingMessage("", "wakeup"))

    def abort(self, request_id: str) -> None:
        """Requests finish on their own; nothing to drop."""


def create_chunk_talker(chunks: int = 1000) -> ChunkTalker:
    """A :class:`ChunkTalker`."""
    return ChunkTalker(chunks)


class ForwardingVocoder(StreamingSimpleScheduler):
    """A streaming vocoder that forwards every chunk it receives to the caller unchanged."""

    def __init__(self) -> None:
        super().__init__(compute_fn=None)
        self.counts: dict[str, int] = {}

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        """Every request streams."""
        return True

    def on_stream_chunk(self, request_id: str, item: Any) -> list[OutgoingMessage]:
        """Forward the chunk."""
        self.counts[request_id] = self.counts.get(request_id, 0) + 1
        return [OutgoingMessage(request_id, "stream", data=item.data, metadata={"modality": "codes"})]

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage]:
        """Complete with the number of chunks forwarded."""
        payload = self.stream_payloads[request_id]
        payload.data = {"forwarded": self.counts.pop(request_id, 0)}
        return [OutgoingMessage(request_id, "result", data=payload)]

    def clear_stream_state(self, request_id: str) -> None:
        """Forget an aborted request's count."""
        self.counts.pop(request_id, None)


def create_forwarding_vocoder() -> ForwardingVocoder:
    """A :class:`ForwardingVocoder`."""
    return ForwardingVocoder()


def create_split(inline: bool = False) -> SimpleScheduler:
    """Splits the input text into words."""

    def fn(payload: StagePayload) -> StagePayload:
        text = payload.data["raw_inputs"]
        payload.data = {"text": text, "words": text.split()}
        return payload

    return SimpleScheduler(fn, inline=inline)


def create_upper(inline: bool = False) -> SimpleScheduler:
    """Upper-cases the text."""

    def fn(payload: StagePayload) -> StagePayload:
        payload.data = {"upper": payload.data["text"].upper()}
        return payload

    return SimpleScheduler(fn, inline=inline)


def create_count(inline: bool = False) -> SimpleScheduler:
    """Counts the words."""

    def fn(payload: StagePayload) -> StagePayload:
        payload.data = {"count": len(payload.data["words"])}
        return payload

    return SimpleScheduler(fn, inline=inline)


def merge(inputs: dict[str, StagePayload]) -> StagePayload:
    """Fan-in: merge the payloads of ``upper`` and ``count`` (in name order)."""
    first = next(iter(inputs.values()))
    data: dict[str, Any] = {"sources": sorted(inputs)}
    for name in sorted(inputs):
        data.update(inputs[name].data)
    return StagePayload(first.request_id, first.request, data)


# --------------------------------------------------------------------------- configs

#: Factory arguments of the no-op and text stages (W1-W3, W6-W8): none (SimpleScheduler's defaults:
#: compute on the scheduler thread), or ``{"inline": True}`` with ``--inline``.
STAGE_FACTORY: dict[str, Any] = {}


def chain_config(stages: int, *, one_process: bool = False) -> PipelineConfig:
    """A chain of ``stages`` no-op stages, each in its own worker process (or all in one)."""
    names = [f"s{i}" for i in range(stages)]
    return PipelineConfig(
        name=f"bench-chain{stages}",
        entry_stage=names[0],
        stages=[
            StageConfig(
                name=name,
                process="p_all" if one_process else f"p_{name}",
                factory_path=f"{M}.create_noop",
                factory=dict(STAGE_FACTORY),
                next=names[i + 1] if i + 1 < stages else None,
                terminal=i + 1 == stages,
            )
            for i, name in enumerate(names)
        ],
    )


def tensor_config(source: str = "create_tensor_source") -> PipelineConfig:
    """source -> sink, two worker processes (``source``: the source's factory in this module)."""
    return PipelineConfig(
        name="bench-tensor",
        entry_stage="source",
        stages=[
            StageConfig(name="source", process="p_source", factory_path=f"{M}.{source}", next="sink"),
            StageConfig(name="sink", process="p_sink", factory_path=f"{M}.create_tensor_sink", terminal=True),
        ],
    )


def stream_config(chunks: int, module: str = M) -> PipelineConfig:
    """talker =stream=> vocoder -> caller, two worker processes; ``module`` holds the two factories
    (``create_chunk_talker``, ``create_forwarding_vocoder``): this one, or a script's that instruments them."""
    return PipelineConfig(
        name="bench-stream",
        entry_stage="talker",
        stages=[
            StageConfig(name="talker", process="p_talker", factory_path=f"{module}.create_chunk_talker",
                        factory={"chunks": chunks}, next="vocoder", stream_to=["vocoder"]),
            StageConfig(name="vocoder", process="p_vocoder", factory_path=f"{module}.create_forwarding_vocoder",
                        terminal=True, can_accept_stream_before_payload=True),
        ],
    )


def fanin_config() -> PipelineConfig:
    """split -> (upper, count) -> join, a worker process each."""
    return PipelineConfig(
        name="bench-fanin",
        entry_stage="split",
        stages=[
            StageConfig(name="split", process="p_split", factory_path=f"{M}.create_split", factory=dict(STAGE_FACTORY),
                        next=["upper", "count"]),
            StageConfig(name="upper", process="p_upper", factory_path=f"{M}.create_upper", factory=dict(STAGE_FACTORY),
                        next="join"),
            StageConfig(name="count", process="p_count", factory_path=f"{M}.create_count", factory=dict(STAGE_FACTORY),
                        next="join"),
            StageConfig(name="join", process="p_join", factory_path=f"{M}.create_noop", factory=dict(STAGE_FACTORY),
                        wait_for=["upper", "count"], merge_fn=f"{M}.merge", terminal=True),
        ],
    )
