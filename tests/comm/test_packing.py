"""Finding a payload's tensors and putting them back (tensor_walk), and packing their bytes (packing)."""

from __future__ import annotations

import collections
import pickle
from typing import Any, NamedTuple

import pytest
import torch

from omni_trio.comm.dtypes import SUPPORTED_DTYPES, UnsupportedDtype, UnsupportedTensor
from omni_trio.comm.layout import LayoutError, TensorEntry, TensorRun
from omni_trio.comm.packing import (
    pack_runs,
    pack_tensors,
    runs_of,
    unpack_runs,
    unpack_tensors,
    write_packed,
    write_runs,
)
from omni_trio.comm.tensor_walk import TensorPlaceholder, extract_tensors, restore


class Point(NamedTuple):
    x: Any
    y: Any
    label: str = "p"


def _sample(dtype: torch.dtype, shape: tuple[int, ...] = (3, 5)) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1234)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_complex or dtype.is_floating_point:
        return (
            torch.randn(shape, generator=gen).to(dtype)
            if not dtype.is_complex
            else torch.randn(shape, dtype=dtype, generator=gen)
        )
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=gen, dtype=dtype)


def round_trip(obj: object, *, via: str = "memoryview") -> tuple[object, dict[str, torch.Tensor]]:
    """Send ``obj`` through the full pipeline: extract, pickle header, pack, unpack, restore."""
    header_obj, tensors = extract_tensors(obj)
    header = pickle.dumps(header_obj)
    total, entries = pack_tensors(tensors)
    buf = bytearray(total)
    write_packed(memoryview(buf), tensors, entries)
    source: Any
    if via == "memoryview":
        source = memoryview(buf)
    elif via == "bytes":
        source = bytes(buf)
    else:
        source = torch.frombuffer(buf, dtype=torch.uint8).clone()
    unpacked = unpack_tensors(source, entries)
    return restore(pickle.loads(header), unpacked), unpacked


def assert_same(a: object, b: object) -> None:
    """Deep equality with exact tensor comparison (dtype, shape, values)."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict)
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple))
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def test_supported_dtypes_are_the_spec_list() -> None:
    assert set(SUPPORTED_DTYPES) == {
        "torch.bool",
        "torch.uint8",
        "torch.int8",
        "torch.int16",
        "torch.int32",
        "torch.int64",
        "torch.float16",
        "torch.bfloat16",
        "torch.float32",
        "torch.float64",
        "torch.complex64",
        "torch.complex128",
    }


@pytest.mark.parametrize("dtype_name", sorted(SUPPORTED_DTYPES))
@pytest.mark.parametrize("via", ["memoryview", "bytes", "tensor"])
def test_round_trip_every_dtype(dtype_name: str, via: str) -> None:
    tensor = _sample(SUPPORTED_DTYPES[dtype_name])
    scalar = _sample(SUPPORTED_DTYPES[dtype_name], ())
    obj = {"t": tensor, "scalar": scalar, "n": 1}
    back, _ = round_trip(obj, via=via)
    assert_same(obj, back)


def test_nested_containers_and_namedtuples() -> None:
    t = [torch.arange(i + 1, dtype=torch.float32) for i in range(6)]
    obj = {
        "a": [t[0], (t[1], {"b": t[2], "plain": "x"})],
        "point": Point(t[3], [t[4], 7]),
        "od": collections.OrderedDict(z=t[5], y=1),
        "set": {1, 2},
        "none": None,
    }
    back, tensors = round_trip(obj)
    assert len(tensors) == 6
    assert_same(obj, back)
    assert isinstance(back, dict)
    assert type(back["point"]) is Point and back["point"].label == "p"
    assert type(back["od"]) is collections.OrderedDict


def test_defaultdict_keeps_its_factory() -> None:
    obj: collections.defaultdict[str, Any] = collections.defaultdict(list, {"t": torch.ones(2)})
    header, tensors = extract_tensors(obj)
    assert isinstance(header, collections.defaultdict) and header.default_factory is list
    assert isinstance(header["t"], TensorPlaceholder)
    assert restore(header, tensors)["t"] is tensors["t0"]  # type: ignore[index]


def test_extract_does_not_mutate_and_shares_tensor_free_parts() -> None:
    tensor = torch.ones(3)
    plain = {"k": [1, 2, 3]}
    obj = {"t": tensor, "plain": plain}
    header, tensors = extract_tensors(obj)
    assert obj["t"] is tensor  # input untouched
    assert isinstance(header, dict) and header["plain"] is plain  # no needless copy
    assert tensors == {"t0": tensor}
    same, none = extract_tensors(plain)
    assert same is plain and none == {}


def test_placeholder_is_a_dedicated_picklable_class() -> None:
    header, _ = extract_tensors([torch.zeros(2, 3, dtype=torch.int16)])
    assert isinstance(header, list)
    placeholder = header[0]
    assert placeholder == TensorPlaceholder(index=0)
    assert pickle.loads(pickle.dumps(placeholder)) == placeholder
    assert placeholder.path == "t0"


def test_user_placeholder_lookalike_keys_survive() -> None:
    lookalike = {"_tensor_placeholder": "t0", "shape": [1], "dtype": "torch.float32", "device": "cpu"}
    obj = {"user": lookalike, "real": torch.tensor([5.0])}
    back, _ = round_trip(obj)
    assert_same(obj, back)
    assert isinstance(back, dict) and back["user"] == lookalike


def test_keys_with_dots_and_brackets_never_collide() -> None:
    tensors = [torch.full((2,), float(i)) for i in range(4)]
    obj = {"a.b": tensors[0], "a": {"b": tensors[1]}, "x[0]": tensors[2], "x": [tensors[3]]}
    back, unpacked = round_trip(obj)
    assert len(unpacked) == 4
    assert_same(obj, back)


def test_same_tensor_twice_is_sent_once_and_stays_aliased() -> None:
    tensor = torch.arange(4)
    back, unpacked = round_trip({"a": tensor, "b": [tensor]})
    assert len(unpacked) == 1
    assert isinstance(back, dict) and back["a"] is back["b"][0]


def test_offsets_are_aligned_to_element_size() -> None:
    tensors = {
        "t0": torch.ones(3, dtype=torch.int8),
        "t1": torch.ones(2, dtype=torch.float64),
        "t2": torch.ones(1, dtype=torch.bool),
        "t3": torch.ones(3, dtype=torch.complex128),
        "t4": torch.ones(5, dtype=torch.int16),
        "t5": torch.ones(1, dtype=torch.bfloat16),
    }
    total, entries = pack_tensors(tensors)
    end = 0
    for entry in entries:
        elem = tensors[entry.path].element_size()
        assert entry.offset % elem == 0
        assert entry.offset >= end  # in order, no overlap
        assert entry.size == tensors[entry.path].numel() * elem
        end = entry.offset + entry.size
    assert total == end
    assert [e.offset for e in entries] == [0, 8, 24, 32, 80, 90]


def test_no_tensors_gives_a_one_byte_buffer() -> None:
    total, entries = pack_tensors({})
    assert (total, entries) == (1, [])
    back, unpacked = round_trip({"text": "hello", "n": [1, 2]})
    assert back == {"text": "hello", "n": [1, 2]} and unpacked == {}


def test_zero_element_tensors() -> None:
    obj = {"empty": torch.empty(0, 3), "c": torch.empty(2, 0, dtype=torch.complex64), "x": torch.ones(1)}
    back, _ = round_trip(obj)
    assert_same(obj, back)
    only_empty = {"e": torch.empty(0, dtype=torch.int64)}
    total, _ = pack_tensors(extract_tensors(only_empty)[1])
    assert total == 1
    back, _ = round_trip(only_empty)
    assert_same(only_empty, back)


def test_non_contiguous_and_sliced_tensors() -> None:
    base = torch.arange(10_000, dtype=torch.float32).reshape(100, 100)
    obj = {
        "transposed": base.t(),
        "strided": base[::3, 1::7],
        "expanded": torch.arange(4.0).expand(3, 4),
        "small_view": base[5, 10:14],
        "flipped_bf16": base.to(torch.bfloat16).flip(0)[:2],
    }
    _, tensors = extract_tensors(obj)
    total, entries = pack_tensors(tensors)
    # only the viewed elements travel, not the 40 KB storage behind them
    assert next(e for e in entries if e.path == "t3").size == 16
    assert total <= sum(t.numel() * t.element_size() for t in tensors.values()) + 16
    back, _ = round_trip(obj)
    assert_same({k: v.contiguous() for k, v in obj.items()}, back)


def test_unpacked_tensors_are_views_of_one_buffer() -> None:
    obj = [torch.ones(4), torch.zeros(2, dtype=torch.int64)]
    _, tensors = extract_tensors(obj)
    total, entries = pack_tensors(tensors)
    buf = torch.zeros(total, dtype=torch.uint8)
    write_packed(memoryview(bytearray(total)), tensors, entries)  # independent buffer works too
    out = unpack_tensors(buf, entries)
    storages = {t.untyped_storage().data_ptr() for t in out.values()}
    assert storages == {buf.untyped_storage().data_ptr()}


def test_a_stream_of_small_chunks_is_packed_and_viewed_run_by_run() -> None:
    # Consecutive CPU tensors of one dtype and shape are written and viewed by one torch call each
    # run; whatever breaks a run (another shape or dtype, an empty tensor) starts the next.
    obj = {
        "chunks": [torch.arange(8) + i for i in range(40)],
        "other_shape": [torch.ones(2, 3), torch.zeros(2, 3)],
        "empty": torch.empty(0, dtype=torch.int64),
        "strided": [torch.arange(16)[::2] for _ in range(3)],
        "other_dtype": [torch.arange(8, dtype=torch.int32) for _ in range(2)],
        "scalars": [torch.tensor(float(i)) for i in range(5)],
    }
    for via in ("memoryview", "bytes", "tensor"):
        back, _ = round_trip(obj, via=via)
        assert_same({k: [t.contiguous() for t in v] if isinstance(v, list) else v for k, v in obj.items()}, back)
    _, tensors = extract_tensors(obj)
    total, entries = pack_tensors(tensors)
    buf = torch.zeros(total, dtype=torch.uint8)
    write_packed(memoryview(buf.numpy()), tensors, entries)
    out = unpack_tensors(buf, entries)
    views = [t for t in out.values() if t.numel()]  # an empty tensor has no bytes to view
    assert {t.untyped_storage().data_ptr() for t in views} == {buf.untyped_storage().data_ptr()}
    out["t0"][0] = 99  # a view of the buffer, not of its neighbours
    assert buf[:8].view(torch.int64).item() == 99 and out["t1"][0].item() == 1


def test_tensors_unpacked_from_memory_are_views_of_it() -> None:
    # A run is viewed straight in the caller's memory, whatever its memoryview's format.
    tensors = {"t0": torch.arange(6).reshape(2, 3), "t1": torch.tensor(7), "t2": torch.arange(4)}
    total, runs = pack_runs(tensors)
    buf = bytearray(total)
    write_runs(memoryview(buf), tensors, runs)
    as_words = memoryview(buf).cast("B").cast("Q", (total // 8,))  # 8-byte items, as numpy would expose them
    for source in (memoryview(buf), as_words):
        out = unpack_runs(source, runs)
        assert all(torch.equal(out[path], tensors[path]) for path in tensors)
        assert out["t1"].shape == () and out["t0"].shape == (2, 3)
    out = unpack_runs(memoryview(buf), runs)
    out["t2"][0] = 99
    assert unpack_runs(buf, runs)["t2"][0].item() == 99


def test_unpack_checks_every_entry_of_a_run() -> None:
    def chunk(path: str, offset: int) -> TensorEntry:
        return TensorEntry(path=path, shape=(2,), dtype="torch.int64", device="cpu", offset=offset, size=16)

    with pytest.raises(LayoutError, match="duplicate"):
        unpack_tensors(bytes(48), [chunk("t0", 0), chunk("t1", 16), chunk("t0", 32)])
    with pytest.raises(LayoutError, match="outside"):
        unpack_tensors(bytes(40), [chunk("t0", 0), chunk("t1", 16), chunk("t2", 32)])


def test_pack_runs_puts_a_stream_of_chunks_in_one_run() -> None:
    tensors = {f"t{i}": torch.arange(8) + i for i in range(64)}
    tensors["t64"] = torch.ones(3)  # another dtype and shape: a run of its own
    tensors["t65"] = torch.empty(0)  # an empty tensor never joins a run
    tensors["t66"] = torch.empty(0)
    total, runs = pack_runs(tensors)
    assert [(len(run.paths), run.shape, run.dtype) for run in runs] == [
        (64, (8,), "torch.int64"), (1, (3,), "torch.float32"), (1, (0,), "torch.float32"), (1, (0,), "torch.float32")
    ]
    assert runs[0].paths == tuple(f"t{i}" for i in range(64)) and runs[0].end == 64 * 64
    # Entries and runs are two spellings of one layout.
    assert pack_tensors(tensors) == (total, [entry for run in runs for entry in run.entries()])
    assert runs_of(pack_tensors(tensors)[1]) == runs
    buf = bytearray(total)
    write_runs(memoryview(buf), tensors, runs)
    back = unpack_runs(buf, runs)
    assert back.keys() == tensors.keys() and all(torch.equal(back[k], tensors[k]) for k in tensors)
    assert pickle.loads(pickle.dumps(runs)) == runs


def test_a_run_that_requires_grad_is_written_as_data() -> None:
    chunks = {f"t{i}": torch.full((4,), float(i), requires_grad=True) for i in range(3)}
    total, runs = pack_runs(chunks)
    buf = bytearray(total)
    write_runs(memoryview(buf), chunks, runs)
    back = unpack_runs(buf, runs)
    assert [t.tolist() for t in back.values()] == [[0.0] * 4, [1.0] * 4, [2.0] * 4]
    assert not any(t.requires_grad for t in back.values())


@pytest.mark.parametrize(
    ("run", "match"),
    [
        (TensorRun(("t0", "t1", "t2"), (2,), "torch.int64", "cpu", 0, 16), "outside"),  # 48 bytes > 40
        (TensorRun(("t0", "t1", "t0"), (2,), "torch.int64", "cpu", 0, 8), "size"),
        (TensorRun(("t0", "t1"), (1,), "torch.int64", "cpu", 0, 8), None),  # fits: the control case
        (TensorRun(("t0", "t0"), (1,), "torch.int64", "cpu", 0, 8), "duplicate"),
        (TensorRun((), (1,), "torch.int64", "cpu", 0, 8), "no tensor"),
        (TensorRun(("t0",), (-1,), "torch.int64", "cpu", 0, -8), "negative"),
        (TensorRun(("t0", "t1"), (1,), "torch.int64", "cpu", 4, 8), "misaligned"),
    ],
)
def test_a_received_run_is_checked_whole(run: TensorRun, match: str | None) -> None:
    # An inline header carries runs as the sender wrote them: a hostile run gets a LayoutError,
    # never a view past the buffer or a tensor that overwrites another's path.
    if match is None:
        assert list(unpack_runs(bytes(40), [run])) == ["t0", "t1"]
        return
    with pytest.raises(LayoutError, match=match):
        unpack_runs(bytes(40), [run])


def test_a_run_in_a_misaligned_byte_tensor_is_a_layout_error() -> None:
    def chunk(path: str, offset: int) -> TensorEntry:
        return TensorEntry(path=path, shape=(2,), dtype="torch.int64", device="cpu", offset=offset, size=16)

    odd = torch.zeros(33, dtype=torch.uint8)[1:]  # storage offset 1: no int64 view of it
    with pytest.raises(LayoutError, match="t0"):
        unpack_tensors(odd, [chunk("t0", 0), chunk("t1", 16)])


def test_requires_grad_and_parameters_are_detached() -> None:
    param = torch.nn.Parameter(torch.ones(2))
    back, _ = round_trip({"p": param})
    assert isinstance(back, dict) and not back["p"].requires_grad
    assert torch.equal(back["p"], torch.ones(2))


def test_unsupported_dtype_is_rejected_at_the_sender_with_its_path() -> None:
    bad = torch.zeros(3, dtype=torch.uint16)
    with pytest.raises(UnsupportedDtype) as info:
        extract_tensors({"outer": [1, {"inner": bad}]})
    message = str(info.value)
    assert "torch.uint16" in message and "'outer'" in message and "'inner'" in message
    assert isinstance(info.value, TypeError)
    with pytest.raises(UnsupportedDtype):
        pack_tensors({"t0": bad})


def test_sparse_tensor_is_rejected() -> None:
    sparse = torch.eye(3).to_sparse()
    with pytest.raises(UnsupportedTensor, match="layout"):
        extract_tensors({"s": sparse})


def test_tensors_inside_other_objects_stay_in_the_header() -> None:
    class Box:
        def __init__(self, t: torch.Tensor) -> None:
            self.t = t

    box = Box(torch.ones(2))
    header, tensors = extract_tensors({"box": box})
    assert tensors == {}
    assert isinstance(header, dict) and header["box"] is box


def test_cycles_raise_value_error() -> None:
    cyclic: list[Any] = [torch.ones(1)]
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match="cyclic"):
        extract_tensors(cyclic)


def test_restore_with_a_missing_tensor_raises_layout_error() -> None:
    header, _ = extract_tensors({"t": torch.ones(1)})
    with pytest.raises(LayoutError, match="t0"):
        restore(header, {})


@pytest.mark.parametrize(
    "entry",
    [
        TensorEntry(path="t0", shape=(4,), dtype="torch.float32", device="cpu", offset=0, size=12),  # size
        TensorEntry(path="t0", shape=(4,), dtype="torch.float32", device="cpu", offset=2, size=16),  # align
        TensorEntry(path="t0", shape=(8,), dtype="torch.float32", device="cpu", offset=0, size=32),  # bounds
        TensorEntry(path="t0", shape=(-1,), dtype="torch.float32", device="cpu", offset=0, size=-4),  # negative
        TensorEntry(path="t0", shape=(1,), dtype="torch.float32", device="nowhere", offset=0, size=4),
    ],
)
def test_unpack_rejects_inconsistent_entries(entry: TensorEntry) -> None:
    with pytest.raises(LayoutError):
        unpack_tensors(bytes(16), [entry])


def test_unpack_rejects_unknown_dtype() -> None:
    entry = TensorEntry(path="t0", shape=(1,), dtype="torch.uint16", device="cpu", offset=0, size=2)
    with pytest.raises(UnsupportedDtype):
        unpack_tensors(bytes(16), [entry])


def test_cuda_source_stays_on_cpu_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("needs a CPU-only receiver")
    entry = TensorEntry(path="t0", shape=(2,), dtype="torch.float32", device="cuda:0", offset=0, size=8)
    out = unpack_tensors(bytes(8), [entry])
    assert out["t0"].device.type == "cpu"


def test_write_packed_needs_a_writable_buffer() -> None:
    tensors = {"t0": torch.ones(2)}
    _, entries = pack_tensors(tensors)
    with pytest.raises(ValueError, match="writable"):
        write_packed(memoryview(bytes(8)), tensors, entries)


def test_a_tensor_that_no_longer_fits_its_layout_is_refused_not_broadcast() -> None:
    # The layout is computed before a shared-memory put waits for its credit; a tensor resized in
    # place meanwhile must fail the write, not be spread over the bytes its layout promised.
    tensors = {"t0": torch.arange(8)}
    total, runs = pack_runs(tensors)
    tensors["t0"].resize_(1)
    with pytest.raises(RuntimeError):
        write_runs(memoryview(bytearray(total)), tensors, runs)
