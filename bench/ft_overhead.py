"""What --ft costs without a failure: samples/s of the same run on real processes with and
without torchft (MNIST CNN, DDP and DiLoCo H = 50, 2 and 4 processes, one node each; DDP also
with 8 steps per quorum and commit, ``commit_every=8``).

Both sides train the same steps with the same seed; a side's samples/s is its training steps'
samples over their wall time (start-up, the Lighthouse and the first quorum excluded: the
process engine's ``train_time_s``; --ft's time from its first committed step to its last, on
replica 0, over the steps in between). Repeats are interleaved (plain, ft, plain, ft, ...);
medians are printed.

    EXOGYM_DATA_DIR=../shared/data python bench/ft_overhead.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from exogym.run.ft.launch import fit_ft
from exogym.run.launch import fit_processes
from exogym.strategy import make
from exogym.tasks import get_task

CONFIGS = {"ddp": {}, "diloco": {"H": 50}}
# (label, strategy id, steps per transaction)
RUNS = [("ddp", "ddp", 1), ("ddp K=8", "ddp", 8), ("diloco", "diloco", 1)]


def plain(task: object, train: object, sid: str, n: int, steps: int, batch: int) -> float:
    torch.manual_seed(0)
    result = fit_processes(task.build_model(), train, None, strategy=make(sid, **CONFIGS[sid]),
                           num_nodes=n, max_steps=steps, batch_size=batch, seed=0,
                           progress=False, threads=1)
    return result.samples_per_s


def ft(task: object, train: object, sid: str, n: int, steps: int, batch: int,
       commit_every: int) -> tuple[float, dict[str, float]]:
    """samples/s, and replica 0's milliseconds per step in each part of its loop (the
    ``seconds`` of summary.json: compute, quorum waited beyond the overlapped step, commit
    waited, state kept)."""
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        result = fit_ft(task.build_model(), train, make(sid, **CONFIGS[sid]), replicas=n,
                        max_steps=steps, batch_size=batch, out_dir=tmp, seed=0, spares=0,
                        commit_every=commit_every)
        rows = [json.loads(line) for line in
                (Path(tmp) / "replica0.rows.jsonl").read_text().splitlines()]
    seconds = rows[-1]["time_s"] - rows[0]["time_s"]
    parts = result.summary["seconds"][0]
    return (len(rows) - 1) * batch * n / seconds, {k: 1e3 * v / steps for k, v in parts.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32)
    a = p.parse_args()
    task = get_task("mnist-cnn-v0")
    train, _ = task.load_data(None, False)
    print(f"{'strategy':8s} {'procs':>5s} {'plain':>9s} {'--ft':>9s} {'ft/plain':>8s}")
    for label, sid, k in RUNS:
        for n in (2, 4):
            runs: dict[str, list[float]] = {"plain": [], "ft": []}
            parts: list[dict[str, float]] = []
            for _ in range(a.repeats):
                runs["plain"].append(plain(task, train, sid, n, a.steps, a.batch_size))
                rate, part = ft(task, train, sid, n, a.steps, a.batch_size, k)
                runs["ft"].append(rate)
                parts.append(part)
            m = {k: statistics.median(v) for k, v in runs.items()}
            print(f"{label:8s} {n:5d} {m['plain']:9.0f} {m['ft']:9.0f} "
                  f"{m['ft'] / m['plain']:8.2f}   (samples/s, medians of {a.repeats}; all: "
                  f"{[round(x) for x in runs['plain']]} {[round(x) for x in runs['ft']]})",
                  flush=True)
            print("         replica 0, ms per step (medians): " + ", ".join(
                f"{key} {statistics.median(p[key] for p in parts):.2f}"
                for key in sorted(parts[0])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
