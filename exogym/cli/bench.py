"""``exogym bench``: a fixed benchmark suite (``gym-v0``), every strategy scored the same way,
a leaderboard (:mod:`exogym.lab.bench`)."""

from __future__ import annotations

import argparse
import warnings
from typing import Any

from exogym.cli.common import (
    add_data_options,
    add_results_options,
    add_settings,
    converter,
    default_out,
)

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    bch = sub.add_parser(
        "bench", help="a fixed benchmark suite (gym-v0): every strategy scored the same way, "
                      "a leaderboard",
        description="Train the strategies on every track of the suite (task, nodes, network, "
                    "budget and the clock's compute per step all fixed by the suite id) and "
                    "write leaderboard.md / leaderboard.json and each track's comparison.")
    bch.add_argument("--suite", default="gym-v0", help="suite id (default gym-v0)")
    bch.add_argument("--strategies", type=converter("labels"), required=True,
                     metavar="LABEL,LABEL,...",
                     help="labels as in compare: ID, ID-NAME, path/file.py:Class[-NAME]")
    bch.add_argument("--tracks", type=converter("labels"), metavar="NAME,...",
                     help="only these tracks of the suite (default: all)")
    bch.add_argument("--set", dest="overrides", type=converter("key_value"), action="append",
                     default=[], metavar="[LABEL.]KEY=VALUE",
                     help="strategy settings, as in compare")
    bch.add_argument("--repeats", type=converter("positive_int"), default=1,
                     help="seeds (default 1)")
    add_settings(bch, ["seed"], helps={"seed": "the first seed (default 0)"})
    add_data_options(bch)
    add_results_options(bch, "results folder (default runs/bench-SUITE-TIME)")


def command(args: argparse.Namespace) -> int:
    """``exogym bench``: print the leaderboard and where it was written."""
    from exogym.lab.bench import bench, format_leaderboard

    out = args.out or default_out(f"bench-{args.suite}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # each comparison's results.md keeps its runs' warnings
        board = bench(args.suite, args.strategies, out_dir=out, tracks=args.tracks,
                      overrides=dict(args.overrides), repeats=args.repeats, seed=args.seed,
                      data_dir=args.data_dir, download=not args.no_download,
                      progress=not args.no_progress)
    print(format_leaderboard(board).rstrip())
    print(f"\nwritten to  {out}  (leaderboard.md, leaderboard.json, one folder per track)")
    return 0
