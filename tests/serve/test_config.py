"""The ``serve`` table: validated with the rest of the config, loaded from files like the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

import omni_trio as ot
from omni_trio.config import check_imports

ROOT = Path(__file__).resolve().parents[2]


def _config(**serve: object) -> ot.PipelineConfig:
    fields = {"model": "m", "adapter": "tests.serve.adapters.TrailAdapter", **serve}
    return ot.PipelineConfig(
        stages=[ot.StageConfig(name="a", factory_path="tests.stages.create_append", factory={"tag": "a"},
                               terminal=True)],
        serve=ot.ServeConfig(**fields),  # type: ignore[arg-type]
    )


def test_every_serve_problem_is_listed_with_its_path() -> None:
    with pytest.raises(ot.ConfigError) as caught:
        _config(model="", max_body_bytes=0, grace_period_s=-1, deadline_s=0, retry_after_s=True)
    paths = [problem.path for problem in caught.value.problems]
    assert paths == ["serve.model", "serve.max_body_bytes", "serve.grace_period_s", "serve.deadline_s",
                     "serve.retry_after_s"]


def test_nan_and_inf_from_a_toml_file_are_no_seconds(tmp_path: Path) -> None:
    """TOML has nan and inf literals; no time setting takes them (a nan deadline failed every request)."""
    path = tmp_path / "times.toml"
    path.write_text(
        '[[stages]]\nname = "a"\nfactory_path = "tests.stages.create_append"\nterminal = true\n'
        "restart_backoff_s = nan\n"
        '[serve]\nmodel = "m"\nadapter = "tests.serve.adapters.TrailAdapter"\ngrace_period_s = inf\ndeadline_s = nan\n'
    )
    with pytest.raises(ot.ConfigError) as caught:
        ot.load_config(path)
    assert [problem.path for problem in caught.value.problems] == [
        "stages[0].restart_backoff_s", "serve.grace_period_s", "serve.deadline_s"
    ]


def test_the_adapter_must_import_and_take_its_options() -> None:
    with pytest.raises(ot.ConfigError, match=r"serve.adapter: cannot import 'tests.serve.nowhere.Adapter'"):
        check_imports(_config(adapter="tests.serve.nowhere.Adapter"))
    with pytest.raises(ot.ConfigError, match=r"serve.adapter_options\['voice'\]: the factory does not accept"):
        check_imports(_config(adapter="examples.omni_speech.serve.SpeechAdapter", adapter_options={"voice": "x"}))


def test_the_demo_serve_file_loads(tmp_path: Path) -> None:
    config = ot.load_config(ROOT / "examples" / "omni_speech" / "serve.toml")
    check_imports(config)
    assert config.serve == ot.ServeConfig(model="omni-speech-demo", adapter="examples.omni_speech.serve.SpeechAdapter",
                                          adapter_options={"max_new_tokens": 24}, max_body_bytes=16 << 20)
    config.to_file(tmp_path / "again.json")
    assert ot.load_config(tmp_path / "again.json") == config
