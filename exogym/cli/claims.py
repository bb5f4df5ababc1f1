"""``exogym claims``: the claims suite, published results checked at small scale, each decided by
a rule written before its first run (:mod:`exogym.lab.claims`); resumable."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from exogym.cli.common import add_data_options, add_results_options

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "claims", help="published claims reproduced at small scale, with verdicts; resumable",
        description="Train every configuration of every claim of the suite with its seeds, "
                    "decide each claim by its rules (claims-v1: a t-interval of the compared "
                    "per-seed statistic, equivalence within a stated margin or a side of a "
                    "threshold: reproduced, not reproduced or inconclusive; the controls "
                    "first) and write claims.md, claims.json and a plot per claim. Run it "
                    "again with the same --out to continue: finished runs are not retrained.")
    p.add_argument("--only", metavar="ID,...",
                   help="these claims only (comma-separated; --list shows the ids)")
    p.add_argument("--quick", action="store_true",
                   help="one seed and short runs: a check of the machinery, never of the "
                        "verdicts (CI runs it)")
    p.add_argument("--list", action="store_true", help="list the claims and stop")
    p.add_argument("--suite", default="claims-v1",
                   choices=("claims-v1", "claims-v1-diagnostics", "claims-v0"),
                   help="the suite (claims-v1-diagnostics: scale or defect for each claim "
                        "claims-v1 did not reproduce; claims-v0: superseded, kept as it was "
                        "recorded)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run although the code has uncommitted changes (refused otherwise: a "
                        "result names its commit); provenance.json records it")
    add_data_options(p)
    add_results_options(p, "results folder: new, or a claims run to continue (default "
                           "runs/SUITE, runs/SUITE-quick with --quick)")


def command(args: argparse.Namespace) -> int:
    """``exogym claims``: print the claims table and where it was written."""
    from exogym.lab.claims import SUITES, run_claims, select, write_report

    suite = args.suite
    every = SUITES[suite]
    claims = select(every, _only(args.only, [c.id for c in every]))
    if args.list:
        width = max(len(c.id) for c in claims)
        for c in claims:
            print(f"{c.id:{width}s} {c.paper.authors} {c.paper.year} ({c.paper.source}): "
                  f"{c.claim}")
        return 0
    out = args.out or Path("runs") / (suite + ("-quick" if args.quick else ""))
    outcomes = run_claims(claims, out, suite=suite, quick=args.quick, data_dir=args.data_dir,
                          download=not args.no_download, progress=not args.no_progress,
                          allow_dirty=args.allow_dirty)
    write_report(outcomes, out, suite)
    print((out / "claims.md").read_text(encoding="utf-8")
          .split("\n## Rules and commands")[0].rstrip())
    print(f"\nwritten to {out}  (claims.md, claims.json, a plot per claim, a folder per claim)")
    return 0


def _only(value: str | None, known: list[str]) -> list[str] | None:
    """``--only``'s ids (None: every claim); an empty item (``--only ,``, ``--only a,,b``) is an
    error naming the value and the known ids, never an empty or shorter selection."""
    if value is None:
        return None
    ids = [i.strip() for i in value.split(",")]
    if not all(ids):
        raise ValueError(f"--only {value!r}: an empty claim id; give one or more of "
                         f"{', '.join(known)} (comma-separated, see --list)")
    return ids
