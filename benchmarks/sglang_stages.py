"""The benchmark's stages written against SGLang-Omni's API, the equivalents of
:mod:`benchmarks.stages`, and their pipeline configs: what the workloads of
:mod:`benchmarks.sglang_child` run on SGLang-Omni, its stage workers importing the factories from
here. SGLang-Omni's modules (and torch) are imported inside the functions that use them.
"""

from __future__ import annotations

import functools
import queue
import tempfile
from typing import Any

#: This module, as SGLang-Omni's stage configs name their factories.
M = "benchmarks.sglang_stages"
MB = 1 << 20


# --------------------------------------------------------------------------- stage factories (SGLang-Omni workers)


def create_noop() -> Any:
    """A stage that returns each payload unchanged."""
    from sglang_omni.scheduling.simple_scheduler import SimpleScheduler

    return SimpleScheduler(lambda payload: payload)


def create_tensor_source() -> Any:
    """Returns ``{"t": <float32 tensor>}`` of the request's ``numel`` param, made once per size."""
    import torch
    from sglang_omni.scheduling.simple_scheduler import SimpleScheduler

    cache: dict[int, Any] = {}

    def fn(payload: Any) -> Any:
        numel = int(payload.request.params["numel"])
        if numel not in cache:
            cache.clear()
            cache[numel] = torch.ones(numel, dtype=torch.float32)
        payload.data = {"t": cache[numel]}
        return payload

    return SimpleScheduler(fn)


def create_tensor_sink() -> Any:
    """Takes ``{"t": tensor}`` and returns its element count and last element."""
    from sglang_omni.scheduling.simple_scheduler import SimpleScheduler

    def fn(payload: Any) -> Any:
        t = payload.data["t"]
        payload.data = {"numel": int(t.numel()), "last": float(t[-1])}
        return payload

    return SimpleScheduler(fn)


class ChunkTalker:
    """A talker (SGLang-Omni's scheduler protocol): for each request, pushes ``chunks`` int64 tensors of
    8 elements as stream output, then its payload as the result."""

    def __init__(self, chunks: int) -> None:
        from sglang_omni.scheduling.message import IncomingMessage, OutgoingMessage

        self.incoming_type = IncomingMessage
        self.outgoing_type = OutgoingMessage
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.outbox: queue.Queue[Any] = queue.Queue()
        self.chunks = chunks
        self.running = False

    def warm_up_serving_thread(self) -> None:
        """Nothing to warm up."""

    def start(self) -> None:
        """Serve requests until :meth:`stop`."""
        import torch

        self.running = True
        while self.running:
            try:
                msg = self.inbox.get(timeout=0.1)
            except queue.Empty:
                continue
            if msg.type != "new_request":
                continue
            payload = msg.data
            chunks = int(payload.request.params.get("chunks", self.chunks))
            for step in range(chunks):
                codes = torch.arange(step * 8, step * 8 + 8, dtype=torch.int64)
                self.outbox.put(self.outgoing_type(msg.request_id, "stream", data=codes))
            payload.data = {"chunks": chunks}
            self.outbox.put(self.outgoing_type(msg.request_id, "result", data=payload))

    def stop(self) -> None:
        """Let the serving loop return."""
        self.running = False

    def abort(self, request_id: str) -> None:
        """Requests finish on their own; nothing to drop."""


def create_chunk_talker(chunks: int = 1000) -> ChunkTalker:
    """A :class:`ChunkTalker`."""
    return ChunkTalker(chunks)


def create_forwarding_vocoder() -> Any:
    """A ``StreamingSimpleScheduler`` that forwards every chunk it receives to the caller (as a list:
    SGLang-Omni sends stream messages to the caller with msgpack, which refuses tensors)."""
    from sglang_omni.scheduling.message import OutgoingMessage
    from sglang_omni.scheduling.streaming_simple_scheduler import (
        StreamingSimpleScheduler,
    )

    class ForwardingVocoder(StreamingSimpleScheduler):
        def __init__(self) -> None:
            super().__init__(compute_fn=None)
            self.counts: dict[str, int] = {}

        def is_streaming_payload(self, payload: Any) -> bool:
            return True

        def on_stream_chunk(self, request_id: str, item: Any) -> list[Any]:
            self.counts[request_id] = self.counts.get(request_id, 0) + 1
            # The caller-bound stream of SGLang-Omni is msgpack: a tensor cannot pass, its 8 values can.
            return [OutgoingMessage(request_id, "stream", data=item.data.tolist(), metadata={"modality": "codes"})]

        def on_stream_done(self, request_id: str) -> list[Any]:
            payload = self.stream_payloads[request_id]
            payload.data = {"forwarded": self.counts.pop(request_id, 0)}
            return [OutgoingMessage(request_id, "result", data=payload)]

        def clear_stream_state(self, request_id: str) -> None:
            self.counts.pop(request_id, None)

    return ForwardingVocoder()


def create_split() -> Any:
    """Splits the input text into words."""
    from sglang_omni.scheduling.simple_scheduler import SimpleScheduler

    def fn(payload: Any) -> Any:
        text = payload.data["raw_inputs"]
        payload.data = {"text": text, "words": text.split()}
        return payload

    return SimpleScheduler(fn)


def create_upper() -> Any:
    """Upper-cases the text."""
    from sglang_omni.scheduling.simple_scheduler import SimpleScheduler

    def fn(payload: Any) -> Any:
        payload.data = {"upper": payload.data["text"].upper()}
        return payload

    return SimpleScheduler(fn)


def create_count() -> Any:
    """Counts the words."""
    from sglang_omni.scheduling.simple_scheduler import SimpleScheduler

    def fn(payload: Any) -> Any:
        payload.data = {"count": len(payload.data["words"])}
        return payload

    return SimpleScheduler(fn)


def merge(inputs: dict[str, Any]) -> Any:
    """Fan-in: merge the payloads of ``upper`` and ``count`` (in name order)."""
    from sglang_omni.proto import StagePayload

    first = next(iter(inputs.values()))
    data: dict[str, Any] = {"sources": sorted(inputs)}
    for name in sorted(inputs):
        data.update(inputs[name].data)
    return StagePayload(first.request_id, first.request, data)


# --------------------------------------------------------------------------- configs (child side)


@functools.cache
def _base_dir() -> tempfile.TemporaryDirectory[str]:
    """Where the child's pipelines put their sockets: removed, with everything in it, when the child exits."""
    return tempfile.TemporaryDirectory(prefix="omnitrio-bench-sglang-")


def _pipeline(name: str, entry: str, stages: list[dict[str, Any]]) -> Any:
    from sglang_omni.config.schema import (
        EndpointsConfig,
        PipelineConfig,
        StageConfig,
    )

    return PipelineConfig(
        model_path="bench", name=name, entry_stage=entry,
        endpoints=EndpointsConfig(base_path=tempfile.mkdtemp(prefix="run-", dir=_base_dir().name)),
        stages=[StageConfig(**stage) for stage in stages],
    )


def chain_config(stages: int, *, one_process: bool = False) -> Any:
    """A chain of ``stages`` no-op stages, each in its own process (or all in one)."""
    names = [f"s{i}" for i in range(stages)]
    return _pipeline(f"bench-chain{stages}", names[0], [
        {"name": name, "process": "p_all" if one_process else f"p_{name}", "factory_path": f"{M}.create_noop",
         "next": names[i + 1] if i + 1 < stages else None, "terminal": i + 1 == stages}
        for i, name in enumerate(names)
    ])


def tensor_config() -> Any:
    """source -> sink, two processes."""
    return _pipeline("bench-tensor", "source", [
        {"name": "source", "process": "p_source", "factory_path": f"{M}.create_tensor_source", "next": "sink"},
        {"name": "sink", "process": "p_sink", "factory_path": f"{M}.create_tensor_sink", "terminal": True},
    ])


def stream_config(chunks: int) -> Any:
    """talker =stream=> vocoder -> caller, two processes."""
    return _pipeline("bench-stream", "talker", [
        {"name": "talker", "process": "p_talker", "factory_path": f"{M}.create_chunk_talker",
         "factory": {"chunks": chunks}, "next": "vocoder", "stream_to": ["vocoder"]},
        {"name": "vocoder", "process": "p_vocoder", "factory_path": f"{M}.create_forwarding_vocoder",
         "terminal": True, "can_accept_stream_before_payload": True},
    ])


def fanin_config() -> Any:
    """split -> (upper, count) -> join, a process each."""
    return _pipeline("bench-fanin", "split", [
        {"name": "split", "process": "p_split", "factory_path": f"{M}.create_split", "next": ["upper", "count"]},
        {"name": "upper", "process": "p_upper", "factory_path": f"{M}.create_upper", "next": "join"},
        {"name": "count", "process": "p_count", "factory_path": f"{M}.create_count", "next": "join"},
        {"name": "join", "process": "p_join", "factory_path": f"{M}.create_noop",
         "wait_for": ["upper", "count"], "merge_fn": f"{M}.merge", "terminal": True},
    ])
