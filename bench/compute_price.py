"""Does a simulated node's compute depend on how exogym runs it? The same training priced several
ways, side by side.

One training run (the MNIST CNN, DiLoCo H = 50, 4 nodes, batch 64, ``--steps`` steps on the
data-centre network) is run as ``exogym run`` in a fresh process for each way of running it: the
threads engine, the loop engine, a process per node (``--engine process``), each on an idle
machine and again while ``--hogs`` busy-looping processes compete for the cores; and a run whose
world steers it by simulated time (``drop=0.01``: ``c`` priced before the run from timed training
steps), idle and loaded. Each prints the simulated compute per step per node the clock used
(``step_time_s`` in summary.json) and the real wall time per step; the ratio to the first row
(threads, idle) is what must stay within 10%. Ways and loads alternate over ``--repeats`` rounds
(the machine drifts over minutes); the table shows medians.

    python bench/compute_price.py --steps 60 --repeats 3

Never run it beside another benchmark: the loaded rows bring their own load.
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

HOG = "import time\nwhile True:\n    pass\n"


@dataclass(frozen=True)
class Way:
    name: str
    args: tuple[str, ...]
    hogs: bool


def ways(hogs: int) -> list[Way]:
    steered = ("--world", "drop=0.01,seed=1")
    out = []
    for load in (False, True) if hogs else (False,):
        out += [Way("threads engine", ("--engine", "threads"), load),
                Way("loop engine", ("--engine", "loop"), load),
                Way("process per node", ("--engine", "process"), load),
                Way("threads, steered (priced before)", ("--engine", "threads", *steered),
                    load)]
    return out


def run_once(way: Way, steps: int, hogs: int, data_dir: str | None) -> tuple[float, float]:
    """``(simulated compute per step per node, real wall seconds per step)`` of one run."""
    with tempfile.TemporaryDirectory(prefix="exogym-price-") as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "exogym", "run", "--task", "mnist", "--strategy", "diloco",
               "--set", "H=50", "--nodes", "4", "--steps", str(steps), "--eval-samples", "200",
               "--eval-interval", str(steps), "--allow-unsynced", "--no-progress",
               "--out", str(out), *way.args]
        if data_dir:
            cmd += ["--data-dir", data_dir]
        procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(hogs * way.hogs)]
        try:
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=1800)
        finally:
            for p in procs:
                p.kill()
                p.wait()
        summary = json.loads((out / "summary.json").read_text())
        return float(summary["step_time_s"]), float(summary["train_time_s"]) / steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hogs", type=int, default=2,
                    help="busy-looping processes in the loaded rows (0: no loaded rows)")
    ap.add_argument("--data-dir", default=os.environ.get("EXOGYM_DATA_DIR"))
    args = ap.parse_args(argv)
    table = ways(args.hogs)
    seen: dict[Way, list[tuple[float, float]]] = {w: [] for w in table}
    for r in range(args.repeats):
        for way in table if r % 2 == 0 else reversed(table):
            seen[way].append(run_once(way, args.steps, args.hogs, args.data_dir))
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}, {time.strftime('%Y-%m-%d')}; medians of "
          f"{args.repeats}; MNIST CNN, DiLoCo H=50, 4 nodes, {args.steps} steps")
    print("| way | load | compute per step per node (clock) | ratio | real wall per step |")
    print("|---|---|---|---|---|")
    base = statistics.median(c for c, _ in seen[table[0]])
    for way in table:
        c = statistics.median(v for v, _ in seen[way])
        w = statistics.median(v for _, v in seen[way])
        load = f"{args.hogs} busy processes" if way.hogs else "idle"
        print(f"| {way.name} | {load} | {1e3 * c:.2f} ms | {c / base:.2f} | {1e3 * w:.1f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
