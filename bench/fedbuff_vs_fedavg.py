"""FedBuff against synchronous FedAvg over a population, in FLSim's world (issue 44).

The claim (Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", AISTATS
2022, arXiv 2106.06639): under client heterogeneity, asynchronous FL with a buffer (FedBuff)
reaches a target accuracy sooner in wall-clock time than synchronous FL (the paper: several
times sooner). The world is FLSim's (the simulator the paper used): every client session lasts
``|N(0, 1)|`` seconds drawn per session (``--world duration=halfnormal:1:0``, FLSim's Sent140
configuration), clients talk to a server over their own 100 Mbit/s links and the server's link is
no bottleneck (``topology=server``, a population's default).

Setting: MNIST, Dirichlet(0.5) over 100,000 clients, batch 8, ``H = 10`` local steps (AdamW,
the strategies' defaults), FedBuff ``K = 10`` with 100 clients in flight against FedAvg with 100
clients per round, an evaluation on 1,000 test images every ``--eval-every`` steps, 400 steps for
FedAvg (40 rounds) and 1,000 for FedBuff (the run's steps are its fastest seat's, and each of its
seats steps ten times per session of ``|N(0, 1)|`` s where a FedAvg round waits for the slowest
of 100 sessions: FedBuff's steps cover less simulated time), seeds 0, 1, 2.

The rule, written before the first run (2026-11-28): per seed, ``r = T(FedAvg) / T(FedBuff)``,
``T`` the simulated time of the first evaluation at or above 90% accuracy (a method that never
reaches it within its steps: ``T = inf``). The paper's direction is **reproduced** if ``r > 1``
for every seed, **reversed** if ``r < 1`` for every seed, **inconclusive** otherwise. The
figures reported beside it: each method's time split (compute, communication, waiting) and
FedBuff's staleness.

``--server RATE,...`` adds the server link as an ablation (``server=RATE`` on the network:
the transfers in flight share it): the same pair at each rate, one seed, to find where the
ranking flips.

    python bench/fedbuff_vs_fedavg.py --seeds 0,1,2
    python bench/fedbuff_vs_fedavg.py --seeds 0 --server 1Gbps,100Mbps,10Mbps

Never run it beside another benchmark (two cores).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paging import run_exogym


def case_args(method: str, seed: int, a: argparse.Namespace, server: str | None) -> tuple[str, ...]:
    network = "home-100mbps" + (f",server={server}" if server else "")
    steps = a.fedbuff_steps if method == "fedbuff" else a.steps
    common = ("--task", "mnist", "--nodes", "100000", "--batch-size", "8", "--steps",
              str(steps), "--network", network, "--world", a.world,
              "--eval-interval", str(a.eval_every), "--eval-samples", "1000",
              "--partition", "dirichlet:0.5", "--seed", str(seed), "--set", "H=10")
    if method == "fedbuff":
        return ("--strategy", "fedbuff", "--set", "K=10", "--concurrency", "100", *common)
    return ("--strategy", "fedavg", "--participation", "100", *common)


def measure(method: str, seed: int, a: argparse.Namespace, server: str | None) -> dict[str, Any]:
    summary, rows, rss, wall = run_exogym(case_args(method, seed, a, server))
    reached = next((r["sim_time_s"] for r in rows
                    if r.get("eval_accuracy", 0.0) >= a.target), math.inf)
    asyn = summary.get("asynchronous") or {}
    return {"method": method, "seed": seed, "server": server, "time_to_target_s": reached,
            "sim_time_s": summary["sim_time_s"], "accuracy": summary["final"]["eval_accuracy"],
            "compute_s": summary["sim_compute_s"], "comm_s": summary["sim_comm_s"],
            "idle_s": summary["sim_idle_s"], "staleness_mean": asyn.get("staleness_mean"),
            "staleness_max": asyn.get("staleness_max"),
            "client_rounds": (summary.get("population") or {}).get("rounds"),
            "samples_per_s": summary["samples"] / summary["train_time_s"],
            "peak_rss_gb": rss, "wall_s": wall}


def verdict(ratios: list[float]) -> str:
    if all(r > 1 for r in ratios):
        return "reproduced"
    if all(r < 1 for r in ratios):
        return "reversed"
    return "inconclusive"


def report(rows: list[dict[str, Any]], target: float) -> None:
    print(f"\n{platform.node()}, {os.cpu_count()} cores, python {platform.python_version()}")
    print(f"| server link | seed | method | sim time to {100 * target:g}% | final accuracy | "
          "sim time | compute | comm | idle (per node, mean) | staleness mean / max | "
          "samples/s |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        stale = ("" if r["staleness_mean"] is None
                 else f"{r['staleness_mean']:.1f} / {r['staleness_max']}")
        print(f"| {r['server'] or 'unlimited'} | {r['seed']} | {r['method']} | "
              f"{r['time_to_target_s']:,.1f} s | {100 * r['accuracy']:.2f}% | "
              f"{r['sim_time_s']:,.1f} s | {r['compute_s']:,.1f} s | {r['comm_s']:,.1f} s | "
              f"{r['idle_s']:,.1f} s | {stale} | {r['samples_per_s']:,.0f} |")
    for server in dict.fromkeys(r["server"] for r in rows):
        pairs = {}
        for r in rows:
            if r["server"] == server:
                pairs.setdefault(r["seed"], {})[r["method"]] = r["time_to_target_s"]
        ratios = [p["fedavg"] / p["fedbuff"] for p in pairs.values()
                  if "fedavg" in p and "fedbuff" in p]
        shown = ", ".join(f"{x:.2f}" for x in ratios)
        print(f"server link {server or 'unlimited'}: T(FedAvg) / T(FedBuff) per seed {shown}; "
              f"median {statistics.median(ratios):.2f}; verdict: {verdict(ratios)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--steps", type=int, default=400, help="FedAvg's steps (40 rounds)")
    parser.add_argument("--fedbuff-steps", type=int, default=1000,
                        help="FedBuff's (its fastest seat's: a seat steps 10 times per session "
                             "of |N(0, 1)| s, so FedBuff's steps cover less simulated time)")
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--world", default="duration=halfnormal:1:0",
                        help="the clients' world (FLSim's Sent140 timing by default)")
    parser.add_argument("--server", default=None,
                        help="comma-separated server link rates (the ablation); none: unlimited")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    a = parser.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    servers: list[str | None] = ([None] if a.server is None
                                 else [s.strip() for s in a.server.split(",")])
    rows = []
    for server in servers:
        for seed in seeds:
            for method in ("fedbuff", "fedavg"):
                row = measure(method, seed, a, server)
                rows.append(row)
                print(f"{server or 'unlimited'} seed {seed} {method}: "
                      f"T{100 * a.target:g} {row['time_to_target_s']:.1f} s, "
                      f"{row['samples_per_s']:.0f} samples/s", flush=True)
    report(rows, a.target)
    if a.json is not None:
        a.json.write_text(json.dumps(rows, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
