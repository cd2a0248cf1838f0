"""Stage factories and hooks used by the test suite (imported by dotted path,
also inside worker processes)."""

from __future__ import annotations

import threading
from typing import Any

from omni_trio import (
    Outbox,
    OutgoingMessage,
    QueueFullError,
    SessionScheduler,
    SimpleScheduler,
    StagePayload,
    StreamingSimpleScheduler,
    TimedChunk,
)


def append_tag(payload: StagePayload, tag: str) -> StagePayload:
    """Record ``tag`` in the payload's trail of stages."""
    data = payload.data
    trail = list(data["trail"]) if isinstance(data, dict) and "trail" in data else [data["raw_inputs"]]
    payload.data = {"trail": [*trail, tag]}
    return payload


def create_append(tag: str, inline: bool = False):
    """Appends ``tag`` to the list of stages the payload went through (on the event loop if ``inline``)."""
    return SimpleScheduler(lambda payload: append_tag(payload, tag), inline=inline)


def create_fail_on(word: str, tag: str = "fragile", inline: bool = False):
    """Raises for inputs equal to ``word``; otherwise behaves like ``create_append``."""

    def fn(payload: StagePayload) -> StagePayload:
        if payload.request.inputs == word:
            raise ValueError(f"cannot handle {word!r}")
        return append_tag(payload, tag)

    return SimpleScheduler(fn, inline=inline)


def create_refuse():
    """Refuses every request as a full scheduler does (``QueueFullError``), with a text of its own."""

    def fn(payload: StagePayload) -> StagePayload:
        raise QueueFullError("no room here")

    return SimpleScheduler(fn)


class Releases:
    """A ``threading.Event`` per request id, for computes that block until their request is aborted:
    the compute waits on :meth:`of`, the scheduler's abort callback sets it."""

    def __init__(self) -> None:
        self._events: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def of(self, request_id: str) -> threading.Event:
        """The event of ``request_id`` (made at the first ask, by the compute or by the abort)."""
        with self._lock:
            return self._events.setdefault(request_id, threading.Event())

    def forget(self, request_id: str) -> None:
        """``request_id``'s compute is over: its event is not needed any more."""
        with self._lock:
            self._events.pop(request_id, None)


def blocking_until_aborted(
    tag: str, before: Any = None, max_concurrency: int = 1, on_abort: Any = None
) -> SimpleScheduler:
    """A SimpleScheduler whose compute blocks until its request is aborted (unless the
    ``block`` param is False), after running ``before(payload)`` if given; ``on_abort(request_id)``,
    if given, runs when a request is aborted."""
    releases = Releases()

    def fn(payload: StagePayload) -> StagePayload:
        if before is not None:
            before(payload)
        if payload.request.params.get("block", True):
            releases.of(payload.request_id).wait()
        releases.forget(payload.request_id)
        payload.data = {"trail": [tag]}
        return payload

    def abort_callback(request_id: str) -> None:
        if on_abort is not None:
            on_abort(request_id)
        releases.of(request_id).set()

    return SimpleScheduler(fn, abort_callback=abort_callback, max_concurrency=max_concurrency)


def create_block_until_aborted(tag: str = "slow"):
    """Computes only after the request was aborted (its result is then dropped)."""
    return blocking_until_aborted(tag)


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


class QueueScheduler:
    """The scheduler protocol by hand, as a user would write it: blocks on its inbox,
    woken by the wakeup sentinel; subclasses handle each ``new_request`` in :meth:`serve`."""

    def __init__(self) -> None:
        import queue

        self.inbox: queue.Queue[Any] = queue.Queue()
        self.outbox: Any = queue.Queue()
        self.aborted: set[str] = set()

    def warm_up_serving_thread(self) -> None:
        pass

    def start(self) -> None:
        while True:
            msg = self.inbox.get()
            if msg.type == "wakeup":
                return
            if msg.type == "new_request":
                self.serve(msg)

    def serve(self, msg: Any) -> None:
        """Handle one new request (default: never answer)."""

    def stop(self) -> None:
        from omni_trio import IncomingMessage

        self.inbox.put(IncomingMessage("", "wakeup"))

    def abort(self, request_id: str) -> None:
        self.aborted.add(request_id)


class Producer(QueueScheduler):
    """Emits ``chunks`` tensor chunks of ``numel`` elements, then its payload, putting each chunk as soon
    as it is made. With ``max_queued_streams`` its outbox is an ``Outbox(max_queued_streams=...)``, whose
    ``put`` of a chunk waits while that many chunks are still unsent."""

    def __init__(self, chunks: int, numel: int, max_queued_streams: int | None = None) -> None:
        super().__init__()
        self.chunks = chunks
        self.numel = numel
        if max_queued_streams is not None:
            self.outbox = Outbox(max_queued_streams=max_queued_streams)

    def serve(self, msg: Any) -> None:
        import torch

        params = msg.data.request.params
        for i in range(int(params.get("chunks", self.chunks))):
            chunk = torch.full((int(params.get("numel", self.numel)),), float(i))
            self.outbox.put(OutgoingMessage(msg.request_id, "stream", data=chunk))
        self.outbox.put(OutgoingMessage(msg.request_id, "result", data=msg.data))


class StreamThenWait(QueueScheduler):
    """Streams one chunk (the text ``"first"``) per request, then never answers: the request stays
    live until it is aborted."""

    def serve(self, msg: Any) -> None:
        self.outbox.put(OutgoingMessage(msg.request_id, "stream", data="first"))


def create_stream_then_wait() -> StreamThenWait:
    return StreamThenWait()


def create_producer(chunks: int = 3, numel: int = 8, max_queued_streams: int | None = None) -> Producer:
    return Producer(chunks, numel, max_queued_streams)


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
    then blocks until the request is aborted (for tests that kill the stage's process),
    unless the ``block`` param is False."""
    import os

    def report_pid(payload: StagePayload) -> None:
        path = payload.request.params["pid_file"]
        with open(f"{path}.tmp", "w", encoding="ascii") as handle:
            handle.write(str(os.getpid()))
        os.replace(f"{path}.tmp", path)  # the test never sees a half-written file

    return blocking_until_aborted("blocked", report_pid)


class SizedStreamer(QueueScheduler):
    """A terminal stage for tensors going to the caller: streams one float32 chunk per
    entry of the ``chunk_numels`` param (``arange(n)``), then completes with
    ``{"pcm": arange(result_numel), "n": result_numel}``."""

    def serve(self, msg: Any) -> None:
        import torch

        params = msg.data.request.params
        for numel in params.get("chunk_numels", []):
            chunk = torch.arange(int(numel), dtype=torch.float32)
            self.outbox.put(OutgoingMessage(msg.request_id, "stream", data=chunk))
        n = int(params.get("result_numel", 0))
        msg.data.data = {"pcm": torch.arange(n, dtype=torch.float32), "n": n}
        self.outbox.put(OutgoingMessage(msg.request_id, "result", data=msg.data))


def create_sized_streamer() -> SizedStreamer:
    return SizedStreamer()


class BurstStreamer(QueueScheduler):
    """Streams chunk ``i`` = ``full((numels[i],), i)`` for the ``numels`` param, then its payload, all
    put into the outbox at once (one burst), so the stage finds every chunk queued together."""

    def serve(self, msg: Any) -> None:
        import torch

        burst = [
            OutgoingMessage(msg.request_id, "stream", data=torch.full((int(n),), float(i)))
            for i, n in enumerate(msg.data.request.params["numels"])
        ]
        burst.append(OutgoingMessage(msg.request_id, "result", data=msg.data))
        with self.outbox.mutex:
            self.outbox.queue.extend(burst)
            self.outbox.not_empty.notify()


def create_burst_streamer() -> BurstStreamer:
    return BurstStreamer()


def create_loop_burst_streamer() -> SimpleScheduler:
    """Streams ``chunks`` (param) chunks ``full((numel,), i)`` (param ``numel``, default 8) from an inline
    compute, so every put lands on the stage's event loop before its drain, idle until the first put, can
    run; then returns the payload."""
    import torch

    def burst(payload: StagePayload) -> StagePayload:
        numel = int(payload.request.params.get("numel", 8))
        for i in range(int(payload.request.params["chunks"])):
            scheduler.outbox.put(OutgoingMessage(payload.request_id, "stream", data=torch.full((numel,), float(i))))
        return payload

    scheduler = SimpleScheduler(burst, inline=True)
    return scheduler


class Swallow(QueueScheduler):
    """Takes requests and never answers (a stand-in upstream whose output a test forges)."""


def create_swallow() -> Swallow:
    return Swallow()


# ---------------------------------------------------------------------------- reliability suite (tests/reliability)


class LazyProducer(Producer):
    """Like :class:`Producer` with a bounded outbox (at most ``max_queued`` chunks wait in it, so each
    chunk is made only once there is room for it), and stops making chunks for an aborted request.
    Chunk ``i`` is ``torch.full((numel,), float(i))``, so a receiver can check order and content."""

    def __init__(self, chunks: int, numel: int, max_queued: int) -> None:
        super().__init__(chunks, numel, max_queued_streams=max_queued)

    def serve(self, msg: Any) -> None:
        import torch

        params = msg.data.request.params
        numel = int(params.get("numel", self.numel))
        for i in range(int(params.get("chunks", self.chunks))):
            if msg.request_id in self.aborted:
                break
            self.outbox.put(OutgoingMessage(msg.request_id, "stream", data=torch.full((numel,), float(i))))
        self.outbox.put(OutgoingMessage(msg.request_id, "result", data=msg.data))


def create_lazy_producer(chunks: int = 16, numel: int = 1024, max_queued: int = 4) -> LazyProducer:
    return LazyProducer(chunks, numel, max_queued)


class SlowChecksum(StreamingSimpleScheduler):
    """A slow stream consumer that keeps only a running checksum: sleeps per chunk,
    checks that chunk ``i`` has chunk id ``i`` and is filled with ``float(i)`` (as
    :class:`LazyProducer` makes them), and completes with the count, the checksum and the
    first chunk out of place (``None`` if none). With ``keep`` it also holds every chunk's tensor until
    the request ends (a consumer that legitimately keeps what it received)."""

    def __init__(self, sleep_s: float, first_sleep_s: float, keep: bool = False) -> None:
        super().__init__(compute_fn=None)
        self.sleep_s = sleep_s
        self.first_sleep_s = first_sleep_s
        self.keep = keep
        self.kept: dict[str, list[Any]] = {}
        self.state: dict[str, dict[str, Any]] = {}

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        return True

    def on_stream_chunk(self, request_id: str, item: Any) -> list[OutgoingMessage]:
        import time

        state = self.state.setdefault(request_id, {"chunks": 0, "checksum": 0.0, "bytes": 0, "misplaced": None})
        expected = state["chunks"]
        data = item.data
        first, last = float(data[0]), float(data[-1])
        if state["misplaced"] is None and (item.chunk_id != expected or first != expected or last != expected):
            state["misplaced"] = (expected, item.chunk_id, first, last)
        state["chunks"] = expected + 1
        state["checksum"] += float(data.sum())
        state["bytes"] += data.numel() * data.element_size()
        if self.keep:
            self.kept.setdefault(request_id, []).append(data)
        if expected == 0 and self.first_sleep_s:
            time.sleep(self.first_sleep_s)
        elif self.sleep_s:
            time.sleep(self.sleep_s)
        return []

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage]:
        payload = self.stream_payloads[request_id]
        payload.data = self.state.pop(request_id, {"chunks": 0, "checksum": 0.0, "bytes": 0, "misplaced": None})
        kept = self.kept.pop(request_id, [])
        payload.data["kept_sum"] = float(sum(float(t.sum()) for t in kept)) if self.keep else None
        return [OutgoingMessage(request_id, "result", data=payload)]

    def clear_stream_state(self, request_id: str) -> None:
        self.state.pop(request_id, None)
        self.kept.pop(request_id, None)


def create_slow_checksum(sleep_s: float = 0.001, first_sleep_s: float = 0.0, keep: bool = False) -> SlowChecksum:
    """A :class:`SlowChecksum` that sleeps ``first_sleep_s`` on each request's first chunk (a stall)
    and ``sleep_s`` on every other chunk (and keeps every chunk until the request ends with ``keep``)."""
    return SlowChecksum(sleep_s, first_sleep_s, keep)


def create_tensor_of():
    """Returns ``{"t": torch.zeros(numel, dtype=torch.<dtype>)}`` for the request's ``numel`` and
    ``dtype`` params (default 4 float32 elements): a payload of a chosen size and dtype."""
    import torch

    def fn(payload: StagePayload) -> StagePayload:
        params = payload.request.params
        dtype = getattr(torch, str(params.get("dtype", "float32")))
        payload.data = {"t": torch.zeros(int(params.get("numel", 4)), dtype=dtype)}
        return payload

    return SimpleScheduler(fn)


def create_sum_tensor():
    """Returns ``{"sum": float(t.sum()), "numel": t.numel()}`` of the incoming payload's ``t``."""

    def fn(payload: StagePayload) -> StagePayload:
        t = payload.data["t"]
        payload.data = {"sum": float(t.sum()), "numel": int(t.numel())}
        return payload

    return SimpleScheduler(fn)


class TargetedStreamer(Swallow):
    """Streams one chunk to the stage named by the request's ``target`` param (through
    ``OutgoingMessage.target``; no chunk without the param), then returns its payload."""

    def serve(self, msg: Any) -> None:
        target = msg.data.request.params.get("target")
        if target is not None:
            self.outbox.put(OutgoingMessage(msg.request_id, "stream", data=[1, 2, 3], target=target))
        self.outbox.put(OutgoingMessage(msg.request_id, "result", data=msg.data))


def create_targeted_streamer() -> TargetedStreamer:
    return TargetedStreamer()


#: Gates of ``create_gated`` stages, by name: (a request started computing, release every request).
GATES: dict[str, tuple[threading.Event, threading.Event]] = {}
_GATES_LOCK = threading.Lock()


def gate(name: str) -> tuple[threading.Event, threading.Event]:
    """The (started, release) events of the ``create_gated`` stage called ``name`` (same process only)."""
    with _GATES_LOCK:
        return GATES.setdefault(name, (threading.Event(), threading.Event()))


def create_gated(name: str, max_pending: int | None = None):
    """Sets ``gate(name)[0]`` when a request starts computing, then waits for ``gate(name)[1]``;
    appends ``name``. ``max_pending`` bounds the requests waiting in its inbox."""
    started, release = gate(name)

    def fn(payload: StagePayload) -> StagePayload:
        started.set()
        release.wait()
        return append_tag(payload, name)

    return SimpleScheduler(fn, max_pending=max_pending)


def create_scheduler_crash():
    """A scheduler whose serving loop takes one request, then dies (RuntimeError out of ``start``)."""

    class Crashing(SimpleScheduler):
        def start(self) -> None:
            while True:
                message = self.inbox.get()
                if message.type == "wakeup":
                    return  # stopped before any request came
                if message.type == "new_request":
                    raise RuntimeError(f"scheduler loop lost its mind over {message.request_id!r}")

    return Crashing(lambda payload: payload)


class ReplicaVocoder(StreamingSimpleScheduler):
    """A streaming stage for replica tests: records the chunk ids each request brought to *this*
    replica, and completes on stream-done with what it saw, its label and its process id."""

    def __init__(self, label: str) -> None:
        super().__init__(compute_fn=None)
        self.label = label
        self.seen: dict[str, list[int]] = {}

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        return True

    def on_stream_chunk(self, request_id: str, item: Any) -> list[OutgoingMessage]:
        self.seen.setdefault(request_id, []).append(item.chunk_id)
        return []

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage]:
        import os

        payload = self.stream_payloads[request_id]
        payload.data = {"label": self.label, "pid": os.getpid(), "chunks": self.seen.pop(request_id, [])}
        return [OutgoingMessage(request_id, "result", data=payload)]

    def clear_stream_state(self, request_id: str) -> None:
        self.seen.pop(request_id, None)


def create_replica_vocoder(label: str) -> ReplicaVocoder:
    return ReplicaVocoder(label)


def create_replica_holder(replica: int):
    """Writes ``<replica> <pid>`` to ``<params['dir']>/<request id>``, then blocks until the request
    is aborted (unless the ``block`` param is False), up to 8 requests at once; the factory gets
    ``replica`` injected."""
    import os

    def report(payload: StagePayload) -> None:
        path = os.path.join(payload.request.params["dir"], payload.request_id)
        with open(f"{path}.tmp", "w", encoding="ascii") as handle:
            handle.write(f"{replica} {os.getpid()}")
        os.replace(f"{path}.tmp", path)

    return blocking_until_aborted(f"held@r{replica}", report, max_concurrency=8)


class WordSessionHooks:
    """A session's state is the words appended so far. An append emits one chunk per word of its
    input (upper-cased with ``upper``, reading the previous owner's chunks when ``from_upstream``)
    and returns the word count; the input ``"block"`` waits until the append is cancelled."""

    def __init__(self, upper: bool, from_upstream: bool) -> None:
        self.upper = upper
        self.from_upstream = from_upstream
        self.words: dict[str, list[str]] = {}

    def open(self, session_id: str, request: Any) -> None:
        self.words[session_id] = []

    def append(self, chunk: Any, payload: StagePayload, context: Any) -> StagePayload:
        if chunk == "block":
            context.cancelled.wait(60)  # the test's own bound; abort, preempt or stop set it
            payload.data = {"cancelled": context.cancelled.is_set()}
            return payload
        words = [item["data"] for item in context.upstream()] if self.from_upstream else str(chunk).split()
        for word in words:
            self.words[context.session_id].append(word)
            context.emit(TimedChunk(word.upper() if self.upper else word))
        payload.data = {"words": len(self.words[context.session_id])}
        return payload

    def close(self, session_id: str) -> None:
        self.words.pop(session_id, None)


def create_word_session(max_open_sessions: int = 64, upper: bool = False, from_upstream: bool = False):
    return SessionScheduler(WordSessionHooks(upper, from_upstream), max_open_sessions=max_open_sessions)



def create_block_and_report_abort():
    """Like :func:`create_block_and_report_pid`; when the request is aborted it also writes
    ``<pid_file>.aborted`` (proof that the abort reached the stage's process)."""
    import os

    files: dict[str, str] = {}

    def report_pid(payload: StagePayload) -> None:
        path = files[payload.request_id] = payload.request.params["pid_file"]
        with open(f"{path}.tmp", "w", encoding="ascii") as handle:
            handle.write(str(os.getpid()))
        os.replace(f"{path}.tmp", path)

    def report_abort(request_id: str) -> None:
        if request_id in files:
            with open(f"{files[request_id]}.aborted", "w", encoding="ascii") as handle:
                handle.write("aborted")

    return blocking_until_aborted("blocked", report_pid, on_abort=report_abort)


def create_sum_inputs():
    """Returns ``{"sum": float(t.sum()), "numel": t.numel()}`` of the request's inputs ``{"t": tensor}``."""

    def fn(payload: StagePayload) -> StagePayload:
        t = payload.request.inputs["t"]
        payload.data = {"sum": float(t.sum()), "numel": int(t.numel())}
        return payload

    return SimpleScheduler(fn)


def create_async_append(tag: str, max_concurrency: int = 1, threaded: bool = False):
    """An ``async def`` compute that awaits trio (``run_on_trio_loop``: on the stage's loop): appends
    ``tag``; for the word "poison" raises; with a ``sleep`` param awaits ``trio.sleep`` that long
    first; with a ``marker`` param writes ``<marker>.started`` once it runs and ``<marker>.cancelled``
    if it is cancelled (an abort).
    ``threaded``: a ThreadedSimpleScheduler instead of a SimpleScheduler."""
    import trio

    from omni_trio import ThreadedSimpleScheduler

    def mark(path: str | None, suffix: str) -> None:
        if path is not None:
            with open(f"{path}.{suffix}", "w", encoding="ascii") as handle:
                handle.write(str(threading.get_ident()))

    async def compute(payload: StagePayload) -> StagePayload:
        if payload.request.inputs == "poison":
            raise ValueError("async compute refused 'poison'")
        marker = payload.request.params.get("marker")
        mark(marker, "started")
        try:
            await trio.sleep(float(payload.request.params.get("sleep", 0)))
        except trio.Cancelled:
            mark(marker, "cancelled")
            raise
        return append_tag(payload, tag)

    if threaded:
        return ThreadedSimpleScheduler(compute, max_concurrency=max_concurrency, run_on_trio_loop=True)
    return SimpleScheduler(compute, max_concurrency=max_concurrency, run_on_trio_loop=True)
