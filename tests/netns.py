"""Two network namespaces joined by a veth pair: two "hosts" on one machine (tests and the TCP bench).

:func:`veth_namespaces` creates them, with addresses inside the namespaces only (``10.231.N.1`` and
``.2`` of a /30 on the veth ends; the host's own interfaces and routes are not touched), and removes
them with every process still in them on the way out, whatever happened. Needs root and iproute2's
``ip netns`` (:func:`unavailable` says why not).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator

import attrs

__all__ = ["Namespaces", "kill_all_in", "run_ip", "unavailable", "veth_namespaces"]


@attrs.frozen
class Namespaces:
    """The caller's namespace (``near``) and the worker's (``far``), and their addresses. Each veth end is
    named like its namespace."""

    near: str
    near_ip: str
    far: str
    far_ip: str


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces (ip netns)"
    if shutil.which("ip") is None:
        return "the 'ip' command (iproute2) is not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"'ip netns' is unavailable: {probe.stderr.strip()}"
    return None


def run_ip(*args: str) -> None:
    """``ip ARGS``; raises CalledProcessError when it fails."""
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def kill_all_in(namespace: str) -> None:
    """SIGKILL every process in ``namespace``."""
    listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=10, check=False)
    for pid in listed.stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


@contextlib.contextmanager
def veth_namespaces(tag: str) -> Iterator[Namespaces]:
    """Two namespaces ``ot<tag>n`` / ``ot<tag>f`` (``tag``: a few characters unique on the machine, e.g.
    from the pid) joined by a veth pair; removed, with their processes, on the way out."""
    near, far = f"ot{tag}n", f"ot{tag}f"
    subnet = f"10.231.{sum(tag.encode()) % 250}"
    try:
        run_ip("netns", "add", near)
        run_ip("netns", "add", far)
        run_ip("link", "add", near, "type", "veth", "peer", "name", far)
        for namespace, address in ((near, f"{subnet}.1"), (far, f"{subnet}.2")):
            run_ip("link", "set", namespace, "netns", namespace)
            run_ip("-n", namespace, "addr", "add", f"{address}/30", "dev", namespace)
            run_ip("-n", namespace, "link", "set", namespace, "up")
            run_ip("-n", namespace, "link", "set", "lo", "up")
        yield Namespaces(near, f"{subnet}.1", far, f"{subnet}.2")
    finally:
        for namespace in (near, far):
            kill_all_in(namespace)
            # Deleting a namespace deletes the veth end in it, and so the pair.
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=10, check=False)
