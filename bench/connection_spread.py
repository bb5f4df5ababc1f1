#!/usr/bin/env python
"""How steady a TCP congestion control's rate is from one connection to the next (issue 29).

``exogym calibrate`` measures the links over one set of connections; a run opens its own. This
script asks whether the rate TCP reaches is a property of the link or of the connection: on the
namespace + tbf links of ``bench/clock_fidelity.py`` (same helpers, same names, removed by name
at the end), for every congestion control in ``--cc``, it starts a fresh gloo process group of
``--nodes`` ranks (new TCP connections) for every setting and repeat, and times ``--reps``
all-reduces of each ``--sizes`` after three untimed ones. A setting is the idle time before
each timed all-reduce (``--gaps``, seconds of busy compute, as between a run's collectives;
``barrier``: right after a barrier, as ``exogym calibrate`` does). The time of an all-reduce is
``mean_r(leave_r) - max_r(enter_r)`` (the clock's definition, as in ``clock_fidelity.py``); the
table gives each group's median as the efficiency it implies (the payload rate over the shaped
rate, ring all-reduce: ``2 (N-1)/N * S * 8 / (rate * t)``, the model's ``efficiency`` with no
latency), and a summary line per congestion control and size: the smallest and largest over
all groups.

Usage (root, the virtual environment's python; ``cubic`` must be in the host's
``net.ipv4.tcp_allowed_congestion_control``)::

    sudo -E "$(command -v python)" bench/connection_spread.py --cc bbr,cubic --rate 20 \\
        --sizes 860000,4000000 --reps 20,5 --gaps barrier,0,0.02,0.1 --repeat 2
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from exogym.sim.network import ring_all_reduce_time

sys.path.insert(0, str(Path(__file__).resolve().parent))
import clock_fidelity as cf  # a sibling script, not a package


def gaps_of(text: str) -> list[float | None]:
    """``"barrier,0,0.02"`` -> ``[None, 0.0, 0.02]`` (None: after a barrier)."""
    out: list[float | None] = []
    for item in text.split(","):
        if item.strip() == "barrier":
            out.append(None)
            continue
        try:
            value = float(item)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"--gaps: {item.strip()!r} in {text!r} must be 'barrier' or a "
                             f"number of seconds >= 0")
        out.append(value)
    return out


def efficiency(seconds: float, size: int, nodes: int, rate_bps: float) -> float:
    """The payload rate of a ring all-reduce of ``size`` bytes over the shaped rate."""
    return ring_all_reduce_time(size, nodes, rate_bps, 0.0) / seconds


def one_group(topo: cf.Topology, nodes: int, sizes: Sequence[int], reps: Sequence[int],
              gap: float | None, workdir: Path) -> list[float]:
    """A fresh process group: the median time of each size's all-reduces (three untimed
    full-size ones first)."""
    argv = ["_collective", "--sizes", ",".join(map(str, sizes)), "--reps",
            ",".join(map(str, reps)), "--warmups", "3", "--warmup-bytes", str(max(sizes)),
            "--out", str(workdir / "spread")]
    if gap is not None:
        argv += ["--gap", repr(gap)]
    cf.launch(topo, nodes, argv, workdir, "spread", timeout_s=900.0)
    times = cf.read_times(workdir, "spread", nodes)
    return [statistics.median(cf.collective_seconds([t["enter"][k] for t in times],
                                                    [t["leave"][k] for t in times]))
            for k in range(len(sizes))]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cc", default="bbr,cubic", help="congestion controls (default bbr,cubic)")
    p.add_argument("--rate", type=float, default=20.0, help="shaped rate, Mbit/s (default 20)")
    p.add_argument("--nodes", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--sizes", default="860000,4000000", help="all-reduce sizes, bytes")
    p.add_argument("--reps", default="20,5", help="timed all-reduces per size and group")
    p.add_argument("--gaps", default="barrier,0,0.02,0.1",
                   help="idle seconds before each all-reduce ('barrier': after a barrier)")
    p.add_argument("--repeat", type=int, default=2, help="fresh groups per setting (default 2)")
    a = p.parse_args(argv)
    try:
        sizes = [int(v) for v in cf.parse_numbers(a.sizes, "--sizes", integer=True, least=4,
                                                  why="one fp32 element")]
        reps = [int(v) for v in cf.parse_numbers(a.reps, "--reps", integer=True, least=1,
                                                 why="one timed all-reduce")]
        gaps = gaps_of(a.gaps)
    except ValueError as err:
        p.error(str(err))
    if len(reps) != len(sizes):
        p.error(f"--reps needs one count per size ({len(sizes)}), got {a.reps!r}")
    if a.nodes < 2 or a.repeat < 1 or a.rate <= 0:
        p.error(f"--nodes must be >= 2, --repeat >= 1 and --rate > 0, got {a.nodes}, "
                f"{a.repeat}, {a.rate:g}")
    cf.check_environment()
    topo = cf.Topology(f"{os.getpid() & 0xFFFF:04x}", a.nodes)
    proc = Path("/proc/sys/net/ipv4")
    with cf.network(topo), tempfile.TemporaryDirectory(prefix="exg-spread-") as tmp:
        for cmd in cf.shaping_commands(topo, a.rate * 1e6):
            cf.sh(cmd)
        print("| cc | gap before each | group | " + " | ".join(f"{s} B" for s in sizes) + " |")
        print("|---|---|---|" + "---|" * len(sizes))
        for cc in a.cc.split(","):
            problem = cf.cc_problem(cc, (proc / "tcp_allowed_congestion_control").read_text(),
                                    (proc / "tcp_available_congestion_control").read_text())
            if problem:
                raise SystemExit(f"connection_spread: {problem}")
            for cmd in cf.cc_commands(topo, cc):
                cf.sh(cmd)
            seen: list[list[float]] = [[] for _ in sizes]
            for k in range(a.repeat):
                for gap in gaps:
                    secs = one_group(topo, a.nodes, sizes, reps, gap, Path(tmp))
                    effs = [efficiency(t, s, a.nodes, a.rate * 1e6)
                            for t, s in zip(secs, sizes, strict=True)]
                    for j, e in enumerate(effs):
                        seen[j].append(e)
                    what = "barrier" if gap is None else f"{1e3 * gap:g} ms"
                    print(f"| {cc} | {what} | {k + 1} | "
                          + " | ".join(f"{e:.3f}" for e in effs) + " |", flush=True)
            for s, e in zip(sizes, seen, strict=True):
                print(f"{cc}, {s} B, N = {a.nodes}, {a.rate:g} Mbit/s: efficiency "
                      f"{min(e):.3f} to {max(e):.3f} over {len(e)} groups (median "
                      f"{statistics.median(e):.3f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
