"""A stream's run of alike chunks crosses as one ChunkRun header (omni_trio/comm/chunk_runs.py), and
anything else as before: the receiver gets the same chunks either way."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch
import trio

from omni_trio.comm.chunk_runs import pack_chunk_run, unpack_chunk_run
from omni_trio.comm.dataref import DataRefKind, TransportKind
from omni_trio.comm.dtypes import SUPPORTED_DTYPES, UnsupportedDtype
from omni_trio.comm.layout import ChunkRun, LayoutError
from omni_trio.comm.router import INLINE_LIMIT
from omni_trio.comm.transfer import decode_object, encode_inline


def chunk(i: int, dtype: torch.dtype = torch.int64, shape: tuple[int, ...] = (8,)) -> torch.Tensor:
    return torch.arange(i * 8, i * 8 + 8).reshape(shape).to(dtype) if shape else torch.tensor(i, dtype=dtype)


def send(obj: Any) -> tuple[Any, bool]:
    """``obj`` through an inline DataRef as a stage sends a stream's chunks; whether it went as a ChunkRun."""
    ref = encode_inline(obj, sender="a", target="b", object_id="r:stream:a:b:0", kind=DataRefKind.stream_chunk)
    assert ref is not None and ref.transport is TransportKind.inline and ref.header is not None
    as_run = isinstance(pickle.loads(ref.header), ChunkRun)
    return trio.run(decode_object, ref), as_run


def same(received: Any, sent: Any) -> bool:
    if isinstance(sent, torch.Tensor):
        return (
            type(received) is torch.Tensor
            and received.dtype == sent.dtype
            and received.shape == sent.shape
            and bool(torch.equal(received, sent))
        )
    if isinstance(sent, (list, tuple)):
        return type(received) is type(sent) and len(received) == len(sent) and all(map(same, received, sent))
    if isinstance(sent, dict):
        keys = received.keys() == sent.keys()
        return type(received) is dict and keys and all(same(received[key], sent[key]) for key in sent)
    return bool(received == sent)


@pytest.mark.parametrize("count", [1, 2, 64])
@pytest.mark.parametrize("paired", [True, False])
def test_a_run_of_alike_chunks_crosses_as_one_header(count: int, paired: bool) -> None:
    metadata = [None if i % 2 else {"modality": "codes", "index": i, "final": False} for i in range(count)]
    chunks: list[Any] = [(chunk(i), metadata[i]) if paired else chunk(i) for i in range(count)]
    received, as_run = send(chunks)
    assert as_run
    assert same(received, chunks)
    # The tensors view one received buffer, writable, as the general path's do.
    tensors = [pair[0] for pair in received] if paired else received
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
    tensors[0][0] = -1


@pytest.mark.parametrize("dtype_name", sorted(SUPPORTED_DTYPES))
def test_every_dtype_and_a_zero_dimensional_shape(dtype_name: str) -> None:
    dtype = SUPPORTED_DTYPES[dtype_name]
    for shape in [(2, 4), ()]:
        chunks = [chunk(i, dtype, shape) for i in range(3)]
        received, as_run = send(chunks)
        assert as_run and same(received, chunks)


def test_a_non_contiguous_chunk_is_copied_as_its_values() -> None:
    base = torch.arange(32).reshape(4, 8)
    chunks = [base[:, 0], base[:, 1]]  # strided columns
    received, as_run = send(chunks)
    assert as_run and same(received, chunks) and all(t.is_contiguous() for t in received)


@pytest.mark.parametrize("dtype_name", sorted(SUPPORTED_DTYPES))
def test_a_lone_chunk_of_every_dtype_and_shape_arrives_as_its_values(dtype_name: str) -> None:
    # A lone contiguous chunk is copied straight out of its storage, anything else with torch.
    dtype = SUPPORTED_DTYPES[dtype_name]
    for shape in [(8,), (2, 4), ()]:
        (received,), as_run = send([chunk(3, dtype, shape)])
        assert as_run and same(received, chunk(3, dtype, shape))


def test_a_lone_chunk_that_views_another_tensor_arrives_as_its_values() -> None:
    base = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    complex_base = torch.complex(base, -base)
    views = {
        "a row at an offset": base[3],
        "a column": base[:, 2],
        "a conjugate": complex_base[1].conj(),
        "a negative view": torch._neg_view(base[4]),
        "a negative conjugate": torch._neg_view(complex_base[2].conj()),
    }
    for name, view in views.items():
        (received,), as_run = send([view])
        assert as_run, name
        assert torch.equal(received, view.resolve_conj().resolve_neg()), name
        assert not received.is_conj() and not received.is_neg(), name


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param([chunk(0), chunk(1, torch.int32)], id="two dtypes"),
        pytest.param([chunk(0), chunk(1, shape=(2, 4))], id="two shapes"),
        pytest.param([torch.nn.Parameter(torch.ones(8)), torch.ones(8)], id="a tensor subclass"),
        pytest.param([torch.ones(8, requires_grad=True)], id="requires grad"),
        pytest.param([torch.zeros(0), torch.zeros(0)], id="no bytes"),
        pytest.param([(chunk(0), {"inner": {"x": 1}})], id="nested metadata"),
        pytest.param([(chunk(0), {"t": torch.ones(2)})], id="a tensor in the metadata"),
        pytest.param([(chunk(0), None), chunk(1)], id="pairs and bare tensors"),
        pytest.param([(chunk(0), None, 1)], id="a triple"),
        pytest.param([chunk(0), "text"], id="not a tensor"),
        pytest.param([torch.zeros(INLINE_LIMIT // 8 + 1, dtype=torch.int64)], id="over the inline limit"),
        pytest.param([torch.ones(4).to_sparse()], id="sparse"),
    ],
)
def test_anything_else_takes_the_general_path_and_arrives_the_same(chunks: list[Any]) -> None:
    assert pack_chunk_run(chunks) is None
    first = chunks[0][0] if isinstance(chunks[0], tuple) else chunks[0]
    if first.layout != torch.strided or first.numel() * first.element_size() > INLINE_LIMIT:
        return  # refused at the sender (sparse), or not inline at all: as before
    received, as_run = send(chunks)
    assert not as_run and same(received, chunks)


def test_the_same_tensor_twice_stays_one_tensor() -> None:
    t = chunk(0)
    assert pack_chunk_run([t, t]) is None
    received, as_run = send([t, t])
    assert not as_run and received[0] is received[1]


def test_an_unsupported_dtype_is_still_refused_at_the_sender() -> None:
    with pytest.raises(UnsupportedDtype):
        encode_inline([torch.ones(4, dtype=torch.uint16)], sender="a", target="b", object_id="o",
                      kind=DataRefKind.stream_chunk)


@pytest.mark.parametrize(
    ("run", "error"),
    [
        (ChunkRun("torch.float128", (8,), None, bytearray(64)), UnsupportedDtype),
        (ChunkRun(7, (8,), None, bytearray(64)), LayoutError),  # type: ignore[arg-type]
        (ChunkRun("torch.int64", (-8,), None, bytearray(64)), LayoutError),
        (ChunkRun("torch.int64", [8], None, bytearray(64)), LayoutError),  # type: ignore[arg-type]
        (ChunkRun("torch.int64", (8,), None, bytearray(63)), LayoutError),
        (ChunkRun("torch.int64", (8,), None, bytearray(0)), LayoutError),
        (ChunkRun("torch.int64", (0,), None, bytearray(0)), LayoutError),
        (ChunkRun("torch.int64", (8,), None, b"\0" * 64), LayoutError),  # type: ignore[arg-type]
        (ChunkRun("torch.int64", (8,), [None], bytearray(128)), LayoutError),
        (ChunkRun("torch.int64", (8,), (None, None), bytearray(128)), LayoutError),  # type: ignore[arg-type]
    ],
)
def test_a_received_run_that_does_not_add_up_is_refused(run: ChunkRun, error: type[Exception]) -> None:
    with pytest.raises(error):
        unpack_chunk_run(run)
