"""What a checkpoint costs the training loop: synchronous vs asynchronous writing.

Trains the same run three ways, interleaved (``none``, ``sync``, ``async``, then again, ...),
with a checkpoint every K steps in the last two, and prints per mode the median over repeats of

- the wall time of the training loop (from the first step to the end of the last one; data
  loading, evaluation and the final summary excluded),
- the time the loop is blocked inside ``Checkpointer.save`` (sync: the whole write; async: the
  copy to host memory),
- the extra time per checkpoint: (loop time - loop time without checkpoints) / checkpoints,
  which for ``async`` includes the background write's competition for the CPU,

and the checkpoint's size on disk. Default: the Shakespeare GPT small task (10.8M parameters) on
8 nodes, batch 4 per node (so that a step takes seconds, not minutes, on a CPU)::

    python bench/checkpoint_overhead.py                       # ~10 minutes on 2 cores
    python bench/checkpoint_overhead.py --task shakespeare-char-gpt-v0 --batch-size 16

Do not time anything else on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from exogym import Trainer
from exogym.run.output import checkpoint as checkpoint_module
from exogym.strategy import make
from exogym.tasks import get_task

MODES = ("none", "sync", "async")


class _StepTimes:
    """A sink that keeps each row's wall clock (log_interval=1: every step)."""

    def __init__(self) -> None:
        self.wall: dict[int, float] = {}

    def start(self, config: dict[str, Any], run_dir: Path | None) -> None: ...

    def log(self, row: dict[str, Any]) -> None:
        self.wall[row["step"]] = row["wall_s"]

    def finish(self, summary: dict[str, Any] | None) -> None: ...


def _run(task: Any, train: Any, val: Any, mode: str, args: argparse.Namespace,
         out: Path) -> dict[str, float]:
    blocked: list[float] = []
    save = checkpoint_module.Checkpointer.save

    def timed_save(self: Any, *a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return save(self, *a, **k)
        finally:
            blocked.append(time.perf_counter() - t0)

    checkpoint_module.Checkpointer.save = timed_save  # type: ignore[method-assign]
    try:
        torch.manual_seed(0)
        steps = _StepTimes()
        Trainer(task.build_model(), train, val).fit(
            strategy=make("diloco", H=args.steps), num_nodes=args.nodes, max_steps=args.steps,
            batch_size=args.batch_size, log_interval=1, eval_interval=10**9, network=None,
            progress=False, out_dir=out, sinks=[steps], eval_samples=64,
            checkpoint_every=None if mode == "none" else args.every,
            async_checkpoint=mode == "async", keep_checkpoints=1)
    finally:
        checkpoint_module.Checkpointer.save = save  # type: ignore[method-assign]
    size = sum(f.stat().st_size for f in (out / "checkpoints").rglob("*") if f.is_file()) \
        if (out / "checkpoints").exists() else 0
    first = min(steps.wall)
    return {"loop_s": steps.wall[args.steps] - steps.wall[first] + 0.0,
            "blocked_s": sum(blocked), "checkpoints": len(blocked), "size": size}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="shakespeare-char-gpt-small-v0")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=13, help="steps per run (the first is warm-up)")
    p.add_argument("--every", type=int, default=4, help="steps between checkpoints")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)
    task = get_task(args.task)
    train, val = task.load_data(args.data_dir, False)
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="exogym-ckpt-bench-") as tmp:
        for r in range(args.repeats):
            for mode in MODES:
                out = Path(tmp) / f"{mode}-{r}"
                results[mode].append(_run(task, train, val, mode, args, out))
                print(f"repeat {r} {mode:>5}: {results[mode][-1]}", file=sys.stderr, flush=True)
    base = statistics.median(x["loop_s"] for x in results["none"])
    n_ck = results["sync"][0]["checkpoints"]
    print(f"{args.task}, {args.nodes} nodes, batch {args.batch_size}/node, {args.steps} steps "
          f"(loop timed from step 1), a checkpoint every {args.every} steps ({n_ck} per run, "
          f"{results['sync'][0]['size'] / 1e6:,.0f} MB each), {args.repeats} interleaved "
          f"repeats, medians; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'mode':<6} {'loop':>9} {'per step':>9} {'blocked/ckpt':>13} {'extra/ckpt':>11}")
    for mode in MODES:
        loop = statistics.median(x["loop_s"] for x in results[mode])
        blocked = statistics.median(x["blocked_s"] for x in results[mode])
        per_step = loop / (args.steps - 1)
        if mode == "none":
            print(f"{mode:<6} {loop:8.2f}s {per_step:8.3f}s {'-':>13} {'-':>11}")
            continue
        print(f"{mode:<6} {loop:8.2f}s {per_step:8.3f}s {blocked / n_ck:12.3f}s "
              f"{(loop - base) / n_ck:10.3f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
