"""Shared-memory segments are created and removed only by their owner.

A name the runtime would use, planted first (by another run or user), is
neither adopted nor written nor unlinked; a receiver refuses another user's
file and leaves it. Files "of another user" need root to make (given uid
``OTHER_UID``); those checks are skipped otherwise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

import omni_trio as ot
from omni_trio.comm.oneshot import read_segment
from omni_trio.comm.ownership import OWNER_FILE
from omni_trio.comm.segments import SHM_DIR, SegmentNotFound, remove_segments
from tests.process import helpers

OTHER_UID = 54321


async def test_a_planted_segment_name_is_never_removed_by_the_runtime(ipc_base: Path) -> None:
    """The caller's first pooled slot and first one-shot segment have names the runtime would use:
    a file planted there first is not adopted, not written and not unlinked; the transfers still go."""
    config = helpers.config(
        ipc_base,
        ot.StageConfig(name="sum", factory_path="tests.stages.create_sum_inputs", process="p_sum", terminal=True),
    )
    import torch

    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            record = json.loads((helpers.ipc_dir(ipc_base) / OWNER_FILE).read_text())
            relay = f"{record['run_prefix']}-0-0"  # the caller (process 0), its first relay
            planted = [Path(SHM_DIR) / f"{relay}-p0", Path(SHM_DIR) / f"{relay}-1"]
            for path in planted:
                path.write_bytes(b"planted")
            if os.geteuid() == 0:
                os.chown(planted[1], OTHER_UID, OTHER_UID)
            before = [(p.stat().st_ino, p.stat().st_uid) for p in planted]
            # Slot p0 is taken: a one-shot segment instead; its name is taken too: the put fails.
            with pytest.raises(Exception, match="exists already"):
                await pipeline.submit("r0", {"t": torch.ones(1 << 18)})
            result = await pipeline.submit("r1", {"t": torch.ones(1 << 18)})
            assert result == {"sum": float(1 << 18), "numel": 1 << 18}
            assert [(p.stat().st_ino, p.stat().st_uid) for p in planted] == before
            assert [p.read_bytes() for p in planted] == [b"planted", b"planted"]
        # The run's own sweep at exit removes its prefix's files of our uid, never another user's.
        if os.geteuid() == 0:
            assert planted[1].read_bytes() == b"planted"
        for path in planted:
            path.unlink(missing_ok=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's file needs root")
async def test_another_users_file_is_no_segment_of_ours() -> None:
    """A receiver asked (by a frame) to read a file of another uid refuses it and does not unlink it;
    ``remove_segments`` of its prefix leaves it too."""
    shm_prefix = f"omnitrio-test-{os.getpid()}-{os.urandom(4).hex()}"
    path = Path(SHM_DIR) / f"{shm_prefix}-7"
    path.write_bytes(b"x" * 4096)
    os.chown(path, OTHER_UID, OTHER_UID)
    try:
        with trio.fail_after(5), pytest.raises(SegmentNotFound, match="belongs to uid"):
            await read_segment(path.name, 4096, bytes, prefix=shm_prefix)
        assert remove_segments(shm_prefix) == []
        assert path.read_bytes() == b"x" * 4096
    finally:
        path.unlink()
