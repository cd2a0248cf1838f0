"""Stage factories and hooks used by the test suite (imported by dotted path,
also inside worker processes)."""

from __future__ import annotations

import threading
from typing import Any

from omni_trio import OutgoingMessage, SimpleScheduler, StagePayload, StreamingSimpleScheduler


def append_tag(payload: StagePayload, tag: str) -> StagePayload:
    """Record ``tag`` in the payload's trail of stages."""
    data = payload.data
    trail = list(data["trail"]) if isinstance(data, dict) and "trail" in data else [data["raw_inputs"]]
    payload.data = {"trail": [*trail, tag]}
    return payload


def create_append(tag: str):
    """Appends ``tag`` to the list of stages the payload went through."""
    return SimpleScheduler(lambda payload: append_tag(payload, tag))


def create_fail_on(word: str, tag: str = "fragile"):
    """Raises for inputs equal to ``word``; otherwise behaves like ``create_append``."""

    def fn(payload: StagePayload) -> StagePayload:
        if payload.request.inputs == word:
            raise ValueError(f"cannot handle {word!r}")
        return append_tag(payload, tag)

    return SimpleScheduler(fn)


def create_block_until_aborted(tag: str = "slow"):
    """Computes only after the request was aborted (its result is then dropped)."""
    released: dict[str, threading.Event] = {}
    lock = threading.Lock()

    def event_for(request_id: str) -> threading.Event:
        with lock:
            return released.setdefault(request_id, threading.Event())

    def fn(payload: StagePayload) -> StagePayload:
        if payload.request.params.get("block", True):
            event_for(payload.request_id).wait()
        with lock:
            released.pop(payload.request_id, None)
        payload.data = {"trail": [tag]}
        return payload

    def abort_callback(request_id: str) -> None:
        event_for(request_id).set()

    return SimpleScheduler(fn, abort_callback=abort_callback)


def merge_trails(inputs: dict[str, StagePayload]) -> StagePayload:
    first = next(iter(inputs.values()))
    data = {name: inputs[name].data["trail"] for name in sorted(inputs)}
    return StagePayload(first.request_id, first.request, data)


def merge_raises(inputs: dict[str, StagePayload]) -> StagePayload:
    raise RuntimeError("merge exploded")


def route_by_words(request_id: str, output: StagePayload) -> list[str]:
    """One-word inputs go to 'upper' only, longer ones to both branches."""
    words = str(output.request.inputs).split()
    return ["upper"] if len(words) == 1 else ["upper", "count"]


def wait_by_words(request_id: str, from_stage: str, payload: StagePayload) -> list[str]:
    words = str(payload.request.inputs).split()
    return ["upper"] if len(words) == 1 else ["upper", "count"]


def wait_raises(request_id: str, from_stage: str, payload: StagePayload) -> list[str]:
    raise KeyError("wait_for_fn exploded")


def route_outside(request_id: str, output: StagePayload) -> str:
    return "nowhere"


def route_wrong_type(request_id: str, output: StagePayload) -> int:
    return 42


def route_raises(request_id: str, output: StagePayload) -> str:
    raise ZeroDivisionError("route_fn exploded")


def project_raises(payload: StagePayload) -> StagePayload:
    raise TypeError("projector exploded")


def project_same(payload: StagePayload) -> StagePayload:
    return payload


def create_tensor_source(numel: int = 1024):
    """Returns a float32 tensor (and a nested one) as the result."""

    import torch

    def fn(payload: StagePayload) -> StagePayload:
        n = int(payload.request.params.get("numel", numel))
        payload.data = {"pcm": torch.arange(n, dtype=torch.float32), "meta": {"ids": torch.tensor([1, 2, 3])}}
        return payload

    return SimpleScheduler(fn)


class StreamingSum(StreamingSimpleScheduler):
    """Streams each chunk's sum to the caller, completes with the chunk count."""

    def __init__(self) -> None:
        super().__init__(compute_fn=None)
        self.counts: dict[str, int] = {}

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        return True

    def on_stream_chunk(self, request_id: str, item: Any) -> list[OutgoingMessage]:
        self.counts[request_id] = self.counts.get(request_id, 0) + 1
        return [OutgoingMessage(request_id, "stream", data=float(item.data.sum()), metadata={"modality": "sum"})]

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage]:
        payload = self.stream_payloads[request_id]
        payload.data = {"chunks": self.counts.pop(request_id, 0)}
        return [OutgoingMessage(request_id, "result", data=payload)]

    def clear_stream_state(self, request_id: str) -> None:
        self.counts.pop(request_id, None)


def create_streaming_sum() -> StreamingSum:
    return StreamingSum()


class Producer:
    """Emits ``chunks`` tensor chunks of ``numel`` elements, then its payload."""

    def __init__(self, chunks: int, numel: int) -> None:
        import queue

        self.inbox: queue.Queue[Any] = queue.Queue()
        self.outbox: queue.Queue[Any] = queue.Queue()
        self.chunks = chunks
        self.numel = numel
        self.aborted: set[str] = set()

    def warm_up_serving_thread(self) -> None:
        pass

    def start(self) -> None:
        while True:
            msg = self.inbox.get()
            if msg.type == "wakeup":
                return
            if msg.type != "new_request":
                continue
            import torch

            params = msg.data.request.params
            for i in range(int(params.get("chunks", self.chunks))):
                chunk = torch.full((int(params.get("numel", self.numel)),), float(i))
                self.outbox.put(OutgoingMessage(msg.request_id, "stream", data=chunk))
            self.outbox.put(OutgoingMessage(msg.request_id, "result", data=msg.data))

    def stop(self) -> None:
        from omni_trio import IncomingMessage

        self.inbox.put(IncomingMessage("", "wakeup"))

    def abort(self, request_id: str) -> None:
        self.aborted.add(request_id)


def create_producer(chunks: int = 3, numel: int = 8) -> Producer:
    return Producer(chunks, numel)


def create_warm_up_fails():
    class Broken(SimpleScheduler):
        def warm_up_serving_thread(self) -> None:
            raise RuntimeError("no weights here")

    return Broken(lambda payload: payload)


def create_factory_fails():
    raise RuntimeError("factory cannot build this stage")


def create_passthrough():
    """Returns each payload unchanged."""
    return SimpleScheduler(lambda payload: payload)


def create_block_and_report_pid():
    """Writes its process id to the file named by the request's ``pid_file`` param,
    then blocks until the request is aborted (for tests that kill the stage's process)."""
    import os

    released: dict[str, threading.Event] = {}
    lock = threading.Lock()

    def event_for(request_id: str) -> threading.Event:
        with lock:
            return released.setdefault(request_id, threading.Event())

    def fn(payload: StagePayload) -> StagePayload:
        path = payload.request.params["pid_file"]
        with open(f"{path}.tmp", "w", encoding="ascii") as handle:
            handle.write(str(os.getpid()))
        os.replace(f"{path}.tmp", path)  # the test never sees a half-written file
        event_for(payload.request_id).wait()
        with lock:
            released.pop(payload.request_id, None)
        payload.data = {"trail": ["blocked"]}
        return payload

    def abort_callback(request_id: str) -> None:
        event_for(request_id).set()

    return SimpleScheduler(fn, abort_callback=abort_callback)


class SizedStreamer:
    """A terminal stage for tensors going to the caller: streams one float32 chunk per
    entry of the ``chunk_numels`` param (``arange(n)``), then completes with
    ``{"pcm": arange(result_numel), "n": result_numel}``."""

    def __init__(self) -> None:
        import queue

        self.inbox: queue.Queue[Any] = queue.Queue()
        self.outbox: queue.Queue[Any] = queue.Queue()

    def warm_up_serving_thread(self) -> None:
        pass

    def start(self) -> None:
        import torch

        while True:
            msg = self.inbox.get()
            if msg.type == "wakeup":
                return
            if msg.type != "new_request":
                continue
            params = msg.data.request.params
            for numel in params.get("chunk_numels", []):
                chunk = torch.arange(int(numel), dtype=torch.float32)
                self.outbox.put(OutgoingMessage(msg.request_id, "stream", data=chunk))
            n = int(params.get("result_numel", 0))
            msg.data.data = {"pcm": torch.arange(n, dtype=torch.float32), "n": n}
            self.outbox.put(OutgoingMessage(msg.request_id, "result", data=msg.data))

    def stop(self) -> None:
        from omni_trio import IncomingMessage

        self.inbox.put(IncomingMessage("", "wakeup"))

    def abort(self, request_id: str) -> None:
        pass


def create_sized_streamer() -> SizedStreamer:
    return SizedStreamer()


class Swallow:
    """Takes requests and never answers (a stand-in upstream whose output a test forges)."""

    def __init__(self) -> None:
        import queue

        self.inbox: queue.Queue[Any] = queue.Queue()
        self.outbox: queue.Queue[Any] = queue.Queue()

    def warm_up_serving_thread(self) -> None:
        pass

    def start(self) -> None:
        while self.inbox.get().type != "wakeup":
            pass

    def stop(self) -> None:
        from omni_trio import IncomingMessage

        self.inbox.put(IncomingMessage("", "wakeup"))

    def abort(self, request_id: str) -> None:
        pass


def create_swallow() -> Swallow:
    return Swallow()
