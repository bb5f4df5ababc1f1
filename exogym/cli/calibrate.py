"""``exogym calibrate``: measure the links between real ranks and write a network file
(:mod:`exogym.run.dist.calibrate`)."""

from __future__ import annotations

import argparse
from typing import Any

from exogym.cli.common import converter

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    """``exogym calibrate``'s options (:mod:`exogym.run.dist.calibrate`)."""
    cal = sub.add_parser(
        "calibrate", help="measure the links between real ranks and write a network file",
        description="Measure the links between the ranks of a torchrun job (or of --engine "
                    "process on one machine) with the transport training uses (all-reduces "
                    "and ping-pongs over a range of sizes), fit the network model and write it "
                    "as a network file for --network FILE, recost and estimate. Prints what it "
                    "measured and the fit's residuals.")
    cal.add_argument("--out", type=converter("path"), required=True, metavar="FILE.json",
                     help="where to write the network file")
    cal.add_argument("--engine", choices=["process"],
                     help="without torchrun: start --nodes processes on this machine")
    cal.add_argument("--nodes", type=converter("positive_int"),
                     help="ranks with --engine process (default 2; under torchrun its world)")
    cal.add_argument("--reps", type=converter("positive_int"), default=5,
                     help="timed repeats of every case, median taken (default 5)")
    cal.add_argument("--target-time", type=converter("duration"), default=2.0,
                     metavar="TIME", help="the largest all-reduce takes about this (default "
                                          "2s)")
    cal.add_argument("--max-size", type=converter("positive_int"), default=64_000_000,
                     metavar="BYTES",
                     help="the largest transfer, bytes (default 64000000)")
    cal.add_argument("--name", default="calibrated", help="the network's name (default "
                                                          "calibrated)")
    cal.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                     help="cpu: gloo (default); cuda: nccl, one GPU per rank")
    cal.add_argument("--per-node", action=argparse.BooleanOptionalAction, default=None,
                     help="write every node's rates (the file then fits runs of exactly this "
                          "N) or one rate for all (any N); default: per node when they differ "
                          "by more than 10%%")


def command(args: argparse.Namespace) -> int:
    """``exogym calibrate``: measure (every rank), fit and write the file (rank 0 prints)."""
    import torch

    from exogym.run.dist.calibrate import CalibrateOptions, calibrate, measure_rank
    from exogym.run.dist.ranks import RankContext, close_group, join_torchrun, torchrun_env
    from exogym.run.launch import launch
    from exogym.sim.calibration import format_fit

    opts = CalibrateOptions(reps=args.reps, target_s=args.target_time, max_bytes=args.max_size)
    backend = "nccl" if args.device == "cuda" else "gloo"
    env = torchrun_env()
    if env is not None:
        if args.engine is not None or (args.nodes is not None and args.nodes != env.world_size):
            raise ValueError(f"under torchrun the ranks are torchrun's ({env.world_size}): drop "
                             "--engine and --nodes")
        device = join_torchrun(env, torch.device(args.device))
        ctx = RankContext(env.rank, env.world_size, 1, str(device))
        measured = measure_rank(ctx, opts)
        close_group(clean=True)
    elif args.engine == "process":
        measured = launch(measure_rank, args.nodes or 2, opts, backend=backend, threads=1,
                          timeout_s=300.0)[0]
    else:
        raise ValueError("calibrate measures the links between real processes: launch it with "
                         "torchrun (one rank per machine), or give --engine process [--nodes N] "
                         "to measure this machine's loopback")
    if measured is None:  # a rank other than 0
        return 0
    fit = calibrate(measured, args.out, name=args.name, backend=backend, opts=opts,
                    per_node=args.per_node)
    ccs = ", ".join(sorted({r["cc"] for r in measured["ranks"]}))
    print(f"measured {len(measured['ranks'])} ranks ({backend}, TCP congestion control {ccs})")
    print(format_fit(fit))
    print(f"wrote {args.out}: use --network {args.out} (run, recost, estimate)")
    return 0
