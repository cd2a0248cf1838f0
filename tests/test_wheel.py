"""What the wheel holds: the whole package, and nothing of the repository around it.

Built offline from a copy of the checkout (the build writes ``build/`` and an egg-info beside the
sources; the copy keeps those out of the checkout), with the environment's setuptools.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "omni_trio"
#: The repository's folders that are not part of the installed package.
OUTSIDE_THE_WHEEL = ("benchmarks", "tests", "examples")
BUILD_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    source = tmp_path_factory.mktemp("source") / "omni-trio"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv*", "__pycache__", "*.egg-info", "build", "dist", ".mypy_cache", ".ruff_cache", "out"
        ),
    )
    out = tmp_path_factory.mktemp("wheel")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    subprocess.run([*command, "-w", str(out), str(source)], check=True, timeout=BUILD_TIMEOUT_S, capture_output=True)
    (wheel,) = out.glob("omni_trio-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_every_module_of_the_package_is_in_the_wheel(wheel_names: list[str]) -> None:
    modules = {path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*.py")}
    assert "omni_trio/stage/stage.py" in modules and "omni_trio/control/wire/codec.py" in modules
    assert sorted(modules - set(wheel_names)) == []


def test_nothing_outside_the_package_is_in_the_wheel(wheel_names: list[str]) -> None:
    code = [name for name in wheel_names if ".dist-info/" not in name]
    assert code and all(name.startswith("omni_trio/") for name in code)
    assert [name for name in wheel_names if name.split("/")[0] in OUTSIDE_THE_WHEEL] == []


def _imported(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_the_package_imports_nothing_from_the_repository_around_it() -> None:
    """What the wheel leaves out, the package must not need (lazy and type-only imports included)."""
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name in _imported(path)
        if name.split(".")[0] in OUTSIDE_THE_WHEEL
    ]
    assert wrong == []
