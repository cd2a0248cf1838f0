"""The ``processes`` table: launchers and hosts, validated with every problem's path (issue #16)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import omni_trio as ot
from omni_trio.config.load import config_from_dict
from omni_trio.config.processes import host_of
from tests.placement import stage


def _stages() -> list[ot.StageConfig]:
    return [
        stage("a", "create_append", process="front", next="m"),
        stage("m", "create_append", next="b"),
        stage("b", "create_append", process="back", terminal=True),
    ]


def problems_of(processes: object) -> list[str]:
    with pytest.raises(ot.ConfigError) as info:
        ot.PipelineConfig(stages=_stages(), processes=processes)  # type: ignore[arg-type]
    return [str(problem) for problem in info.value.problems]


def test_groups_not_listed_keep_todays_placement() -> None:
    config = ot.PipelineConfig(stages=_stages())
    assert config.processes == {}
    assert host_of(config.processes, "back") is None


def test_a_manual_group_on_another_host() -> None:
    processes = {
        "main": ot.ProcessConfig(host="10.231.0.1"),
        "back": ot.ProcessConfig(launcher="manual", host="10.231.0.2"),
    }
    config = ot.PipelineConfig(stages=_stages(), processes=processes)
    assert host_of(config.processes, "back") == "10.231.0.2"
    # A group without a host lives with the caller.
    assert host_of(config.processes, "front") == "10.231.0.1"
    assert host_of(config.processes, "main") == "10.231.0.1"


def test_every_problem_with_its_path() -> None:
    problems = problems_of(
        {
            "bakc": ot.ProcessConfig(),
            "front": ot.ProcessConfig(launcher="docker", host="tcp://x:5"),
            "back": ot.ProcessConfig(launcher="manual", resources={"GPU": 1}),
        }
    )
    assert problems == [
        "processes['bakc']: 'bakc' is not a process of any stage (nor 'main'); did you mean 'back'?",
        "processes['front'].launcher: expected one of ['local', 'ray', 'manual'], got 'docker'",
        "processes['front'].host: expected an IP address or a host name without scheme or port (e.g. "
        "'10.0.0.2'), got 'tcp://x:5'",
        "processes['back'].host: a 'manual' process needs the host it binds on",
        "processes['back'].resources: resources is only used by the 'ray' launcher",
        "processes['main'].host: 'front' is on a host of its own, so the caller needs one too: the address it "
        "binds on and workers on other hosts connect to",
    ]


def test_a_ray_group_is_placed_by_ray_never_on_a_shared_host() -> None:
    processes = {
        "main": ot.ProcessConfig(host="10.0.0.1"),
        "back": ot.ProcessConfig(launcher="ray", resources={"GPU": 1}, ray_address="ray://head:10001"),
    }
    config = ot.PipelineConfig(stages=_stages(), processes=processes)
    assert host_of(config.processes, "back") not in (None, "10.0.0.1")  # its edges are TCP
    assert problems_of({"back": ot.ProcessConfig(launcher="ray", host="10.0.0.2")}) == [
        "processes['back'].host: a 'ray' process binds on the node Ray places it on; remove host",
        "processes['main'].host: 'back' is on a host of its own, so the caller needs one too: the address it "
        "binds on and workers on other hosts connect to",
    ]


def test_main_and_manual_rules() -> None:
    stages = [
        stage("a", "create_append", next="b"),
        stage("b", "create_append", process="back", terminal=True, restart="on-failure", replicas=2),
    ]
    with pytest.raises(ot.ConfigError) as info:
        ot.PipelineConfig(
            stages=stages,
            processes={
                "main": ot.ProcessConfig(launcher="manual", host="h1"),
                "back": ot.ProcessConfig(launcher="manual", host="h2", resources={"x": -1}),
            },
        )
    assert [str(p) for p in info.value.problems] == [
        "processes['main'].launcher: 'main' is the caller's own process: its launcher is 'local'",
        "processes['back'].resources: resources is only used by the 'ray' launcher",
        "processes['back'].resources: expected a table of resource name -> amount > 0, got {'x': -1}",
    ]


def test_manual_and_ray_groups_may_restart() -> None:
    # The restart policy applies to them as to local groups.
    for launcher, placement in (
        ("manual", ot.ProcessConfig(launcher="manual", host="10.0.0.2")),
        ("ray", ot.ProcessConfig(launcher="ray", resources={"node": 1})),
    ):
        config = ot.PipelineConfig(
            stages=[
                stage("a", "create_append", next="b"),
                stage("b", "create_append", process="back", terminal=True, restart="on-failure", max_restarts=2),
            ],
            processes={"main": ot.ProcessConfig(host="10.0.0.1"), "back": placement},
        )
        assert config.stages[1].restart == "on-failure", launcher


def _replicated(placement: ot.ProcessConfig, replicas: int = 2) -> ot.PipelineConfig:
    return ot.PipelineConfig(
        stages=[
            stage("a", "create_append", next="b"),
            stage("b", "create_append", process="back", terminal=True, replicas=replicas),
        ],
        processes={"main": ot.ProcessConfig(host="10.0.0.1"), "back": placement},
    )


def test_manual_and_ray_groups_may_be_replicated(tmp_path: Path) -> None:
    # Each replica of a ray group lands where Ray places it: never assumed to share a host.
    ray = _replicated(ot.ProcessConfig(launcher="ray", resources={"GPU": 1}))
    assert {host_of(ray.processes, "back@r0"), host_of(ray.processes, "back@r1")} & {None, "10.0.0.1"} == set()
    assert host_of(ray.processes, "back@r0") != host_of(ray.processes, "back@r1")
    # The replicas of a manual group on one host, or one host each.
    shared = _replicated(ot.ProcessConfig(launcher="manual", host="10.0.0.2"))
    assert [host_of(shared.processes, f"back@r{k}") for k in (0, 1)] == ["10.0.0.2", "10.0.0.2"]
    spread = _replicated(ot.ProcessConfig(launcher="manual", hosts=["10.0.0.2", "10.0.0.3"]))
    assert [host_of(spread.processes, f"back@r{k}") for k in (0, 1)] == ["10.0.0.2", "10.0.0.3"]
    for suffix in (".toml", ".json"):  # hosts = ["10.0.0.2", "10.0.0.3"] in a [processes.back] table
        path = tmp_path / f"p{suffix}"
        spread.to_file(path)
        assert ot.load_config(path) == spread


def test_hosts_are_one_per_replica_of_a_manual_group() -> None:
    cases = [
        (ot.ProcessConfig(launcher="manual", hosts=["10.0.0.2"]), [
            "processes['back'].hosts: expected one host per replica (2), got 1",
        ]),
        (ot.ProcessConfig(launcher="manual", host="10.0.0.2", hosts=["10.0.0.2", "tcp://x:1"]), [
            "processes['back'].hosts[1]: expected an IP address or a host name without scheme or port (e.g. "
            "'10.0.0.2'), got 'tcp://x:1'",
            "processes['back'].hosts: set host (every replica's) or hosts (one per replica), not both",
        ]),
        (ot.ProcessConfig(launcher="ray", hosts=["10.0.0.2", "10.0.0.3"]), [
            "processes['back'].hosts: hosts (one per replica) is only used by the 'manual' launcher",
        ]),
    ]
    for placement, expected in cases:
        with pytest.raises(ot.ConfigError) as info:
            _replicated(placement)
        assert [str(p) for p in info.value.problems] == expected, placement


def test_processes_in_a_config_file(tmp_path: Path) -> None:
    data = {
        "stages": [
            {"name": "a", "factory_path": "tests.stages.create_append", "process": "front", "next": "m"},
            {"name": "m", "factory_path": "tests.stages.create_append", "next": "b"},
            {"name": "b", "factory_path": "tests.stages.create_append", "process": "back", "terminal": True},
        ],
        "processes": {
            "main": {"host": "10.231.0.1"},
            "back": {"launcher": "manual", "host": "10.231.0.2"},
        },
    }
    config = config_from_dict(data)
    assert config.processes["back"] == ot.ProcessConfig(launcher="manual", host="10.231.0.2")
    for suffix in (".toml", ".json"):
        path = tmp_path / f"p{suffix}"
        config.to_file(path)
        assert ot.load_config(path) == config
    with pytest.raises(ot.ConfigError) as info:
        config_from_dict({**data, "processes": {"back": {"launcher": "manual", "hots": "x"}}})
    assert any("processes" in p.path and "hots" in p.message for p in info.value.problems)


def test_an_edge_between_workers_across_hosts_is_accepted_and_its_local_end_listens_on_tcp() -> None:
    from omni_trio.config import process_edges
    from omni_trio.config.processes import joins, tcp_listeners

    stages = [
        stage("a", "create_append", next="b"),
        stage("b", "create_append", process="local", next="c"),
        stage("c", "create_append", process="far", next="d"),
        stage("d", "create_append", process="back", next="e"),
        stage("e", "create_append", process="alone", terminal=True),
    ]
    config = ot.PipelineConfig(
        stages=stages,
        processes={"main": ot.ProcessConfig(host="h1"), "far": ot.ProcessConfig(launcher="manual", host="h2")},
    )
    # 'local' sends to the far worker, 'back' receives from it: both listen; 'alone' talks to 'back' only.
    assert tcp_listeners(config.processes, process_edges(config)) == {"local", "back"}
    assert joins(config.processes, "far") and not joins(config.processes, "local")


def test_the_restart_policy_is_set_once_on_the_process() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the new spelling warns about nothing
        config = ot.PipelineConfig(
            stages=[
                stage("a", "create_append", process="front", next="b"),
                stage("b", "create_append", process="back", terminal=True),
            ],
            processes={"back": ot.ProcessConfig(restart="on-failure", max_restarts=2, restart_backoff_s=0.5)},
        )
    back = config.process("back")
    assert (back.restart, back.max_restarts, back.restart_backoff_s) == ("on-failure", 2, 0.5)
    assert config.process("back@r1") == back  # a replica restarts by its group's policy
    assert config.process("front") == ot.ProcessConfig()  # not listed: the defaults, never restarted


def test_a_stage_level_restart_policy_warns_and_moves_to_its_process() -> None:
    with pytest.warns(DeprecationWarning, match=r"processes\['back'\] = ProcessConfig\(restart='on-failure'"):
        config = ot.PipelineConfig(
            stages=[
                stage("a", "create_append", next="b"),
                stage("b", "create_append", process="back", terminal=True, restart="on-failure", max_restarts=2),
            ],
        )
    back = config.process("back")
    assert (back.restart, back.max_restarts, back.restart_backoff_s) == ("on-failure", 2, 0.1)


def test_a_stage_level_restart_policy_that_contradicts_its_process_is_an_error() -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(ot.ConfigError) as error:
        ot.PipelineConfig(
            stages=[
                stage("a", "create_append", next="b"),
                stage("b", "create_append", process="back", terminal=True, max_restarts=5),
            ],
            processes={"back": ot.ProcessConfig(restart="on-failure", max_restarts=2)},
        )
    (problem,) = error.value.problems
    assert problem.path == "stages[1].max_restarts"
    assert "differs from processes['back'].max_restarts=2" in problem.message


def test_process_restart_settings_are_validated() -> None:
    with pytest.raises(ot.ConfigError) as error:
        ot.PipelineConfig(
            stages=[stage("a", "create_append", process="p", terminal=True)],
            processes={
                "main": ot.ProcessConfig(restart="on-failure"),
                "p": ot.ProcessConfig(restart="always", max_restarts=-1, restart_backoff_s=float("nan")),
            },
        )
    assert sorted(problem.path for problem in error.value.problems) == [
        "processes['main'].restart",
        "processes['p'].max_restarts",
        "processes['p'].restart",
        "processes['p'].restart_backoff_s",
    ]


def test_the_restart_policy_in_a_config_file(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.toml"
    path.write_text(
        '[[stages]]\nname = "a"\nfactory_path = "tests.stages.create_append"\nprocess = "p"\nterminal = true\n'
        '[processes.p]\nrestart = "on-failure"\nmax_restarts = 1\n'
    )
    config = ot.load_config(path)
    assert (config.process("p").restart, config.process("p").max_restarts) == ("on-failure", 1)
    config.to_file(tmp_path / "again.toml")
    assert ot.load_config(tmp_path / "again.toml") == config
