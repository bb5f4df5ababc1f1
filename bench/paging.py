"""Virtual nodes (issue 27): peak memory and samples/s of in-memory and paged runs, side by side.

Every case is one ``exogym run`` in a fresh process; its peak resident set (``ru_maxrss`` of that
child alone, from ``os.wait4``) and, from its ``summary.json``, the training samples per second
of wall time (``samples / train_time_s``), paging's share of that time (``paging.seconds``) and
the final accuracy. Cases that are compared for speed alternate over ``--repeats`` rounds (the
machine drifts over minutes); the table shows medians and each case's ratio to the first case of
its suite.

Suites (``--suite``, several allowed):

- ``speed``: DiLoCo H = 50, 64 nodes of the MNIST CNN at the task's batch (64), in memory and
  paged (``--resident 16``: host memory, disk); the goal is paged >= 0.9x the in-memory
  samples/s.
- ``memory``: DiLoCo (H = 10, batch 4) at N = 256 ... 2,048 in memory and at N = 256, 1,024
  and 4,096 with ``--resident 64 --offload disk``: peak RSS against N (8,192: ``n8192``).
- ``n8192``: the 8,192-node DiLoCo run of the goal (``--resident 64 --offload disk``, batch 4).
- ``gpt``: 256 nodes of the 10.8 M-parameter Shakespeare GPT (``shakespeare-char-gpt-small-v0``,
  batch 4), ``--resident 8 --offload disk``.
- ``clients``: FedAvg over 100 and 1,000 clients, 10 per round, Dirichlet(0.5), batch 8,
  paged (``--resident 16 --offload disk``) for a few rounds: peak RSS against the population.

    python bench/paging.py --suite speed --repeats 3
    python bench/paging.py --suite memory,n8192 --json paging.json

Never run it beside another benchmark (two cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Case:
    suite: str
    name: str
    nodes: int
    args: tuple[str, ...]


def _diloco(nodes: int, h: int, batch: int | None, steps: int) -> tuple[str, ...]:
    args = ("--task", "mnist", "--strategy", "diloco", "--set", f"H={h}", "--nodes", str(nodes),
            "--steps", str(steps), "--eval-samples", "1000", "--network", "datacenter")
    return args + (("--batch-size", str(batch)) if batch else ())


def suite_cases(suite: str, steps: int | None) -> list[Case]:
    paged = ("--resident", "64", "--offload", "disk")
    if suite == "speed":
        base = _diloco(64, 50, None, steps or 100)
        return [Case(suite, "in memory", 64, base),
                Case(suite, "resident 16, host", 64, (*base, "--resident", "16")),
                Case(suite, "resident 16, disk", 64, (*base, "--resident", "16", "--offload",
                                                            "disk"))]
    if suite == "memory":
        out = [Case(suite, "in memory", n, _diloco(n, 10, 4, steps or 20))
               for n in (256, 512, 1024, 2048)]
        return out + [Case(suite, "resident 64, disk", n, _diloco(n, 10, 4, steps or 20) + paged)
                      for n in (256, 1024, 4096)]
    if suite == "n8192":
        return [Case(suite, "resident 64, disk", 8192, _diloco(8192, 5, 4, steps or 10) + paged)]
    if suite == "gpt":
        return [Case(suite, "resident 8, disk", 256,
                     ("--task", "shakespeare-char-gpt-small-v0", "--strategy", "diloco",
                      "--set", "H=2", "--nodes", "256", "--steps", str(steps or 2),
                      "--batch-size", "4", "--eval-samples", "64", "--network", "datacenter",
                      "--resident", "8", "--offload", "disk"))]
    if suite == "clients":
        return [Case(suite, "resident 16, disk", n,
                     ("--task", "mnist", "--strategy", "fedavg", "--set", "H=10",
                      "--nodes", str(n), "--participation", "10", "--partition", "dirichlet:0.5",
                      "--batch-size", "8", "--steps", str(steps or 30), "--eval-samples", "1000",
                      "--network", "datacenter", "--resident", "16", "--offload", "disk"))
                for n in (100, 1000)]
    raise ValueError(f"unknown suite {suite!r}; suites: speed, memory, n8192, gpt, clients")


def run_exogym(args: tuple[str, ...]) -> tuple[dict[str, Any], list[dict[str, Any]], float,
                                               float]:
    """``exogym run ARGS`` in a fresh process: its ``summary.json``, its metrics rows, its peak
    RSS (GB, ``ru_maxrss`` of that child alone, from ``os.wait4``) and its wall time."""
    with tempfile.TemporaryDirectory(prefix="exogym-bench-") as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "exogym", "run", *args, "--out", str(out), "--no-progress"]
        log = Path(tmp) / "output.txt"  # a file, not a pipe: a full pipe would block the run
        t0 = time.perf_counter()
        with open(log, "wb") as sink:
            proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        text = log.read_text(errors="replace")
        if status != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{text[-2000:]}")
        summary = json.loads((out / "summary.json").read_text())
        rows = [json.loads(line) for line in
                (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return summary, rows, usage.ru_maxrss * 1024 / 1e9, wall


def run_once(case: Case) -> dict[str, Any]:
    """One case in a fresh process: its peak RSS and what its summary says."""
    summary, _, rss, wall = run_exogym(case.args)
    paging = summary.get("paging") or {}
    train = summary["train_time_s"]
    return {"suite": case.suite, "case": case.name, "nodes": case.nodes,
            "peak_rss_gb": rss,
            "samples_per_s": summary["samples"] / train, "train_time_s": train,
            "paging_share": paging.get("seconds", 0.0) / train,
            "paged_gb": (paging.get("bytes_read", 0) + paging.get("bytes_written", 0)) / 1e9,
            "accuracy": summary["final"].get("eval_accuracy"), "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="speed",
                        help="comma-separated: speed, memory, n8192, gpt, clients")
    parser.add_argument("--repeats", type=int, default=1, help="rounds (cases alternate)")
    parser.add_argument("--steps", type=int, default=None, help="override every case's steps")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args()
    if args.repeats < 1 or (args.steps is not None and args.steps < 1):
        parser.error(f"--repeats and --steps must be >= 1, got {args.repeats} and {args.steps}")
    cases = [c for s in args.suite.split(",") for c in suite_cases(s.strip(), args.steps)]
    rows: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in range(args.repeats):
        for case in cases:
            row = run_once(case)
            rows.setdefault((case.suite, case.name, case.nodes), []).append(row)
            print(f"round {r + 1}: {case.suite:8s} {case.name:20s} N={case.nodes:5d}  "
                  f"RSS {row['peak_rss_gb']:.2f} GB  {row['samples_per_s']:9.0f} samples/s  "
                  f"paging {100 * row['paging_share']:4.1f}%", flush=True)
    print(f"\n{platform.node()}, {os.cpu_count()} cores, python {platform.python_version()}; "
          f"medians of {args.repeats}")
    print("| suite | case | N | peak RSS (GB) | samples/s | vs first | paging share | "
          "paged (GB) | accuracy |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    first: dict[str, float] = {}
    table = []
    for (suite, name, n), got in rows.items():
        med = {k: statistics.median(g[k] for g in got)
               for k in ("peak_rss_gb", "samples_per_s", "paging_share", "paged_gb")}
        first.setdefault(suite, med["samples_per_s"])
        acc = got[-1]["accuracy"]
        table.append({"suite": suite, "case": name, "nodes": n, **med, "accuracy": acc,
                      "runs": got})
        print(f"| {suite} | {name} | {n:,} | {med['peak_rss_gb']:.2f} | "
              f"{med['samples_per_s']:,.0f} | {med['samples_per_s'] / first[suite]:.2f}x | "
              f"{100 * med['paging_share']:.1f}% | {med['paged_gb']:.1f} | "
              f"{'' if acc is None else f'{100 * acc:.2f}%'} |")
    if args.json is not None:
        args.json.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
