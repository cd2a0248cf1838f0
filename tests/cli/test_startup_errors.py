"""Every start-up error of every command is ``error: ...`` on stderr (a config's problems under one such
line) and exit 2, never a traceback.

``serve`` runs as a subprocess with a timeout (had it started serving, it would not return); the other
commands run in-process through ``cli.main``. The pipelines are embedded (no worker process).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

import omni_trio as ot
from tests.cli.test_cli import ROOT, run_cli


def _config(tmp_path: Path, adapter: str = "tests.serve.adapters.TrailAdapter", name: str = "serve.toml") -> Path:
    path = tmp_path / name
    ot.PipelineConfig(
        stages=[ot.StageConfig(name="echo", factory_path="tests.stages.create_append", factory={"tag": "echo"},
                               terminal=True)],
        serve=ot.ServeConfig(model="toy", adapter=adapter),
    ).to_file(path)
    return path


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


def _serve(cwd: Path, *argv: str) -> tuple[int, str, str]:
    """``omni-trio serve ARGV`` in a subprocess expected to fail at start-up: its exit code, stdout, stderr."""
    done = subprocess.run([sys.executable, "-m", "omni_trio", "serve", *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=60, check=False)
    return done.returncode, done.stdout, done.stderr


def _one_error_line(code: int, out: str, err: str) -> str:
    assert (code, out) == (2, ""), (code, out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_serve_on_a_taken_port(tmp_path: Path, taken_port: int) -> None:
    err = _one_error_line(*_serve(ROOT, str(_config(tmp_path)), "--port", str(taken_port)))
    assert err == f"error: cannot listen on 127.0.0.1:{taken_port}: Address already in use\n"


def test_serve_http_raises_a_listen_error_itself(tmp_path: Path, taken_port: int) -> None:
    config = ot.load_config(_config(tmp_path))

    async def main() -> None:
        async with ot.open_pipeline(config) as pipeline, trio.open_nursery() as nursery:
            with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{taken_port}") as raised:
                await nursery.start(ot.serve_http, pipeline, config, "127.0.0.1", taken_port)
            assert type(raised.value).__name__ == "ListenError" and raised.value.errno == 98

    trio.run(main)


def test_serve_trace_that_cannot_be_written(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = str(_config(tmp_path))
    err = _one_error_line(*_serve(ROOT, config, "--port", "0", "--trace", str(tmp_path)))
    assert "is a directory" in err
    blocked = tmp_path / "file"
    blocked.write_text("")
    err = _one_error_line(*_serve(ROOT, config, "--port", "0", "--trace", str(blocked / "run.jsonl")))
    assert err.startswith(f"error: cannot write the trace {blocked / 'run.jsonl'}: ")
    err = _one_error_line(*run_cli(capsys, "run", config, "-i", "x", "--trace", str(blocked / "run.jsonl")))
    assert err.startswith(f"error: cannot write the trace {blocked / 'run.jsonl'}: ")


def test_serve_adapter_that_cannot_be_built(tmp_path: Path) -> None:
    # HolderAdapter needs a folder: adapter_options does not give it.
    config = _config(tmp_path, adapter="tests.serve.adapters.HolderAdapter")
    code, out, err = _serve(ROOT, str(config), "--port", "0")
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"error: invalid pipeline config {config} (1 problem):",
        "serve.adapter_options: tests.serve.adapters.HolderAdapter(**adapter_options) failed: TypeError: "
        "HolderAdapter.__init__() missing 1 required positional argument: 'folder'",
    ]


@pytest.mark.parametrize("command", [["validate"], ["run", "-i", "x"], ["serve", "--port", "0"]])
def test_missing_app_dir(capsys: pytest.CaptureFixture[str], tmp_path: Path, command: list[str]) -> None:
    config = str(_config(tmp_path))
    missing = tmp_path / "missing"
    argv = [config, *command[1:], "--app-dir", str(missing)]
    result = _serve(ROOT, *argv) if command[0] == "serve" else run_cli(capsys, command[0], *argv)
    err = _one_error_line(*result)
    assert err == f"error: --app-dir {missing}: no such directory\n"


def test_reclaim_missing_base(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = _one_error_line(*run_cli(capsys, "reclaim", "--base", str(tmp_path / "missing")))
    assert err == f"error: --base {tmp_path / 'missing'}: no such directory\n"


@pytest.mark.parametrize(("name", "text"), [("bad.yaml", "a: [\n"), ("latin1.toml", "name = '\xe9'\n")])
def test_config_that_does_not_parse(capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str,
                                    text: str) -> None:
    path = tmp_path / name
    path.write_bytes(text.encode("latin-1"))
    for command in (["validate"], ["run", "-i", "x"], ["serve"]):
        argv = [str(path), *command[1:]]
        code, out, err = _serve(ROOT, *argv) if command[0] == "serve" else run_cli(capsys, command[0], *argv)
        assert (code, out) == (2, "")
        header, problem = err.splitlines()
        assert header == f"error: invalid pipeline config {path} (1 problem):"
        assert problem.startswith(f"{path}: cannot parse: ")


def test_serve_creates_the_trace_directory_as_run_does(tmp_path: Path) -> None:
    """``--trace missing_dir/x.jsonl`` once crashed ``serve`` with an ExceptionGroup."""
    config = _config(tmp_path)
    server = subprocess.Popen(
        [sys.executable, "-m", "omni_trio", "serve", str(config), "--port", "0", "--app-dir", str(ROOT),
         "--trace", "missing_dir/x.jsonl"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()  # bounded by the pipeline's start-up timeout
        assert line.startswith("listening on http://127.0.0.1:"), (line, server.stderr and server.stderr.read())
        body = {"model": "toy", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(f"{line.split()[-1]}/v1/chat/completions", json=body, timeout=30).status_code == 200
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=60)
        assert (server.returncode, out) == (0, "")
        assert "Traceback" not in err
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
    assert "request_submitted" in {event["event"] for event in ot.read_trace(tmp_path / "missing_dir" / "x.jsonl")}
