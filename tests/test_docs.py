"""The documentation's code runs, and the docs build: every ```python block of README.md and docs/*.md.

Each block runs in a fresh interpreter (``sys.executable -c``) from the
repository root with ``PYTHONPATH`` set to it, and must exit with 0 within
60 s. When a ```text block directly follows a python block (nothing but
blank lines between them), it is the block's output and must equal its
stdout. A block whose first line is ``# from examples/quickstart_stages.py:
name, name`` shows code of that module: each named object's source must
appear in the block verbatim, so the docs cannot drift from the factories
the other snippets import.

The blocks start in parallel (one per CPU) when the first test needs them.

The docs also build with Sphinx (``docs/conf.py``, MyST for the Markdown), warnings
failing the build, and the built API reference must document every name of
``omni_trio.__all__``, read at run time, so that a new public name without a
docstring entry, or a docstring Sphinx cannot read, fails here.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import inspect
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Pages made of Sphinx directives only (the table of contents, the generated reference): no code to run.
DIRECTIVES_ONLY = {"index.md", "reference.md"}
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in DIRECTIVES_ONLY)]
TIMEOUT_S = 60
SPHINX_TIMEOUT_S = 300
FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
MIRROR = re.compile(r"\A# from (?P<path>[\w/]+)\.py: (?P<names>[\w, ]+)\n")


@attrs.frozen
class Snippet:
    """One ```python block, with the output its docs show (if any)."""

    doc: Path
    line: int
    code: str
    expected: str | None

    @property
    def name(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def extract(doc: Path) -> list[Snippet]:
    """The python blocks of ``doc``, each paired with a directly following text block."""
    text = doc.read_text(encoding="utf-8")
    blocks = list(FENCE.finditer(text))
    snippets = []
    for index, block in enumerate(blocks):
        if block.group(1) != "python":
            continue
        expected = None
        if index + 1 < len(blocks):
            after = blocks[index + 1]
            if after.group(1) == "text" and not text[block.end() : after.start()].strip():
                expected = after.group(2)
        line = text.count("\n", 0, block.start()) + 1
        snippets.append(Snippet(doc, line, block.group(2), expected))
    return snippets


SNIPPETS = [snippet for doc in DOCS for snippet in extract(doc)]


def run(snippet: Snippet) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "OMNI_TRIO_TRACE"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", snippet.code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


Outcomes = dict[str, "concurrent.futures.Future[subprocess.CompletedProcess[str]]"]


@pytest.fixture(scope="module")
def outcomes() -> Iterator[Outcomes]:
    """Every snippet's run, started at once on a pool of one worker per CPU."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1))
    yield {snippet.name: pool.submit(run, snippet) for snippet in SNIPPETS}
    pool.shutdown(wait=False, cancel_futures=True)


def test_every_page_has_runnable_code() -> None:
    pages = {snippet.doc.name for snippet in SNIPPETS}
    assert pages == {doc.name for doc in DOCS}, "a page without a single python block"
    assert (ROOT / "examples" / "quickstart_stages.py").exists()


def test_linked_pages_exist() -> None:
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[snippet.name for snippet in SNIPPETS])
def test_snippet_runs(snippet: Snippet, outcomes: Outcomes) -> None:
    result = outcomes[snippet.name].result(timeout=TIMEOUT_S * len(SNIPPETS))
    assert result.returncode == 0, f"{snippet.name} exited with {result.returncode}:\n{result.stderr}"
    if snippet.expected is not None:
        assert result.stdout == snippet.expected, f"{snippet.name} printed:\n{result.stdout}"


@pytest.mark.parametrize(
    "snippet",
    [snippet for snippet in SNIPPETS if MIRROR.match(snippet.code)],
    ids=lambda snippet: snippet.name,
)
def test_shown_source_matches_the_module(snippet: Snippet) -> None:
    match = MIRROR.match(snippet.code)
    assert match is not None
    module = importlib.import_module(match["path"].replace("/", "."))
    for name in (part.strip() for part in match["names"].split(",")):
        source = inspect.getsource(getattr(module, name))
        assert source in snippet.code, f"{snippet.name}: the code shown for {name} differs from {module.__name__}"


def test_the_docs_build_and_the_reference_names_every_public_name(tmp_path: Path) -> None:
    out = tmp_path / "html"
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(ROOT / "docs"), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=SPHINX_TIMEOUT_S,
        check=False,
    )
    assert build.returncode == 0, f"sphinx-build failed:\n{build.stderr}"
    reference = (out / "reference.html").read_text(encoding="utf-8")
    documented = set(re.findall(r'id="omni_trio\.(\w+)"', reference))
    public = importlib.import_module("omni_trio").__all__
    assert sorted(set(public) - documented) == [], "public names missing from the built reference"
