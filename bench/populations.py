"""Populations (issue 34): a round costs what its participants cost, measured.

Every case is one ``exogym run`` in a fresh process (:func:`paging.run_exogym`: its peak RSS,
``ru_maxrss`` of that child alone, and its summary and metrics rows). Cases compared for speed
alternate over ``--repeats`` rounds and the table shows medians; the samples/s are of the
training steps (``samples / train_time_s``).

Suites (``--suite``, several allowed):

- ``scale``: FedAvg, 10 clients per round, batch 8, H = 10, Dirichlet(0.5) MNIST, at N = 10,
  1,000 and 1,000,000 clients (seats, the default), and N = 1,000 with a row per client
  (``--clients-in-memory all``, the old way). Goals: N = 1,000,000 at >= 0.9x the samples/s of
  N = 10, and its peak RSS <= 1.2x N = 10's plus what the partition needs.
- ``keep``: FedAvg (AdamW clients) over 100,000 clients, 100 per round, ``--client-state
  fresh`` against ``keep`` (their AdamW moments stored: 1.7 MB a client). Goals: keep's peak
  RSS < 2 GB and >= 0.8x fresh's samples/s.
- ``world``: FedAvg over 1,000,000 clients, 10 reports a round, through a server
  (``home-100mbps``): plain, against the cross-device world (per-client phones
  ``phone-low=0.5,phone-mid=0.3,phone-high=0.2``, ``--round-policy
  over_selection=1.3,deadline=DEADLINE``, failures inside rounds ``mtbf=5s,mttr=5s``).
  Goal: the world at >= 0.9x the plain run's samples/s (computed samples: the world trains 13
  clients a round), no row per client.
- ``async``: over 100,000 clients with FedBuff's half-normal client durations
  (``speed=halfnormal:1:0``, 100 Mbit/s): FedBuff (K = 10) with 100 clients in flight against
  synchronous FedAvg with 100 clients per round, both H = 10; the simulated time at which each
  first reaches ``--target`` accuracy (evaluations every ``--eval-every`` steps).

    python bench/populations.py --suite scale --repeats 3
    python bench/populations.py --suite keep --rounds 20
    python bench/populations.py --suite async --steps 400
    python bench/populations.py --suite world --repeats 3

Never run it beside another benchmark (two cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paging import run_exogym


@dataclass(frozen=True)
class Case:
    suite: str
    name: str
    args: tuple[str, ...]


def _fedavg(nodes: int, per_round: int, steps: int, *more: str) -> tuple[str, ...]:
    return ("--task", "mnist", "--strategy", "fedavg", "--set", "H=10", "--nodes", str(nodes),
            "--participation", str(per_round), "--partition", "dirichlet:0.5",
            "--batch-size", "8", "--steps", str(steps), "--eval-samples", "1000",
            "--network", "datacenter", *more)


def suite_cases(suite: str, a: argparse.Namespace) -> list[Case]:
    if suite == "scale":
        steps = a.steps or 300
        return [Case(suite, "N=10", _fedavg(10, 10, steps)),
                Case(suite, "N=1,000", _fedavg(1000, 10, steps)),
                Case(suite, "N=1,000,000", _fedavg(1_000_000, 10, steps)),
                Case(suite, "N=1,000, a row per client",
                     _fedavg(1000, 10, steps, "--clients-in-memory", "all"))]
    if suite == "keep":
        steps = 10 * (a.rounds or 20)
        return [Case(suite, f"{state}, N=100,000, 100 per round",
                     _fedavg(100_000, 100, steps, "--client-state", state))
                for state in ("fresh", "keep")]
    if suite == "world":
        steps = a.steps or 300
        plain = (*_fedavg(1_000_000, 10, steps)[:-2], "--network", "home-100mbps")
        return [Case(suite, "N=1,000,000, plain", plain),
                Case(suite, "N=1,000,000, phones, over-selection, deadline, failures",
                     (*plain, "--hardware", "phone-low=0.5,phone-mid=0.3,phone-high=0.2",
                      "--round-policy", f"over_selection=1.3,deadline={a.deadline}",
                      "--world", "mtbf=5s,mttr=5s"))]
    if suite == "async":
        steps = a.steps or 400
        common = ("--task", "mnist", "--nodes", "100000", "--batch-size", "8", "--steps",
                  str(steps), "--network", "home-100mbps", "--world", "speed=halfnormal:1:0",
                  "--eval-interval", str(a.eval_every), "--eval-samples", "1000",
                  "--partition", "dirichlet:0.5")
        return [Case(suite, "fedbuff K=10, 100 in flight",
                     ("--strategy", "fedbuff", "--set", "H=10", "--set", "K=10",
                      "--concurrency", "100", *common)),
                Case(suite, "fedavg, 100 per round",
                     ("--strategy", "fedavg", "--set", "H=10", "--participation", "100",
                      *common))]
    raise ValueError(f"unknown suite {suite!r}; suites: scale, keep, world, async")


def measure(case: Case, target: float) -> dict[str, Any]:
    summary, rows, rss, wall = run_exogym(case.args)
    train = summary["train_time_s"]
    reached = next((r.get("sim_time_s") for r in rows
                    if r.get("eval_accuracy", 0.0) >= target), None)
    pop = summary.get("population") or {}
    return {"suite": case.suite, "case": case.name, "peak_rss_gb": rss,
            "samples_per_s": summary["samples"] / train, "train_time_s": train,
            "wall_s": wall, "accuracy": summary["final"].get("eval_accuracy"),
            "sim_time_s": summary.get("sim_time_s"), "time_to_target_s": reached,
            "store": pop.get("store"), "clients_trained": pop.get("clients_trained"),
            "seats": pop.get("per_round"), "late": pop.get("late"),
            "discarded": pop.get("discarded"), "dropouts": pop.get("dropouts")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="scale",
                        help="comma-separated: scale, keep, world, async")
    parser.add_argument("--repeats", type=int, default=1, help="rounds (cases alternate)")
    parser.add_argument("--steps", type=int, default=None, help="override the suite's steps")
    parser.add_argument("--rounds", type=int, default=None, help="keep: rounds of H = 10")
    parser.add_argument("--deadline", default="0.25s", help="world: the rounds' deadline")
    parser.add_argument("--target", type=float, default=0.9, help="async: accuracy target")
    parser.add_argument("--eval-every", type=int, default=20, help="async: steps")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    a = parser.parse_args()
    for name in ("repeats", "steps", "rounds", "eval_every"):
        value = getattr(a, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if not 0 < a.target <= 1:
        parser.error(f"--target must be an accuracy in (0, 1], got {a.target}")
    cases = [c for s in a.suite.split(",") for c in suite_cases(s.strip(), a)]
    got: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(a.repeats):
        for case in cases:
            row = measure(case, a.target)
            got.setdefault((case.suite, case.name), []).append(row)
            print(f"round {r + 1}: {case.suite:6s} {case.name:32s} RSS {row['peak_rss_gb']:.2f} "
                  f"GB  {row['samples_per_s']:8.0f} samples/s", flush=True)
    print(f"\n{platform.node()}, {os.cpu_count()} cores, python {platform.python_version()}; "
          f"medians of {a.repeats}")
    print("| suite | case | peak RSS (GB) | samples/s | vs first | accuracy | sim time | "
          f"sim time to {100 * a.target:g}% |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    first: dict[str, float] = {}
    table = []
    for (suite, name), rows in got.items():
        med = {k: statistics.median(g[k] for g in rows) for k in ("peak_rss_gb",
                                                                   "samples_per_s")}
        first.setdefault(suite, med["samples_per_s"])
        last = rows[-1]
        table.append({"suite": suite, "case": name, **med, "runs": rows})
        reach = last["time_to_target_s"]
        print(f"| {suite} | {name} | {med['peak_rss_gb']:.2f} | {med['samples_per_s']:,.0f} | "
              f"{med['samples_per_s'] / first[suite]:.2f}x | "
              f"{100 * (last['accuracy'] or 0):.2f}% | {last['sim_time_s'] or 0:,.1f} s | "
              f"{'not reached' if reach is None else f'{reach:,.1f} s'} |")
    if a.json is not None:
        a.json.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
