"""The package's layers (docs/design.md, "Layers"): each imports only the layers below it.

Read from the source (every ``import``, in functions and under ``TYPE_CHECKING`` too), so a lazy or a
type-only import up the layers fails here as a plain one does.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "omni_trio"

#: Bottom up: each layer's packages and modules under ``omni_trio``. The folders are the layers.
LAYERS: list[tuple[str, frozenset[str]]] = [
    ("base", frozenset({"errors", "payload", "events", "config", "tracing"})),
    ("data plane", frozenset({"comm"})),
    ("control plane", frozenset({"control"})),
    ("schedulers", frozenset({"scheduling"})),
    ("stages", frozenset({"stage"})),
    ("requests", frozenset({"coordinator"})),
    ("runtime", frozenset({"runtime"})),
    ("serving", frozenset({"serve"})),
]
#: Imported by no layer: the command line, the pytest plugin, the public face.
OUTSIDE = frozenset({"cli", "testing", "__main__"})


def _top(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "omni_trio" and len(parts) > 1 else None


def _layer(top: str | None) -> int | None:
    return next((i for i, (_, tops) in enumerate(LAYERS) if top in tops), None)


def _imports(source: str) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _module_files() -> list[tuple[str, Path]]:
    return [(path.relative_to(PACKAGE).parts[0].removesuffix(".py"), path) for path in sorted(PACKAGE.rglob("*.py"))]


def test_every_module_has_a_layer_or_stays_outside() -> None:
    tops = {top for top, _ in _module_files()} - {"__init__"}
    placed = set().union(*(tops for _, tops in LAYERS))
    assert sorted(tops - placed - OUTSIDE) == [], "name the layer of a new module here and in docs/design.md"


def test_each_layer_imports_only_the_layers_below_it() -> None:
    wrong = []
    for top, path in _module_files():
        mine = _layer(top)
        if mine is None:
            continue
        for name in _imports(path.read_text()):
            theirs = _layer(_top(name))
            if _top(name) in OUTSIDE or (theirs is not None and theirs > mine):
                where = "outside the layers" if theirs is None else f"the {LAYERS[theirs][0]}"
                wrong.append(f"{path.relative_to(PACKAGE.parent)} ({LAYERS[mine][0]}) imports {name} ({where})")
    assert wrong == []


def test_lazy_and_type_only_imports_are_read() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from omni_trio.stage.stage import Stage\n"
        "def f():\n    import omni_trio.runtime.workers.worker\n    from . import sibling\n"
    )
    assert _imports(source) == ["typing", "omni_trio.stage.stage", "omni_trio.runtime.workers.worker"]
