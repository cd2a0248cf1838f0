"""/health while a replica is dead: 503 naming it, and the pipeline still answers on the other replica."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import httpx
import trio

import omni_trio as ot
from tests.placement import stage
from tests.process import helpers

CHAT = "/v1/chat/completions"


def _chat(text: str) -> dict[str, object]:
    return {"model": "toy", "messages": [{"role": "user", "content": text}]}


async def test_health_names_a_dead_replica_while_the_other_one_serves() -> None:
    base = Path(tempfile.mkdtemp(prefix="oth-"))  # short: socket paths must stay under ~100 bytes
    try:
        with helpers.nothing_left_behind(base):
            await _dead_replica(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def _dead_replica(base: Path) -> None:
    folder = base / "reports"
    folder.mkdir()
    config = helpers.config(
        base,
        stage("first", "create_append", factory={"tag": "first"}, next="hold"),
        stage("hold", "create_replica_holder", process="p_hold", terminal=True, replicas=2),
        serve=ot.ServeConfig(model="toy", adapter="tests.serve.adapters.HolderAdapter",
                             adapter_options={"folder": str(folder)}),
    )
    with trio.fail_after(90):
        async with ot.open_pipeline(config) as pipeline, trio.open_nursery() as nursery:
            address = await nursery.start(ot.serve_http, pipeline, config, "127.0.0.1", 0)
            async with httpx.AsyncClient(base_url=address.url, timeout=60) as client:
                assert (await client.get("/health")).status_code == 200
                statuses: list[int] = []

                async def held() -> None:
                    statuses.append((await client.post(CHAT, json=_chat("block"))).status_code)

                async with trio.open_nursery() as requests:
                    requests.start_soon(held)
                    with trio.fail_after(20):
                        replica, pid = await _report(folder)
                    os.kill(pid, signal.SIGKILL)  # no restart policy: the replica stays dead
                assert statuses and statuses[0] >= 500  # its request failed with the process
                health = await client.get("/health")
                assert health.status_code == 503, health.text
                assert health.json()["not_ready"] == {f"p_hold@r{replica}": "dead"}
                answer = await client.post(CHAT, json=_chat("go on"))
                assert answer.status_code == 200, answer.text
                assert answer.json()["choices"][0]["message"]["content"] == f"held@r{1 - replica}"
                assert (await client.get("/metrics")).status_code == 200
            nursery.cancel_scope.cancel()


async def _report(folder: Path) -> tuple[int, int]:
    """``(replica, pid)`` from the report a held request's replica wrote (its id is the server's)."""
    while True:  # the replica is another process: the test polls its folder
        reports = [p for p in folder.iterdir() if not p.name.endswith(".tmp")]
        if reports:
            replica, pid = reports[0].read_text().split()
            return int(replica), int(pid)
        await trio.sleep(0.02)
