"""``exogym estimate``: the analytic calculator of :mod:`exogym.lab.estimate` (no training)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from exogym.cli.common import add_data_options, converter

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
    est.add_argument("--params", type=converter("count"),
                     help="model parameters, e.g. 7e9, 7B, 124M (default 7e9; with --task, "
                          "its model's)")
    est.add_argument("--dtype", choices=list(DTYPES),
                     help="parameter dtype on the wire (default fp16; with --task fp32, as a "
                          "run sends)")
    est.add_argument("--task", help="a registered task: its model's parameters, and a step "
                     "counted on it and priced on --hardware as a run prices it")
    est.add_argument("--hardware", metavar="DEVICE",
                     help="with --task: the device that prices the step (default rtx4090; "
                          "exogym devices lists them)")
    est.add_argument("--batch-size", type=converter("positive_int"), metavar="B",
                     help="with --task: the batch per node (default: the task's)")
    est.add_argument("--codec", help="transport codec, e.g. int8, fp4, topk:0.01 (default none)")
    est.add_argument("--nodes", type=converter("positive_int"), default=2,
                     help="nodes N (default 2)")
    work = est.add_mutually_exclusive_group()
    work.add_argument("--batches", type=converter("positive_int"),
                      help="batches in all (default 1000)")
    work.add_argument("--steps", type=converter("positive_int"),
                      help="steps per node (batches = steps x N)")
    est.add_argument("--compute-time", type=converter("any_duration"), metavar="TIME",
                     help="compute per batch on one node (default 1min; with --task, the "
                          "hardware's price of its step)")
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
    add_data_options(est)


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
    common = {"batches": batches, "codec": args.codec, **_work(args)}

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
            est.plot_estimates(str(args.plot), key, values, results,
                               _title(args, common, strategy, networks))
            print(f"plot      {args.plot}")
        return 0
    rows = [est.estimate(**common, strategy="single")]
    for strategy in strategies_:
        for net in networks:
            rows.append(est.estimate(**common, num_nodes=args.nodes, network=net,
                                     strategy=strategy, H=None if strategy == "ddp" else args.H,
                                     sync_time_s=sync_for(net)))
    print(est.format_estimates(rows, params=common["params"], dtype=common["dtype"],
                               codec=args.codec, batches=batches, compute_s=common["compute_s"]))
    if args.plot:
        est.plot_estimates(str(args.plot), None, [], {"": rows},
                           _title(args, common, ", ".join(strategies_), networks))
        print(f"plot      {args.plot}")
    return 0


def _title(args: argparse.Namespace, common: dict[str, Any], strategy: str,
           networks: list[Any]) -> str:
    """What a plot estimates, in its title: the model, the work, the nodes, the strategy, the
    networks."""
    model = args.task or f"{common['params']:,.0f} parameters"
    return (f"{model} ({common['dtype']} on the wire), {common['batches']:,} batches, "
            f"{args.nodes} nodes, {strategy}, on {', '.join(n.name for n in networks)}")


def _work(args: argparse.Namespace) -> dict[str, Any]:
    """The model's size, its dtype on the wire and the compute per batch: given, or (``--task``)
    its model's and its step counted and priced on ``--hardware``, as a run prices it."""
    if args.task is None:
        for flag, value in (("--hardware", args.hardware), ("--batch-size", args.batch_size)):
            if value is not None:
                raise ValueError(f"{flag} prices a task's step: give --task too")
        return {"params": args.params or 7e9, "dtype": args.dtype or "fp16",
                "compute_s": args.compute_time or 60.0}
    for flag, value in (("--params", args.params), ("--compute-time", args.compute_time)):
        if value is not None:
            raise ValueError(f"{flag} is the task's with --task {args.task}: give one of them")
    from exogym.lab.devices import task_step
    from exogym.sim.devices import parse_hardware

    hardware = parse_hardware(args.hardware)
    if not hardware.uniform:
        raise ValueError(f"--hardware {args.hardware!r}: the estimate prices one device; run "
                         f"the configuration (exogym run) for mixed hardware")
    count, params = task_step(args.task, batch_size=args.batch_size, data_dir=args.data_dir,
                              download=not args.no_download)
    device = hardware.devices[0]
    print(f"task      {args.task}: {params:,} parameters, {count.flops / 1e9:,.3g} GFLOP per step "
          f"at batch {count.samples}, priced on {device.title}")
    return {"params": params, "dtype": args.dtype or "fp32",
            "compute_s": device.step_time(count)}

