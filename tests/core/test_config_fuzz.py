"""Config dicts (what a TOML, JSON or YAML file holds) fuzzed: each is a ConfigError listing its problems,
or a config whose every field has its declared type (finite numbers included)."""

from __future__ import annotations

import copy
import random
from typing import Any

import omni_trio as ot
from omni_trio.config.load import config_from_dict
from tests.field_types import fields_conform

BASE: dict[str, Any] = {
    "name": "p", "entry_stage": "a", "max_in_flight": 4,
    "stages": [
        {"name": "a", "factory_path": "tests.stages.create_append", "factory": {"tag": "a"}, "process": "p_a",
         "next": ["b"], "comm": {"slot_size_mb": 8, "credits": 2, "pool_mb": 16}},
        {"name": "b", "factory_path": "tests.stages.create_append", "factory": {"tag": "b"}, "terminal": True,
         "replicas": 2, "process": "p_b"},
    ],
    "processes": {"p_a": {"restart": "on-failure", "max_restarts": 2, "restart_backoff_s": 0.1}},
    "endpoints": {"max_message_bytes": 1 << 20},
    "stream_delivery": {"max_total_backlog_bytes": 1 << 20},
    "serve": {"model": "m", "adapter": "tests.serve.adapters.TrailAdapter", "grace_period_s": 1.0,
              "deadline_s": 2.0, "retry_after_s": 1, "max_body_bytes": 1000},
}
WEIRD: list[Any] = [None, True, False, 0, -1, 1.5, float("nan"), float("inf"), "", "x", "a", "b", [], ["a"],
                    ["zz"], [1], {}, {"a": 1}, 2**70]


def _tables(config: dict[str, Any]) -> list[dict[str, Any]]:
    stages = [s for s in config["stages"] if isinstance(s, dict)]
    nested = [t for s in stages for t in s.values() if isinstance(t, dict)]
    top = [t for t in config.values() if isinstance(t, dict)]
    entries = [t for table in top for t in table.values() if isinstance(t, dict)]  # processes["p_a"]
    return [config, *stages, *nested, *top, *entries]


def test_fuzzed_config_dicts_are_refused_or_of_declared_types() -> None:
    rng = random.Random(4)
    built = 0
    for _ in range(2000):
        config = copy.deepcopy(BASE)
        for _ in range(rng.randint(1, 2)):
            table = rng.choice(_tables(config))
            table[rng.choice([key for key in table if key != "stages"] or ["name"])] = copy.deepcopy(rng.choice(WEIRD))
        try:
            pipeline = config_from_dict(config)
        except ot.ConfigError as error:
            assert error.problems, config
            continue
        built += 1
        parts = [pipeline, *pipeline.stages, *(s.comm for s in pipeline.stages), pipeline.serve]
        assert [problem for part in parts if part is not None for problem in fields_conform(part)] == [], config
    assert built > 100  # valid configs came through too, not only broken ones
