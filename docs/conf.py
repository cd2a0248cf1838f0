"""Sphinx configuration: the docs stay Markdown (MyST); the reference is built from the docstrings."""

from __future__ import annotations

import sys
from pathlib import Path

# The package is imported from this checkout, not from an installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

project = "omni-trio"
author = "omni-trio authors"
copyright = "omni-trio authors"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
html_theme = "alabaster"
