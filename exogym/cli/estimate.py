"""``exogym estimate``: the analytic calculator of :mod:`exogym.lab.estimate` (no training)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from exogym.cli.common import converter

if TYPE_CHECKING:
    from exogym.sim.network import Network

__all__ = ["add_parser", "command"]


def _sweep(text: str) -> tuple[str, list[int]]:
    key, sep, values = text.partition("=")
    key = {"H": "H", "nodes": "num_nodes"}.get(key.strip(), "")
    try:
        numbers = [int(v) for v in values.split(",")]
    except ValueError:
        numbers = []
    if not sep or not key or not numbers or min(numbers) < 1:
        raise ValueError(f"expected H=1,10,100 or nodes=2,4,8 (integers >= 1), got {text!r}")
    return key, numbers


def add_parser(sub: Any) -> None:
    from exogym.lab.estimate import DTYPES, STRATEGIES

    est = sub.add_parser(
        "estimate", help="analytic training time, bytes and utilization (no training)",
        description="Defaults are the EXO Gym post's example: a 7B fp16 model, 1,000 one-minute "
                    "batches on 2 nodes, in a data centre and over 100 Mbit/s home internet, DDP "
                    "and DiLoCo H=500.")
    est.add_argument("--params", type=converter("count"), default=7e9,
                     help="model parameters, e.g. 7e9, 7B, 124M (default 7e9)")
    est.add_argument("--dtype", choices=list(DTYPES), default="fp16",
                     help="parameter dtype on the wire (default fp16)")
    est.add_argument("--codec", help="transport codec, e.g. int8, fp4, topk:0.01 (default none)")
    est.add_argument("--nodes", type=converter("positive_int"), default=2,
                     help="nodes N (default 2)")
    work = est.add_mutually_exclusive_group()
    work.add_argument("--batches", type=converter("positive_int"),
                      help="batches in all (default 1000)")
    work.add_argument("--steps", type=converter("positive_int"),
                      help="steps per node (batches = steps x N)")
    est.add_argument("--compute-time", type=converter("any_duration"), default=60.0,
                     metavar="TIME", help="compute per batch on one node (default 1min)")
    est.add_argument("--network", action="append", type=converter("network"),
                     help="a network (repeatable; default: datacenter and home-100mbps)")
    est.add_argument("--strategy", action="append", choices=STRATEGIES,
                     help="repeatable (default: ddp and diloco)")
    est.add_argument("--H", type=converter("positive_int"), default=500,
                     help="steps between syncs of diloco/fedavg (default 500)")
    est.add_argument("--sync-time", action="append", default=[], metavar="[NETWORK=]TIME",
                     help="give the send-once sync time instead of computing it, for every "
                          "network or one (e.g. home-100mbps=20min, the EXO Gym post's "
                          "rounding)")
    est.add_argument("--sweep", type=converter(_sweep), metavar="H=1,10,100 | nodes=2,4,8",
                     help="a table of training time against H or the number of nodes")
    est.add_argument("--plot", type=converter("path"), metavar="FILE.png",
                     help="write a plot (PNG)")


def command(args: argparse.Namespace) -> int:
    from exogym.lab import estimate as est
    from exogym.sim.network import PROFILES, parse_duration

    if args.plot:
        from exogym.lab.plots import require_matplotlib
        from exogym.run.output.result import check_writable

        require_matplotlib()  # before any output
        check_writable(args.plot, "plot file")
    networks: list[Network] = args.network or [PROFILES["datacenter"], PROFILES["home-100mbps"]]
    strategies_: list[str] = args.strategy or ["ddp", "diloco"]
    given: dict[str, float] = {}
    for item in args.sync_time:
        where, _, value = item.rpartition("=")
        given[where.strip()] = parse_duration(value)
    names = {net.name for net in networks} | {"", *PROFILES}
    unknown = set(given) - names
    if unknown:
        raise ValueError(f"--sync-time names network {sorted(unknown)[0]!r}, which is not one of "
                         f"the --network values ({', '.join(n.name for n in networks)})")
    batches = args.batches or (args.steps * args.nodes if args.steps else 1000)
    common = {"params": args.params, "dtype": args.dtype, "codec": args.codec,
              "batches": batches, "compute_s": args.compute_time}

    def sync_for(net: Network) -> float | None:
        return given.get(net.name, given.get(""))

    if args.sweep is not None:
        key, values = args.sweep
        strategy = strategies_[-1]
        results = {net.name: est.sweep(key, values, **common, network=net, strategy=strategy,
                                       num_nodes=args.nodes, H=None if strategy == "ddp" else
                                       args.H, sync_time_s=sync_for(net))
                   for net in networks}
        print(est.format_sweep(key, values, results))
        if args.plot:
            est.plot_estimates(str(args.plot), key, values, results)
            print(f"plot      {args.plot}")
        return 0
    rows = [est.estimate(**common, strategy="single")]
    for strategy in strategies_:
        for net in networks:
            rows.append(est.estimate(**common, num_nodes=args.nodes, network=net,
                                     strategy=strategy, H=None if strategy == "ddp" else args.H,
                                     sync_time_s=sync_for(net)))
    print(est.format_estimates(rows, params=args.params, dtype=args.dtype, codec=args.codec,
                               batches=batches, compute_s=args.compute_time))
    if args.plot:
        est.plot_estimates(str(args.plot), None, [], {"": rows})
        print(f"plot      {args.plot}")
    return 0
