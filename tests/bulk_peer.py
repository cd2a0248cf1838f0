"""Both ends of a bulk connection for tests/comm/test_bulk_netns.py, each run in a namespace of its own.

``python -m tests.bulk_peer serve SECRET HOST MIB``: offers a float32 ``arange`` of MIB MiB at HOST,
prints ``OFFER port transfer``, serves until its standard input closes, then prints ``REFUSED n``.
``python -m tests.bulk_peer fetch SECRET HOST PORT TRANSFER MIB``: tries the listener without the run's
key (garbage after the nonce, and another run's secret), then fetches the offer with SECRET and
prints ``FETCHED <json>`` (whether the tensor is intact, what the tries saw).
"""

from __future__ import annotations

import json
import sys
import time

import torch
import trio

from omni_trio.comm.bulk import BulkFetcher, BulkServer
from omni_trio.comm.bulk_seal import NONCE_BYTES
from omni_trio.comm.packing import pack_tensors
from omni_trio.comm.tcp import tensor_frame
from omni_trio.control.wire.auth import new_secret


def _tensor(mib: int) -> torch.Tensor:
    return torch.arange(mib << 18, dtype=torch.float32)


async def serve(secret: bytes, host: str, mib: int) -> None:
    """Offer the tensor until standard input closes; then say how many connections were refused."""
    server = BulkServer(secret, proof_timeout_s=1.0)
    tensor = _tensor(mib)
    _, port = server.bind(host)
    transfer = server.offer([tensor_frame(tensor)])
    print("OFFER", port, transfer.hex(), flush=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve)
        await trio.to_thread.run_sync(sys.stdin.read)
        nursery.cancel_scope.cancel()
    print("REFUSED", server.refused, flush=True)


async def fetch(secret: bytes, address: tuple[str, int], transfer: bytes, mib: int) -> None:
    """Try without the key, then fetch with it; print what happened."""
    expected = _tensor(mib)
    total, entries = pack_tensors({"t": expected})
    seen: dict[str, object] = {}
    with trio.fail_after(60):
        raw = trio.socket.socket()
        with raw:
            await raw.connect(address)
            await raw.send(b"n" * NONCE_BYTES + b"x" * 40)
            seen["garbage_closed"] = len(await raw.recv(NONCE_BYTES)) == NONCE_BYTES and await raw.recv(64) == b""
        try:
            await BulkFetcher(new_secret()).fetch(address, transfer, entries, total)
            seen["other_secret"] = "fetched"
        except OSError:  # closed (or reset) by the listener: the request did not open
            seen["other_secret"] = "refused"
        fetcher = BulkFetcher(secret)
        start = time.perf_counter()
        buffer = await fetcher.fetch(address, transfer, entries, total)
        seen["ms"] = (time.perf_counter() - start) * 1000
        seen["intact"] = torch.equal(buffer.view(torch.float32), expected)
        seen["idle_before_close"] = fetcher.idle
        fetcher.close()
        seen["idle_after_close"] = fetcher.idle
    print("FETCHED", json.dumps(seen), flush=True)


def main() -> None:
    """Run the role named by the first argument."""
    role, secret, host, *rest = sys.argv[1:]
    if role == "serve":
        trio.run(serve, bytes.fromhex(secret), host, int(rest[0]))
    else:
        port, transfer, mib = rest
        trio.run(fetch, bytes.fromhex(secret), (host, int(port)), bytes.fromhex(transfer), int(mib))


if __name__ == "__main__":
    main()
