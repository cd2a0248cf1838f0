"""Where the examples put their stages: all in the caller, or one process each."""

from __future__ import annotations

import argparse

PLACEMENTS = ("embedded", "processes")


def process_for(placement: str, process: str) -> str | None:
    """The ``process`` value of a stage that the chapter places in ``process``."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    return None if placement == "embedded" else process


def parse_placement(description: str) -> str:
    """Read ``--placement`` from the command line."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--placement", choices=PLACEMENTS, default="embedded")
    return str(parser.parse_args().placement)
