"""Exceptions that omni-trio raises to its callers, and the words a failure is reported in."""

from __future__ import annotations

import attrs


class OmniTrioError(Exception):
    """Base class of every omni-trio error."""


@attrs.frozen
class ConfigProblem:
    """One problem found in a pipeline configuration.

    ``path`` points into the config (``stages[3].wait_for[1]``); ``severity``
    is ``"error"`` or ``"warning"``.
    """

    path: str
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        prefix = "" if self.severity == "error" else f"{self.severity}: "
        return f"{prefix}{self.path}: {self.message}"


class ConfigError(OmniTrioError, ValueError):
    """A pipeline configuration is invalid; ``problems`` lists every problem found."""

    def __init__(self, problems: list[ConfigProblem]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  {problem}" for problem in self.problems)
        count = len(self.problems)
        super().__init__(f"invalid pipeline config ({count} problem{'s' * (count != 1)}):\n{lines}")


class RequestError(OmniTrioError):
    """Base class of the errors a single request can end with."""

    def __init__(self, request_id: str, message: str) -> None:
        self.request_id = request_id
        super().__init__(message)


class RequestFailed(RequestError, RuntimeError):
    """A stage failed the request; ``stage`` names it and ``error`` is its original message.

    Also a ``RuntimeError``: SGLang-Omni's coordinator raises ``RuntimeError(text)``
    for a failed request, so its callers' ``except RuntimeError`` still catch it.
    """

    def __init__(self, request_id: str, stage: str, error: str) -> None:
        self.stage = stage
        self.error = error
        super().__init__(request_id, f"request {request_id!r} failed at stage {stage!r}: {error}")


class RequestAborted(RequestError):
    """The request was aborted (by ``pipeline.abort`` or by the pipeline closing)."""

    def __init__(self, request_id: str, reason: str = "aborted") -> None:
        self.reason = reason
        super().__init__(request_id, f"request {request_id!r} was {reason}")


class RequestTimeout(RequestError):
    """The request's ``deadline`` expired; it was aborted everywhere."""

    def __init__(self, request_id: str, deadline: float) -> None:
        self.deadline = deadline
        super().__init__(
            request_id, f"request {request_id!r} did not finish within its deadline of {deadline:g} s"
        )


class StageProcessDied(RequestError):
    """A stage process exited unexpectedly.

    Raised by every request the process held (``request_id`` set, ``held_by``
    None: "lost"), by every other live request, aborted at once in the process
    that held it (``held_by`` names that process), and by ``open_pipeline``
    itself when the pipeline shuts down because of it (``request_id`` None).
    """

    def __init__(
        self,
        request_id: str | None,
        process: str,
        pid: int | None,
        returncode: int | None,
        *,
        held_by: str | None = None,
    ) -> None:
        self.process = process
        self.pid = pid
        self.returncode = returncode
        #: None when the request was in the dead process (or on its way to or from it); otherwise the
        #: live process that held it, where it was aborted because it may still need ``process``.
        self.held_by = held_by
        what = f"stage process {process!r} (pid {pid}) {describe_exit(returncode)}"
        if request_id is None:
            message = what
        elif held_by is None:
            message = f"request {request_id!r} lost: {what}"
        else:
            message = (
                f"request {request_id!r} aborted in process {held_by!r}: it may still need {what}, "
                "and the pipeline does not know whether it had reached it"
            )
        super().__init__(request_id or "", message)


def describe_exit(returncode: int | None) -> str:
    """Say how a process ended, from its return code (negative means a signal)."""
    if returncode is None:
        return "is gone"
    if returncode < 0:
        import signal

        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


def describe_error(error: object) -> str:
    """The text a failure carries: ``Type: message`` for exceptions."""
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {error}"
    return str(error)


class MalformedMessage(ValueError):
    """A control message (or a DataRef inside one) failed to decode or validate.

    ``reason`` says what was wrong; the receiver logs it and drops the message. Raised by
    :func:`omni_trio.control.wire.codec.decode` and :meth:`omni_trio.comm.dataref.DataRef.from_wire`
    (the trust boundary), never by anything a user calls.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class DuplicateRequestId(OmniTrioError, ValueError):
    """A request id is already live in this pipeline; nothing was sent."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        super().__init__(
            f"request {request_id!r} already exists (it is still live); use a fresh request id"
        )


class StageStartupError(OmniTrioError):
    """A stage could not start: its factory or its scheduler's warm-up raised, or
    its process did not come up. The message names the stage (and process)."""


#: Starts a stage's QueueFullError text; a request failing with it raises :class:`RequestQueueFull`.
QUEUE_FULL_TEXT = "The request queue is full."


class QueueFullError(OmniTrioError):
    """A capacity limit was reached: the pipeline's ``max_in_flight`` (raised by
    ``submit``/``stream`` at once, before any stage sees the request), a stage's
    ``max_pending`` inbox, or a session scheduler's open sessions or state bytes."""


class RequestQueueFull(RequestFailed, QueueFullError):
    """A stage refused the request for a capacity limit (a session scheduler's
    ``max_open_sessions`` or state budget): both a :class:`RequestFailed` and a
    :class:`QueueFullError`, as the reference raises ``QueueFullError`` for it."""


class MessageTooLarge(OmniTrioError, ValueError):
    """A control message is over the run's ``endpoints.max_message_bytes`` (between processes of
    one host: the whole message; over TCP: one of its parts); it was not sent.

    Receivers refuse such messages (ZMQ_MAXMSGSIZE on TCP), so the sender fails the request instead.
    """

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"a control message (or part) of {size} bytes is over the limit of {limit} bytes "
            "(PipelineConfig.endpoints.max_message_bytes): raise the limit, or carry large data "
            "as torch tensors, which travel through shared memory"
        )


class PipelineClosed(OmniTrioError):
    """The pipeline is closed or has failed; it accepts no more requests."""


class StatsTimeout(OmniTrioError):
    """``stats()`` got no answer from some worker processes in time; ``processes`` names them
    (a process that is alive but does not run its event loop: stopped, or a stage holding the GIL)."""

    def __init__(self, processes: list[str], timeout: float) -> None:
        self.processes = list(processes)
        self.timeout = timeout
        super().__init__(f"stats: process(es) {self.processes} did not answer within {timeout:g} s")


class SessionClosed(OmniTrioError, RuntimeError):
    """A session was used after it closed (also a ``RuntimeError``, as it was before)."""


class Terminated(SystemExit):
    """The pipeline's process got SIGTERM: the pipeline was shut down as on Ctrl-C, then this is raised.

    A :class:`SystemExit` (not an :class:`OmniTrioError`: like ``KeyboardInterrupt``,
    ``except Exception`` does not swallow it) with status 143 (128 + SIGTERM, the
    conventional status of a program that shut down on SIGTERM); a program that
    does not catch it exits with that status, without a traceback.
    """

    def __init__(self) -> None:
        super().__init__(143)

    def __str__(self) -> str:
        return "terminated by SIGTERM (the pipeline was shut down)"
