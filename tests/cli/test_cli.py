"""The ``omni-trio`` command line, run in-process through ``cli.main``, and the trace views behind it.

``cli.main`` calls ``trio.run`` itself, so these tests are plain (sync)
functions. The pipelines are the chapter's fan-in and streaming examples,
embedded (fast) except for the one trace that needs a worker process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import omni_trio as ot
from examples import ch4_fanin, ch4_stream
from omni_trio import cli
from omni_trio.tracing import views as traceview

ROOT = Path(__file__).resolve().parents[2]
Q = "examples.quickstart_stages"


@pytest.fixture
def fanin(tmp_path: Path) -> Path:
    """The fan-in pipeline (split -> upper, count -> join), embedded, as a TOML file."""
    path = tmp_path / "fanin.toml"
    ch4_fanin.make_config().to_file(path)
    return path


@pytest.fixture
def stream(tmp_path: Path) -> Path:
    """The streaming pipeline (talker --stream--> vocoder), embedded, as a JSON file."""
    path = tmp_path / "stream.json"
    ch4_stream.make_config().to_file(path)
    return path


@pytest.fixture
def tokenize_embed(tmp_path: Path) -> Path:
    """tokenize -> embed: tokenize fails blank input with ``ValueError: empty input``."""
    path = tmp_path / "hello.json"
    ot.PipelineConfig(stages=[
        ot.StageConfig(name="tokenize", factory_path=f"{Q}.create_tokenize", next="embed"),
        ot.StageConfig(name="embed", factory_path=f"{Q}.create_embed", terminal=True),
    ]).to_file(path)
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``cli.main(argv)``: its exit code, stdout and stderr."""
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --------------------------------------------------------------------------- validate


def test_validate_ok(capsys: pytest.CaptureFixture[str], fanin: Path) -> None:
    code, out, err = run_cli(capsys, "validate", str(fanin))
    assert (code, err) == (0, "")
    assert out == "ok: 4 stages, entry split, terminals [join]\n"


def test_validate_lists_every_structural_problem(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        'entry_stage = "a"\ncolour = "red"\n\n[[stages]]\nname = "a"\nterminal = true\n\n'
        '[[stages]]\nname = "b"\nfactory_path = "x.y"\nterminal = true\nretries = 3\n'
    )
    code, out, err = run_cli(capsys, "validate", str(path))
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert lines[0].startswith(f"error: invalid pipeline config {path} (")
    assert "(top level): unknown key(s) ['colour']" in lines
    assert "stages[0].factory_path: required key is missing" in lines
    assert "stages[1]: unknown key(s) ['retries']" in lines


def test_validate_lists_every_import_problem(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "imports.json"
    path.write_text(json.dumps({"stages": [
        {"name": "a", "factory_path": "no_such_module_xyz.create", "next": "b"},
        {"name": "b", "factory_path": f"{Q}.create_embed", "factory": {"dimm": 3}, "terminal": True},
    ]}))
    code, out, err = run_cli(capsys, "validate", str(path))
    assert (code, out) == (2, "")
    problems = err.splitlines()[1:]
    assert len(problems) == 2
    assert problems[0].startswith("stages[0].factory_path: cannot import 'no_such_module_xyz.create'")
    assert problems[1].startswith("stages[1].factory['dimm']: the factory does not accept 'dimm'")


def test_validate_lists_structural_and_import_problems_in_one_run(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    path = tmp_path / "both.toml"
    path.write_text(
        'entry_stage = "splt"\n\n'
        '[[stages]]\nname = "split"\nfactory_path = "tests.stages.create_apend"\nfactory = {tag = "s"}\n'
        'next = "upper"\n\n'
        '[[stages]]\nname = "upper"\nfactory_path = "tests.stages.create_append"\nfactory = {tagg = "u"}\n'
        'terminal = true\nroute_fn = "tests.stages.route_by_words"\n'
    )
    code, out, err = run_cli(capsys, "validate", str(path))
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"error: invalid pipeline config {path} (4 problems):",
        "stages[1].route_fn: a terminal stage routes nowhere; remove route_fn",
        "entry_stage: 'splt' is not a stage; did you mean 'split'?",
        "stages[0].factory_path: cannot import 'tests.stages.create_apend': AttributeError: 'tests.stages' has no "
        "attribute 'create_apend'; did you mean 'create_append'?",
        "stages[1].factory['tagg']: the factory does not accept 'tagg'; did you mean 'tag'?",
    ]


def test_validate_missing_file_and_bad_usage(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run_cli(capsys, "validate", str(tmp_path / "nope.toml"))
    assert (code, out) == (2, "")
    assert "no such config file" in err
    code, _, err = run_cli(capsys, "validate")
    assert code == 2 and "CONFIG" in err
    code, _, err = run_cli(capsys)
    assert code == 2 and "COMMAND" in err


@pytest.mark.parametrize("argv", [[], ["validate"], ["run"], ["trace"], ["trace", "summary"], ["trace", "export"],
                                  ["bench"]])
def test_help_everywhere(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, _ = run_cli(capsys, *argv, "--help")
    assert code == 0
    assert out.startswith("usage: omni-trio")


def test_bench_is_deprecated_and_starts_the_benchmarks(capfd: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    with pytest.warns(DeprecationWarning, match="python -m benchmarks"):
        code = cli.main(["bench", "--only", "W99"])
    captured = capfd.readouterr()
    assert code == 2 and captured.out == ""
    assert "deprecated" in captured.err and "W99" in captured.err


# --------------------------------------------------------------------------- run


def test_run_submit(capsys: pytest.CaptureFixture[str], fanin: Path) -> None:
    code, out, err = run_cli(capsys, "run", str(fanin), "--input", "hello omni world")
    assert (code, err) == (0, "")
    result = {"sources": ["count", "upper"], "count": 3, "count_saw": ["words"], "upper": "HELLO OMNI WORLD",
              "upper_saw": ["text"]}
    assert out == repr(result) + "\n"


def test_run_json_and_input_file(capsys: pytest.CaptureFixture[str], fanin: Path, tmp_path: Path) -> None:
    text = tmp_path / "input.txt"
    text.write_text("stage by stage")
    code, out, err = run_cli(capsys, "run", str(fanin), "--input", f"@{text}", "--json", "--request-id", "x1",
                             "--deadline", "30")
    assert (code, err) == (0, "")
    result = json.loads(out)
    assert result["upper"] == "STAGE BY STAGE"
    assert result["count"] == 3


def test_run_stream(capsys: pytest.CaptureFixture[str], stream: Path) -> None:
    code, out, err = run_cli(capsys, "run", str(stream), "--input", "say something", "--stream")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "#0 vocoder: {'samples': [100, 200]}",
        "#1 vocoder: {'samples': [1100, 1200]}",
        "#2 vocoder: {'samples': [2100, 2200]}",
        "done vocoder: {'total_samples': 6}",
    ]


def test_run_stream_json(capsys: pytest.CaptureFixture[str], stream: Path) -> None:
    code, out, err = run_cli(capsys, "run", str(stream), "-i", "say something", "--stream", "--json")
    assert (code, err) == (0, "")
    events = [json.loads(line) for line in out.splitlines()]
    assert [(e["type"], e.get("chunk_id")) for e in events] == [("chunk", 0), ("chunk", 1), ("chunk", 2),
                                                                 ("done", None)]
    assert events[1]["chunk"] == {"samples": [1100, 1200]}
    assert events[-1]["result"] == {"total_samples": 6}


def test_run_failed_request_exits_1(capsys: pytest.CaptureFixture[str], tokenize_embed: Path) -> None:
    code, out, err = run_cli(capsys, "run", str(tokenize_embed), "--input", "   ")
    assert (code, out) == (1, "")
    assert "failed at stage 'tokenize': ValueError: empty input" in err


def test_run_params_and_deadline(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "slow.json"
    ot.PipelineConfig(stages=[ot.StageConfig(name="slow", factory_path=f"{Q}.create_slow_echo", terminal=True)]
                      ).to_file(path)
    code, out, err = run_cli(capsys, "run", str(path), "-i", "x", "--params", '{"seconds": 0.01}', "--json")
    assert (code, out, err) == (0, '{"echo": "x"}\n', "")
    code, out, err = run_cli(capsys, "run", str(path), "-i", "x", "--params", '{"seconds": 30}', "--deadline", "0.2")
    assert (code, out) == (1, "")
    assert "did not finish within its deadline of 0.2 s" in err
    code, _, err = run_cli(capsys, "run", str(path), "-i", "x", "--params", "[1]")
    assert code == 2 and "expected a JSON object" in err


def test_run_config_error_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"stages": [{"name": "a", "factory_path": "no_such_module_xyz.f", "terminal": True}]}))
    code, out, err = run_cli(capsys, "run", str(path), "--input", "x")
    assert (code, out) == (2, "")
    assert "stages[0].factory_path: cannot import" in err


def test_run_missing_input_file_exits_2(capsys: pytest.CaptureFixture[str], fanin: Path, tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "run", str(fanin), "--input", f"@{tmp_path / 'missing.txt'}")
    assert code == 2 and "cannot read input file" in err


def test_run_interrupted_exits_130(capsys: pytest.CaptureFixture[str], fanin: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    async def interrupted(*_args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.run, "_run_request", interrupted)
    code, _, err = run_cli(capsys, "run", str(fanin), "--input", "x")
    assert code == 130 and "interrupted" in err


def test_json_default_for_tensors() -> None:
    import torch

    small = json.loads(json.dumps({"t": torch.tensor([[1, 2], [3, 4]])}, default=cli.json_default))
    assert small == {"t": [[1, 2], [3, 4]]}
    big = json.loads(json.dumps(torch.zeros(64, 64), default=cli.json_default))
    assert big == {"type": "Tensor", "shape": [64, 64], "dtype": "torch.float32"}


# --------------------------------------------------------------------------- trace summary / export


@pytest.fixture(scope="module")
def fanin_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace of the embedded fan-in pipeline with two completed requests (two runs, one trace file)."""
    tmp = tmp_path_factory.mktemp("fanin_trace")
    config = tmp / "fanin.toml"
    ch4_fanin.make_config().to_file(config)
    trace = tmp / "run" / "run.jsonl"
    for index, text in enumerate(["hello omni world", "stage by stage"]):
        assert cli.main(["run", str(config), "-i", text, "--trace", str(trace), "--request-id", f"r{index}"]) == 0
    return trace


@pytest.fixture(scope="module")
def stream_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace of the streaming pipeline with the vocoder in a worker process, so chunks cross processes."""
    tmp = tmp_path_factory.mktemp("stream_trace")
    config = tmp / "stream.json"
    ch4_stream.make_config("mixed").to_file(config)
    trace = tmp / "run" / "run.jsonl"
    assert cli.main(["run", str(config), "-i", "say something", "--stream", "--trace", str(trace)]) == 0
    return trace


def test_trace_summary_embedded(capsys: pytest.CaptureFixture[str], fanin_trace: Path) -> None:
    capsys.readouterr()
    code, out, err = run_cli(capsys, "trace", "summary", str(fanin_trace))
    assert (code, err) == (0, "")
    assert any(line.split()[:5] == ["split", "payload", "upper", "local_object", "main"] for line in out.splitlines())
    for stage in ("split", "upper", "count", "join"):
        assert any(line.split()[:2] == [stage, "2"] for line in out.splitlines()), stage
    assert "completed 2, failed 0, aborted 0" in out
    assert "(n=2)" in out


def test_trace_summary_across_processes(capsys: pytest.CaptureFixture[str], stream_trace: Path) -> None:
    capsys.readouterr()
    code, out, err = run_cli(capsys, "trace", "summary", str(stream_trace))
    assert (code, err) == (0, "")
    assert "[main, p_vocoder]" in out
    assert any(line.split()[:5] == ["vocoder", "stream", "coordinator", "inline", "p_vocoder"]
               for line in out.splitlines())
    assert "completed 1, failed 0, aborted 0" in out


def test_trace_summary_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run_cli(capsys, "trace", "summary", str(tmp_path / "none.jsonl"))
    assert (code, out) == (2, "")
    assert "no trace file" in err


def export(capsys: pytest.CaptureFixture[str], trace: Path) -> list[dict[str, Any]]:
    """Run ``trace export`` on ``trace``, check the document's shape, and return its events."""
    capsys.readouterr()
    output = trace.parent / "timeline.json"
    code, out, err = run_cli(capsys, "trace", "export", str(trace), "-o", str(output))
    assert (code, err) == (0, "")
    assert str(output) in out
    document = json.loads(output.read_text())
    assert document["displayTimeUnit"] == "ms"
    events: list[dict[str, Any]] = document["traceEvents"]
    for event in events:
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int), event
    slices = [e for e in events if e["ph"] == "X"]
    assert slices
    for item in slices:
        assert item["dur"] >= 0 and item["ts"] >= 0
    processes = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert len({e["pid"] for e in processes}) == len(processes)  # one per process
    assert {e["pid"] for e in events} == {e["pid"] for e in processes}
    named_threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in slices} <= named_threads
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts.keys() == finishes.keys()
    assert len(starts) == sum(1 for e in events if e["ph"] == "s")  # ids are unique
    for flow_id, finish in finishes.items():
        assert finish["bp"] == "e"
        assert finish["ts"] >= starts[flow_id]["ts"]
    return events


def test_trace_export_fanin(capsys: pytest.CaptureFixture[str], fanin_trace: Path) -> None:
    events = export(capsys, fanin_trace)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"main"}
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"split", "upper", "count", "join"} <= threads
    assert len([e for e in events if e["ph"] == "X"]) == 8  # 2 requests x 4 stages
    # Per request: split -> upper, split -> count, upper -> join, count -> join.
    assert sum(1 for e in events if e["ph"] == "s") == 8
    assert sum(1 for e in events if e["ph"] in "be" and e["cat"] == "request") == 4


def test_trace_export_stream(capsys: pytest.CaptureFixture[str], stream_trace: Path) -> None:
    events = export(capsys, stream_trace)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"main", "p_vocoder"}
    instants = [e for e in events if e["ph"] == "i"]
    # A run of chunks travels as one message: its instant covers chunk_id .. chunk_id + chunk_count - 1.
    covered = {e["args"]["chunk_id"] + i for e in instants for i in range(e["args"]["chunk_count"])}
    assert covered == {0, 1, 2}
    assert {e["name"].split()[2] for e in instants} == {"send", "read"}
    assert sum(1 for e in events if e["ph"] == "s") == 1  # talker -> vocoder, across processes
    s, f = (next(e for e in events if e["ph"] == ph) for ph in "sf")
    assert s["pid"] != f["pid"]


# --------------------------------------------------------------------------- traceview on synthetic events


def ev(name: str, ts_ms: float, process: str = "main", **fields: Any) -> dict[str, Any]:
    """A trace event at ``ts_ms`` milliseconds."""
    return {"event": name, "ts_ns": int(ts_ms * 1e6), "process": process, **fields}


def test_percentile() -> None:
    assert traceview.percentile([], 50) is None
    assert traceview.percentile([5.0], 99) == 5.0
    assert traceview.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert traceview.percentile(list(range(101)), 90) == 90


def test_summary_of_synthetic_events() -> None:
    events = [
        ev("request_submitted", 0, request_id="a", stage="s1"),
        ev("stage_dispatch", 1, request_id="a", stage="s1"),
        ev("stage_complete", 3, request_id="a", stage="s1", terminal=False, next=["s2"]),
        ev("comm_transport_selected", 3, stage="s1", direction="payload", peer_stage="s2", transport="inline",
           previous=None),
        ev("request_submitted", 4, request_id="b", stage="s1"),
        ev("stage_dispatch", 4, request_id="b", stage="s1"),
        ev("stage_dispatch", 5, "p2", request_id="a", stage="s2"),
        ev("stage_complete", 9, "p2", request_id="a", stage="s2", terminal=True),
        ev("request_completed", 10, request_id="a", stage="s2"),
        ev("stage_failed", 10, request_id="b", stage="s1", error="boom"),
        ev("request_failed", 11, request_id="b", stage="s1", error="boom"),
        ev("comm_transport_selected", 12, stage="s1", direction="payload", peer_stage="s2", transport="shm",
           previous="inline"),
        ev("request_submitted", 13, request_id="c", stage="s1"),
        ev("request_aborted", 20, request_id="c", stage="coordinator", reason="aborted"),
        ev("request_submitted", 21, request_id="d", stage="s1"),
    ]
    summary = traceview.summarize(events)
    assert summary.processes == ("main", "p2")
    assert summary.span_ms == 21
    (edge,) = summary.transports
    assert (edge.stage, edge.peer, edge.transport, edge.history, edge.changes) == ("s1", "s2", "shm",
                                                                                    ("inline", "shm"), 1)
    assert [(s.stage, s.count, s.total_ms, s.mean_ms) for s in summary.stages] == [("s1", 1, 2.0, 2.0),
                                                                                   ("s2", 1, 4.0, 4.0)]
    requests = summary.requests
    assert (requests.completed, requests.failed, requests.aborted, requests.unfinished) == (1, 1, 1, 1)
    assert requests.latencies_ms == (10.0, 7.0, 7.0)
    assert requests.percentile(50) == 7.0


def test_chrome_trace_of_synthetic_events() -> None:
    events = [
        ev("request_submitted", 0, request_id="a", stage="s1"),
        ev("request_submitted", 0, request_id="b", stage="s1"),
        ev("stage_dispatch", 1, request_id="a", stage="s1"),
        ev("stage_dispatch", 2, request_id="b", stage="s1"),  # overlaps a: a second s1 track
        ev("stage_complete", 3, request_id="a", stage="s1", terminal=False, next=["s2"]),
        ev("stage_failed", 4, request_id="b", stage="s1", error="boom"),
        ev("request_failed", 4, request_id="b", stage="s1", error="boom"),
        ev("stage_dispatch", 5, "p2", request_id="a", stage="s2"),
        ev("stage_complete", 9, "p2", request_id="a", stage="s2", terminal=True),
        ev("request_completed", 10, request_id="a", stage="s2"),
    ]
    document = traceview.chrome_trace(events)
    trace = document["traceEvents"]
    threads = {(e["pid"], e["args"]["name"]) for e in trace if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(1, "s1"), (1, "s1 (2)"), (2, "s2"), (1, "coordinator")} == threads
    slices = {(e["name"], e["args"]["stage"]): e for e in trace if e["ph"] == "X"}
    assert slices[("a", "s1")]["ts"] == 1000 and slices[("a", "s1")]["dur"] == 2000
    assert slices[("b", "s1")]["args"] == {"request_id": "b", "stage": "s1", "status": "failed", "error": "boom"}
    assert slices[("b", "s1")]["tid"] != slices[("a", "s1")]["tid"]
    flows = [e for e in trace if e["ph"] in "sf"]
    assert [(e["ph"], e["pid"], e["tid"]) for e in flows] == [
        ("s", 1, slices[("a", "s1")]["tid"]), ("f", 2, slices[("a", "s2")]["tid"])]
    spans = [(e["ph"], e["name"], e["args"]["status"]) for e in trace if e["ph"] == "e"]
    assert spans == [("e", "b", "failed"), ("e", "a", "completed")]


# --------------------------------------------------------------------------- the installed entry points


def test_console_script_help() -> None:
    script = Path(sys.executable).parent / "omni-trio"
    if not script.exists():
        pytest.skip(f"{script} is not installed (pip install -e .)")
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: omni-trio")
    for command in ("validate", "run", "trace", "bench"):
        assert command in done.stdout


def test_python_dash_m() -> None:
    done = subprocess.run([sys.executable, "-m", "omni_trio", "validate", "--help"], capture_output=True, text=True,
                          timeout=30, cwd=ROOT)
    assert done.returncode == 0
    assert "validate" in done.stdout


def test_run_shows_progress_on_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "fanin.toml"
    ch4_fanin.make_config("embedded").to_file(path)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert cli.main(["run", str(path), "--input", "hello omni world", "--app-dir", str(ROOT)]) == 0
    err = capsys.readouterr().err
    assert "starting 4 stage(s)..." in err and "ready in" in err and "request finished in" in err


def test_worker_refuses_a_bad_join_address_or_key_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from omni_trio.runtime.remote.join import KeyFile

    code, _, err = run_cli(capsys, "worker", "--join", "10.0.0.1:5", "--key", "k")
    assert code == 2 and "--join takes the caller's tcp://HOST:PORT, got '10.0.0.1:5'" in err
    bad = tmp_path / "bad.key"
    bad.write_text("{}")
    code, _, err = run_cli(capsys, "worker", "--join", "tcp://10.0.0.1:5", "--key", str(bad))
    assert code == 2 and "not an omni-trio key file" in err
    key = tmp_path / "p.key"
    KeyFile(join="tcp://10.0.0.1:5", process="p", host="10.0.0.2", curve_public="x", curve_secret="SECRETKEY",
            secret="00").write(key)
    assert key.stat().st_mode & 0o777 == 0o600
    assert "SECRETKEY" not in repr(KeyFile.read(key)) and KeyFile.read(key).curve_secret == "SECRETKEY"
    code, _, err = run_cli(capsys, "worker", "--join", "tcp://10.0.0.1:6", "--key", str(key))
    assert code == 2 and "is not the address in the key file (tcp://10.0.0.1:5)" in err
