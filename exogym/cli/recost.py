"""``exogym recost``: a finished run's simulated time on other networks, its recorded
collectives replayed (:mod:`exogym.sim.clock`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from exogym.cli.common import converter

if TYPE_CHECKING:
    from exogym.sim.network import Network

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    recost = sub.add_parser("recost", help="simulated time of a finished run on other networks")
    recost.add_argument("run_dir", type=converter("path"), metavar="RUN_DIR", help="a run folder")
    recost.add_argument("--network", action="append", type=converter(_network),
                        help="a network (repeat it for several: --network a --network b; "
                             "default: every profile)")
    recost.add_argument("--step-time", type=converter("duration"), metavar="TIME",
                        help="re-cost with this compute per step instead of the recorded one")


def _network(text: str) -> Network:
    """``--network``'s value: one network spec (``home-100mbps``, ``home-100mbps,latency=50ms``,
    ``bw=1Gbps,latency=5ms``). Names alone separated by commas (``home-100mbps,datacenter``)
    are several networks, which ``--network`` takes one at a time: an error saying so."""
    from exogym.sim.network import parse_network

    parts = [p.strip() for p in text.split(",")]
    if len(parts) > 1 and all(p and "=" not in p for p in parts):
        raise ValueError(f"{text!r} names {len(parts)} networks: repeat --network for each, "
                         + " ".join(f"--network {p}" for p in parts))
    return parse_network(text)


def command(args: argparse.Namespace) -> int:
    from exogym.run.output.result import read_json
    from exogym.sim.clock import ClockTrace
    from exogym.sim.network import PROFILES, format_duration, parse_network

    path = args.run_dir / "summary.json"
    summary = read_json(path, "RUN_DIR must be a finished run's folder")
    if not summary.get("clock"):
        raise ValueError(f"{args.run_dir} has no simulated clock (it ran without a network)")
    try:
        trace = ClockTrace.from_dict(summary["clock"]["trace"])
        ran_on = parse_network(summary["network"]["spec"])
        strategy_id = summary["strategy"]
        sent = max(summary["bytes_sent_per_node"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path} is not a complete exogym run summary ({type(err).__name__}: "
                         f"{err})") from None
    step = args.step_time
    if step is not None and trace.not_recostable is not None:  # who took part would change too
        raise ValueError(f"this run cannot be re-costed with another compute time per step: "
                         f"{trace.not_recostable}; train it again with --step-time {step:g}s")
    # the run's own network, re-costed too (with --step-time the recorded report would not compare)
    ran = trace.cost(ran_on, step)
    networks: list[Network] = args.network or [
        net for net in PROFILES.values() if net.spec() != ran.network_spec]
    if not args.network and trace.not_recostable is not None:
        raise ValueError(f"this run cannot be re-costed on another network: "
                         f"{trace.not_recostable}; train it again with --network NAME on each "
                         "network to compare")
    for net in networks:  # before any output; FitResult.recost refuses the same
        if net.spec() != ran_on.spec():
            trace.check_recostable(net)
    print(f"run       {args.run_dir}: {strategy_id}, {trace.num_nodes} nodes, "
          f"{trace.steps:,} steps, {len(trace.records):,} collectives, "
          f"{_bytes(sent)} sent per node")
    print(f"compute   {format_duration(step or trace.step_time_s)} per step per node "
          f"({'given' if step else trace.compute_source})")
    rows = [["network", "total", "compute", "comm", "idle", "utilization", "vs the run"]]
    reports = [(f"{ran.network} (the run)", ran)] + [
        (net.name, trace.cost(net, step)) for net in networks]
    for name, r in reports:
        rows.append([name, format_duration(r.total_s), format_duration(r.compute_s),
                     format_duration(r.comm_s), format_duration(r.idle_s),
                     f"{100 * r.utilization:.1f}%", f"{r.total_s / ran.total_s:.3g}x"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    return 0


def _bytes(n: float) -> str:
    from exogym.lab.estimate import format_bytes

    return format_bytes(n)
