"""Schedulers: the compute side of a stage.

A stage talks to its scheduler only through ``inbox``/``outbox`` queues of
:class:`IncomingMessage`/:class:`OutgoingMessage`.
"""

from omni_trio.scheduling.batching import BatchedRequest, ContinuousBatchingScheduler, StepOutput
from omni_trio.scheduling.busy import BusyTime
from omni_trio.scheduling.errors import QueueFullError
from omni_trio.scheduling.inbox import Inbox
from omni_trio.scheduling.outbox import Outbox
from omni_trio.scheduling.protocol import IncomingMessage, OutgoingMessage, StageScheduler
from omni_trio.scheduling.session import SessionScheduler
from omni_trio.scheduling.session_hooks import SessionContext, SessionHooks, TimedChunk
from omni_trio.scheduling.session_operation import SessionOperation
from omni_trio.scheduling.simple import SimpleScheduler
from omni_trio.scheduling.streaming import StreamingSimpleScheduler
from omni_trio.scheduling.threaded import ThreadedSimpleScheduler

__all__ = [
    "BatchedRequest",
    "BusyTime",
    "ContinuousBatchingScheduler",
    "Inbox",
    "IncomingMessage",
    "Outbox",
    "OutgoingMessage",
    "QueueFullError",
    "SessionContext",
    "SessionHooks",
    "SessionOperation",
    "SessionScheduler",
    "SimpleScheduler",
    "StageScheduler",
    "StepOutput",
    "StreamingSimpleScheduler",
    "ThreadedSimpleScheduler",
    "TimedChunk",
]
