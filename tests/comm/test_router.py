"""The per-object transport choice, and the transport option that has no transport behind it."""

from __future__ import annotations

from omni_trio.comm.dataref import TransportKind
from omni_trio.comm.router import INLINE_LIMIT, choose_transport


def test_small_cpu_and_tensor_free_objects_go_inline_the_rest_through_shared_memory() -> None:
    assert choose_transport([], 0) is TransportKind.inline
    assert choose_transport(["cpu"], INLINE_LIMIT) is TransportKind.inline
    assert choose_transport(["cpu"], INLINE_LIMIT + 1) is TransportKind.shm
    # No GPU-to-GPU transport: accelerator tensors go through host memory, however small.
    assert choose_transport(["cuda"], 4, sender="a", receiver="b", gpu_peers=True) is TransportKind.shm
    assert choose_transport(["cpu", "cuda"], 4) is TransportKind.shm
