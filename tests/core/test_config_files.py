"""Configs round-trip through TOML and JSON files; bad files list every problem with its path."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import omni_trio as ot
from examples import ch4_fanin


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_config_round_trips_through_a_file(tmp_path: Path, suffix: str) -> None:
    config = ch4_fanin.make_config("processes")
    path = tmp_path / f"pipeline{suffix}"
    config.to_file(path)
    assert ot.load_config(path) == config


def test_unknown_keys_and_missing_fields_are_reported_with_paths(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        'entry_stage = "a"\ncolour = "red"\n\n[[stages]]\nname = "a"\nterminal = true\n\n'
        '[[stages]]\nname = "b"\nfactory_path = "x.y"\nterminal = true\nretries = 3\n'
    )
    with pytest.raises(ot.ConfigError) as info:
        ot.load_config(path)
    assert sorted(str(p) for p in info.value.problems) == [
        "(top level): unknown key(s) ['colour']",
        "stages[0].factory_path: required key is missing",
        "stages[1]: unknown key(s) ['retries']",
    ]


def test_graph_problems_of_a_file_keep_their_paths(tmp_path: Path) -> None:
    path = tmp_path / "graph.json"
    path.write_text('{"stages": [{"name": "a", "factory_path": "x.y", "next": "bb"}, '
                    '{"name": "b", "factory_path": "x.y", "terminal": true}]}')
    with pytest.raises(ot.ConfigError) as info:
        ot.load_config(path)
    assert "stages[0].next: 'bb' is not a stage; did you mean 'b'?" in [str(p) for p in info.value.problems]


async def test_a_loaded_config_runs(tmp_path: Path) -> None:
    path = tmp_path / "fanin.toml"
    ch4_fanin.make_config("embedded").to_file(path)
    with trio.fail_after(30):
        async with ot.open_pipeline(ot.load_config(path)) as pipeline:
            result = await pipeline.submit("r0", "hello omni world")
    assert result["upper"] == "HELLO OMNI WORLD" and result["count"] == 3
