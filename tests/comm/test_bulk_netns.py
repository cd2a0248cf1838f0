"""A big tensor between two network namespaces on a bulk connection (omni_trio/comm/bulk.py).

Two real processes, one in each namespace of a veth pair (tests/netns.py; root and ``ip netns``
needed, skipped with the reason otherwise): the listener offers 32 MiB; the other side first tries it
without the run's key (garbage, then another run's secret: both refused, counted, their connections
closed), then fetches the offer intact; the listener kept serving throughout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omni_trio.control.wire.auth import new_secret
from tests.netns import unavailable, veth_namespaces

REPO = Path(__file__).resolve().parents[2]
MIB = 32


def test_a_big_tensor_crosses_and_connections_without_the_key_are_refused() -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    secret = new_secret().hex()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    peer = [sys.executable, "-m", "tests.bulk_peer"]
    with veth_namespaces(f"k{os.getpid() % 10_000}") as hosts:
        server = subprocess.Popen(
            ["ip", "netns", "exec", hosts.far, *peer, "serve", secret, hosts.far_ip, str(MIB)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO,
        )
        try:
            assert server.stdout is not None and server.stdin is not None
            _, port, transfer = server.stdout.readline().split()
            fetched = subprocess.run(
                ["ip", "netns", "exec", hosts.near, *peer, "fetch", secret, hosts.far_ip, port, transfer, str(MIB)],
                capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=True,
            )
            server.stdin.close()
            said = server.stdout.read()
            assert server.wait(timeout=30) == 0
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
    seen = json.loads(next(x for x in fetched.stdout.splitlines() if x.startswith("FETCHED "))[len("FETCHED "):])
    assert seen["intact"] is True
    assert seen["garbage_closed"] is True and seen["other_secret"] == "refused"
    assert seen["idle_before_close"] == 1 and seen["idle_after_close"] == 0
    assert "REFUSED 2" in said
