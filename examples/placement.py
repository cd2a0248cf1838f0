"""Where the examples put their stages: all in the caller, or one process each."""

from __future__ import annotations

import argparse

PLACEMENTS = ("embedded", "processes", "mixed")


def process_for(placement: str, process: str) -> str | None:
    """The ``process`` value of a stage that the chapter places in ``process``."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    if placement == "mixed":
        # The chapter's first stages stay in the caller, the last one gets a process.
        return None if process in MIXED_IN_CALLER else process
    return None if placement == "embedded" else process


#: Stages the "mixed" placement keeps in the caller's process.
MIXED_IN_CALLER = {"p_split", "p_upper", "p_talker"}


def parse_placement(description: str) -> str:
    """Read ``--placement`` from the command line."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--placement", choices=PLACEMENTS, default="embedded")
    return str(parser.parse_args().placement)
