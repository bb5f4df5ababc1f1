"""``exogym check``: the conformance checks against any strategy, a pass/fail table
(:mod:`exogym.lab.check`)."""

from __future__ import annotations

import argparse
from typing import Any

from exogym.cli.common import converter

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    chk = sub.add_parser("check", help="conformance checks of a strategy (yours: FILE.py:Class), "
                                       "a pass/fail table; exit 1 on a failure")
    chk.add_argument("strategies", nargs="+", metavar="STRATEGY",
                     help="registry ids, path/to/file.py:Class or package.module:Class")
    chk.add_argument("--set", dest="overrides", type=converter("key_value"), action="append",
                     default=None, metavar="KEY=VALUE",
                     help="a hyperparameter for the checks' 6-step runs (default: H=2 where the "
                          "strategy has an H, so that it synchronises)")
    chk.add_argument("--no-processes", action="store_true",
                     help="skip the check against 2 real processes (the slowest)")


def command(args: argparse.Namespace) -> int:
    """``exogym check``: every check against each strategy; 1 if any failed."""
    from exogym.lab.check import check_strategy, render

    failed = False
    for spec in args.strategies:
        overrides = dict(args.overrides) if args.overrides is not None else None
        results = check_strategy(spec, overrides, processes=not args.no_processes)
        print(render(spec, results), flush=True)
        failed |= any(r.passed is False for r in results)
    return 1 if failed else 0
