"""Every error a caller can see is an ``ot.OmniTrioError`` (or a documented built-in: ``ValueError`` /
``TypeError`` for a bad argument), and a request that cannot even be sent fails as a request: a
``RequestFailed`` traced as ``request_failed``, not an abort "cancelled by its caller"."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import trio

import omni_trio as ot
from omni_trio.comm.dtypes import UnsupportedDtype, UnsupportedTensor
from omni_trio.comm.layout import LayoutError
from omni_trio.comm.segments import SegmentNotFound, ShmError
from omni_trio.comm.shm import TransferTooLarge
from omni_trio.control.sockets.zmq_sockets import EndpointPathTooLong
from tests.placement import stage
from tests.process import helpers


def test_every_exported_error_derives_from_omni_trio_error() -> None:
    exported = [obj for obj in vars(ot).values() if inspect.isclass(obj) and issubclass(obj, BaseException)]
    assert exported, "omni_trio exports its errors"
    outside = [cls.__name__ for cls in exported if not issubclass(cls, ot.OmniTrioError)]
    # Documented: Terminated is a SystemExit (status 143), so ``except Exception`` does not swallow it.
    assert outside == ["Terminated"], outside
    assert issubclass(ot.Terminated, SystemExit)
    # Raised on the caller's side by the data plane or at start-up, through submit or open_pipeline.
    for cls in (TransferTooLarge, ShmError, SegmentNotFound, UnsupportedTensor, UnsupportedDtype, LayoutError,
                EndpointPathTooLong, ot.StatsTimeout, ot.SessionClosed, ot.FanInError):
        assert issubclass(cls, ot.OmniTrioError), cls


async def test_a_submit_too_large_to_send_is_traced_as_a_failure(ipc_base: Path, tmp_path: Path) -> None:
    trace = tmp_path / "run.jsonl"
    config = helpers.config(ipc_base, stage("sink", "create_passthrough", process="p_sink", terminal=True))
    # Lazily allocated: the relay refuses it by its size, before any byte is touched.
    huge = torch.empty(513 << 20, dtype=torch.uint8)
    with trio.fail_after(60):
        async with ot.open_pipeline(config, trace=trace) as pipeline:
            with pytest.raises(ot.RequestFailed) as failed:
                await pipeline.submit("big", {"t": huge})
            with pytest.raises(ot.RequestFailed) as streamed:
                async with pipeline.stream("big-stream", {"t": huge}) as events:
                    async for _ in events:
                        pass
            assert await pipeline.submit("small", "x") == {"raw_inputs": "x"}
            assert (await pipeline.stats()).idle
    for error in (failed.value, streamed.value):
        assert error.stage == "coordinator", error
        assert "TransferTooLarge" in error.error and "sending the request" in error.error, error
    events = ot.read_trace(trace)
    for rid in ("big", "big-stream"):
        kinds = [e["event"] for e in events if e.get("request_id") == rid and e["event"].startswith("request_")]
        assert kinds[0] == "request_submitted" and "request_failed" in kinds, kinds
        reasons = [e.get("reason") for e in events if e.get("request_id") == rid and e["event"] == "request_aborted"]
        assert not any("cancelled by its caller" in str(r) or "closed by its reader" in str(r) for r in reasons)
