"""``exogym compare``: several strategies on one task from the same seeds, one table
(:mod:`exogym.lab.compare`)."""

from __future__ import annotations

import argparse
import warnings
from typing import Any

from exogym.cli.common import (
    add_data_options,
    add_results_options,
    add_settings,
    add_task_option,
    converter,
    default_out,
    get_task,
)

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    cmp = sub.add_parser(
        "compare", help="train several strategies on one task from the same seeds, one table",
        description="Train each strategy on the task from the same seeds and write results.md "
                    "(final eval, steps to a target loss, bytes per node, simulated time), "
                    "results.json, three plots and every run's folder.")
    cmp.add_argument("--strategies", type=converter("labels"),
                     default=["ddp", "fedavg", "diloco", "sparta", "demo"],
                     metavar="LABEL,LABEL,...",
                     help="comma-separated labels: ID or ID-NAME to list a strategy twice, e.g. "
                          "ddp,diloco,diloco-h10; your own as path/file.py:Class[-NAME] or "
                          "module:Class[-NAME], labelled by its id (the class name) "
                          "(default ddp,fedavg,diloco,sparta,demo)")
    add_task_option(cmp)
    # the run settings every run of the comparison shares, as `exogym run` takes them
    add_settings(cmp, ["num_nodes", "batch_size", "partition", "micro_batch_size", "precision",
                       "device", "network", "world", "eval_samples", "allow_nonfinite",
                       "allow_unsynced"])
    add_data_options(cmp)
    add_settings(cmp, ["trace", "seed", "max_steps", "eval_interval", "compute", "hardware",
                       "step_time"],
                 defaults={"max_steps": 500}, helps={
                     "trace": "every run also writes its timeline as a Chrome trace "
                              "(trace.json), linked from results.md",
                     "seed": "the first seed, an integer >= 0 (default 0)",
                     "max_steps": "training steps of every run (default 500)",
                     "eval_interval": "steps between evaluations (default: the task's, at most "
                                      "steps/10)",
                     "step_time": "compute per step per node for the clock, e.g. 30ms "
                                  "(instead of --hardware's price)"})
    cmp.add_argument("--repeats", type=converter("positive_int"), default=1,
                     help="seeds per strategy: SEED..SEED+K-1; the table shows mean ± sample "
                          "std (default 1)")
    cmp.add_argument("--target-loss", type=converter("finite"),
                     help="eval loss of 'steps to target' (default: the worst final eval loss "
                          "over all runs)")
    cmp.add_argument("--set", dest="overrides", type=converter("key_value"), action="append",
                     default=[], metavar="[LABEL.]KEY=VALUE",
                     help="a strategy setting: diloco.H=50 for one label, optim.lr=2e-3 for "
                          "every strategy (keys: `exogym strategies`)")
    add_results_options(cmp, "results folder, must not exist (default runs/compare-TASK-TIME)")


def command(args: argparse.Namespace) -> int:
    """``exogym compare``: print the table and where the results were written."""
    from exogym.lab.compare import compare
    from exogym.lab.report import compute_sources, format_table

    out = args.out or default_out(f"compare-{get_task(args.task).id}")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="plots not drawn")  # printed below instead
        c = compare(
            args.task, args.strategies, num_nodes=args.nodes, max_steps=args.steps,
            out_dir=out, network=args.network, repeats=args.repeats, seed=args.seed,
            target_loss=args.target_loss, batch_size=args.batch_size,
            partition=args.partition, micro_batch_size=args.micro_batch_size,
            precision=args.precision, eval_interval=args.eval_interval,
            overrides=args.overrides, step_time=args.step_time, compute=args.compute,
            hardware=args.hardware, device=args.device,
            data_dir=args.data_dir, download=not args.no_download, progress=not args.no_progress,
            eval_samples=args.eval_samples, allow_unsynced=args.allow_unsynced,
            allow_nonfinite=args.allow_nonfinite, world=args.world, trace=args.trace)
    print("\n".join(format_table(c)))
    print(f"sim times on {c.network}, each step priced {compute_sources(c)} "
          f"(docs/devices.md)")
    if c.plot_note:
        print(f"exogym: {c.plot_note}")
    print(f"written to  {c.out_dir}  (results.md, results.json"
          + "".join(f", {p.name}" for p in c.plots) + ", runs/)")
    return 0
