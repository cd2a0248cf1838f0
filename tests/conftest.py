"""Shared fixtures and the test tiers.

``placement`` is the ``omni_placement`` fixture of our pytest plugin
(:mod:`omni_trio.testing`): every test that takes it runs in each placement,
and ``--omni-placements embedded`` restricts the run.

Tiers: a test is marked ``slow`` by what it does (``bash tests/run.sh --fast`` deselects those):
it runs stages in worker processes (a parameter of it is the ``processes`` or ``mixed`` placement,
or a ``worker`` process), it uses the fixtures of the tests that start processes, network
namespaces or Ray (:data:`SLOW_FIXTURES`), or its module runs the package's programs
(:data:`SLOW_MODULES`). Everything else (unit tests, the embedded placement) is the fast tier, so a
new test lands in the right tier without a marker of its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

#: Parameter values that put stages in worker processes (placements, a stage's ``process``).
SLOW_PARAMETERS = frozenset({"processes", "mixed", "worker"})
#: Fixtures of the tests that start processes (tests/process, tests/reliability: ``ipc_base``).
SLOW_FIXTURES = frozenset({"ipc_base"})
#: Modules whose tests run the package's programs (the benchmarks, ``omni-trio serve``) as processes.
SLOW_MODULES = frozenset({"tests/test_bench.py", "tests/serve/test_command.py"})


@pytest.fixture
def placement(omni_placement: str) -> str:
    """Where the stages of a test pipeline run (see omni_trio.testing.PLACEMENTS)."""
    return omni_placement


def _slow(item: pytest.Item, root: Path) -> bool:
    if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    if item.path.relative_to(root).as_posix() in SLOW_MODULES:
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and any(
        isinstance(value, str) and value in SLOW_PARAMETERS for value in callspec.params.values()
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that start processes ``slow`` (see the module docstring)."""
    for item in items:
        if _slow(item, config.rootpath):
            item.add_marker(pytest.mark.slow)
