#!/usr/bin/env python
"""The README's main job twice on one machine, once idle and once beside busy processes: is
every simulated-time figure the same? (docs/devices.md; issue 43's goal.)

    python bench/sim_time_under_load.py                 # the main job, about 7 minutes on 2 cores
    python bench/sim_time_under_load.py --steps 100     # shorter
    python bench/sim_time_under_load.py --compute measured   # the host's measurement, for contrast

Each run is ``exogym compare --task mnist --strategies ddp,fedavg,diloco,sparta,demo --network
home-100mbps`` in a fresh process; the loaded one runs with ``--busy`` processes spinning on the
cores beside it (pure Python loops: they take CPU time, not memory). Compared per strategy, from
each run's ``summary.json``: ``sim_time_s``, ``sim_compute_s``, ``sim_comm_s``, ``sim_idle_s``,
``utilization``, ``step_time_s`` and the simulated time to the target loss; the wall time beside
them shows the load was there.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FIGURES = ("sim_time_s", "sim_compute_s", "sim_comm_s", "sim_idle_s", "utilization",
           "step_time_s")


def _spin(stop: Any) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def compare(out: Path, steps: int, compute: str) -> tuple[dict[str, dict[str, Any]], float]:
    """One comparison in a fresh process: each strategy's simulated figures, and the wall time."""
    cmd = [sys.executable, "-m", "exogym", "compare", "--task", "mnist", "--strategies",
           "ddp,fedavg,diloco,sparta,demo", "--network", "home-100mbps", "--steps", str(steps),
           "--no-progress", "--compute", compute, "--out", str(out)]
    began = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - began
    results = json.loads((out / "results.json").read_text())
    figures: dict[str, dict[str, Any]] = {}
    for row in results["rows"]:
        run = row["runs"][0]
        summary = json.loads((Path(run["out_dir"]) / "summary.json").read_text())
        figures[row["label"]] = {**{k: summary[k] for k in FIGURES},
                                 "sim_time_to_target_s": run["sim_time_to_target_s"]}
    return figures, wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=500, help="steps of every run (default 500)")
    p.add_argument("--busy", type=int, default=2, help="busy processes beside the loaded run")
    p.add_argument("--compute", choices=("profile", "measured"), default="profile")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="exogym-load-"))
    idle, idle_wall = compare(work / "idle", args.steps, args.compute)
    stop = multiprocessing.Event()
    busy = [multiprocessing.Process(target=_spin, args=(stop,)) for _ in range(args.busy)]
    for proc in busy:
        proc.start()
    try:
        loaded, loaded_wall = compare(work / "loaded", args.steps, args.compute)
    finally:
        stop.set()
        for proc in busy:
            proc.join()
    print(f"exogym compare, mnist, 5 strategies, {args.steps} steps, home-100mbps, "
          f"--compute {args.compute}: idle {idle_wall:.0f} s of wall time, beside "
          f"{args.busy} busy processes {loaded_wall:.0f} s\n")
    print("| strategy | figure | idle | loaded | equal |")
    print("|---|---|---|---|---|")
    same = True
    for label, figures in idle.items():
        for key, value in figures.items():
            other = loaded[label][key]
            equal = value == other
            same &= equal
            print(f"| {label} | {key} | {value!r} | {other!r} | {'yes' if equal else 'NO'} |")
    print(f"\nevery simulated figure equal: {'yes' if same else 'no'}")


if __name__ == "__main__":
    main()
