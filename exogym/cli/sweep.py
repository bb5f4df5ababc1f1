"""``exogym sweep``: one strategy over a grid of settings, with repeats; resumable
(:mod:`exogym.lab.sweep`)."""

from __future__ import annotations

import argparse
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
    swp = sub.add_parser(
        "sweep", help="one strategy over a grid of settings, with repeats; resumable",
        description="Train the strategy at every combination of the --grid axes (strategy "
                    "keys, nodes, network), REPEATS seeds each; write results.md / results.json "
                    "(mean ± std per point, the best), sweep.png and every run's folder. Run it "
                    "again with the same --out to continue: finished runs are not retrained.")
    swp.add_argument("--task", default="mnist",
                     help="task id or path/to/file.py:NAME (default mnist)")
    swp.add_argument("--strategy", default="diloco",
                     help="strategy id or path/to/file.py:Class (default diloco)")
    swp.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                     required=True,
                     help="an axis: a strategy key (H=10,50,100), nodes=2,4,8 or "
                          "network=datacenter,home-100mbps; repeat for more axes")
    swp.add_argument("--set", dest="overrides", type=converter("key_value"), action="append",
                     default=[], metavar="KEY=VALUE",
                     help="a fixed strategy setting for every point")
    add_settings(swp, ["num_nodes", "max_steps"], defaults={"max_steps": 500}, helps={
        "num_nodes": "N, unless swept (default 4)",
        "max_steps": "training steps of every run (default 500)"})
    swp.add_argument("--repeats", type=converter("positive_int"), default=1,
                     help="seeds per point: SEED..SEED+K-1 (default 1)")
    add_settings(swp, ["seed", "network", "step_time", "eval_samples"], helps={
        "seed": "the first seed (default 0)",
        "network": "simulated network, unless swept (default datacenter)",
        "step_time": "compute per step per node for the clock (default: the step "
                     "priced on an RTX 4090, docs/devices.md)",
        "eval_samples": "samples of each evaluation during training (default 2000)"})
    add_data_options(swp)
    add_results_options(swp, "results folder: new, or a sweep to continue (default "
                          "runs/sweep-STRATEGY-TIME)")


def command(args: argparse.Namespace) -> int:
    """``exogym sweep``: print the results table and where it was written."""
    from exogym.lab.sweep import parse_grid, sweep

    grid = parse_grid(args.grid)
    name = args.strategy.rpartition(":")[2] if ":" in args.strategy else args.strategy
    out = args.out or default_out(f"sweep-{name}")
    result = sweep(args.task, args.strategy, grid, out_dir=out, num_nodes=args.nodes,
                   max_steps=args.steps, repeats=args.repeats, seed=args.seed,
                   network=args.network, overrides=dict(args.overrides),
                   step_time=args.step_time, eval_samples=args.eval_samples,
                   data_dir=args.data_dir, download=not args.no_download,
                   progress=not args.no_progress)
    print((out / "results.md").read_text(encoding="utf-8").rstrip())
    print(f"\ntrained {result.trained} run(s), read {result.reused} finished one(s); written "
          f"to {out}  (results.md, results.json" + (", sweep.png" if result.plot else "")
          + ", runs/)")
    return 0
