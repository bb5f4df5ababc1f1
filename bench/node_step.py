#!/usr/bin/env python
"""One node's forward and backward in the engine against the model called plainly.

The federated workload's step is its clients' forward and backward at a small batch (8), so the
engine's per-node cost beside the model's own is the gap to a plain loop. Side by side in one
process, one intra-op thread (a node of the threads engine computes on one), the same batch:

- ``plain``: ONE ``nn.Module``, ``loss = model(batch); loss.backward()`` (its gradients
  accumulate in its own ``.grad``, zeroed between steps as an optimizer loop does);
- ``engine``: ``NodeStack(model, 1, engine="loop").forward_backward(batch)``, the loop engine's
  whole node step (the node's views bound into the template, :mod:`exogym.sim.binding`, the
  gradient accumulated straight into the stacked row, the loss stacked), then ``zero_grad``;
- ``threads``: the same with ``engine="threads"`` (one worker thread: the hand-over to it, the
  node's own random generator, :class:`exogym.sim.threads.NodeRandomness`, around the forward);
- ``functional_call``: the loop's node step as it was before the binding (the same views through
  ``torch.func.functional_call``, tie-weight pass off as the engine had it), for the record.

Each of ``--repeats`` rounds times ``--steps`` steps of every side, in an order reversed every
other round; the table gives the median ms per step and its ratio to ``plain``: the median over
rounds of the per-round ratio, with a bootstrap 95% interval of that median. Short rounds (20
steps, about 70 ms a side on the CNN) compare sides in the same fraction of a second: this
machine's speed drifts by several percent within seconds, more than the engine's per-node cost
at batch 8. Models: ``mnist_cnn`` (exogym's MnistCNN, the FL workload's), ``exo_cnn``, ``gpt``
(bench/engines.py's). Data: random tensors of the model's shapes.

Usage::

    python bench/node_step.py --models mnist_cnn,gpt --batch 8
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.func import functional_call

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engines import build, dataset

from exogym.lab.claims.stats import bootstrap_ci
from exogym.sim.engine import NodeStack, loss_of

SIDES = ("plain", "engine", "threads", "functional_call")


def sides(model_name: str, batch: int) -> dict[str, Callable[[], None]]:
    """Each side's one step (forward, backward, gradients zeroed), on one fixed batch."""
    torch.manual_seed(0)
    model = build(model_name).train()
    x, y = dataset(model_name, batch).tensors
    nodes = NodeStack(model, 1, engine="loop")
    threaded = NodeStack(model, 1, engine="threads")
    stacked = (x.unsqueeze(0), y.unsqueeze(0))
    params = list(model.parameters())

    def plain() -> None:
        loss_of(model((x, y))).backward()
        for p in params:
            p.grad = None

    def engine() -> None:
        nodes.forward_backward(stacked)
        nodes.zero_grad()

    def threads() -> None:
        with threaded.stepping():
            threaded.forward_backward(stacked)
            threaded.zero_grad()

    def functional() -> None:
        state = (nodes._node_params[0], nodes._node_buffers[0])
        loss_of(functional_call(nodes.module, state, ((x, y),), tie_weights=False)).backward()
        nodes.zero_grad()

    return {"plain": plain, "engine": engine, "threads": threads, "functional_call": functional}


def timed(step: Callable[[], None], steps: int) -> float:
    """Seconds per step over ``steps`` steps."""
    t = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t) / steps


def measure(model_name: str, batch: int, steps: int, repeats: int) -> dict[str, Any]:
    fns = sides(model_name, batch)
    for fn in fns.values():  # warm-up: allocator, first-call caches
        timed(fn, max(steps // 5, 5))
    per: dict[str, list[float]] = {s: [] for s in SIDES}
    for r in range(repeats):
        for s in (SIDES if r % 2 == 0 else SIDES[::-1]):
            per[s].append(timed(fns[s], steps))
    ratios = {s: [a / b for a, b in zip(per[s], per["plain"], strict=True)] for s in SIDES}
    return {"model": model_name, "batch": batch, "steps": steps, "repeats": repeats,
            "ms": {s: 1e3 * statistics.median(v) for s, v in per.items()},
            "ratio": {s: statistics.median(r) for s, r in ratios.items()},
            "ratio_ci": {s: bootstrap_ci(r, statistic="median") for s, r in ratios.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="mnist_cnn",
                   help="comma-separated: mnist_cnn, exo_cnn, gpt (default: mnist_cnn)")
    p.add_argument("--batch", type=int, default=8, help="rows per step (default: 8)")
    p.add_argument("--steps", type=int, default=20,
                   help="steps per side in a round (default: 20)")
    p.add_argument("--repeats", type=int, default=61, help="timed rounds (default: 61)")
    p.add_argument("--json", type=Path, help="also write the results here")
    a = p.parse_args()
    if a.batch < 1 or a.steps < 1 or a.repeats < 1:
        p.error(f"--batch, --steps and --repeats must be >= 1, got {a.batch}, {a.steps}, "
                f"{a.repeats}")
    torch.set_num_threads(1)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"1 intra-op thread, batch {a.batch}, {a.repeats} rounds of {a.steps} steps")
    print("| model | plain ms | loop engine ms | loop / plain [95%] | threads engine ms | "
          "threads / plain [95%] | functional_call ms | functional_call / plain [95%] |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    results = []
    for name in a.models.split(","):
        r = measure(name, a.batch, a.steps, a.repeats)
        results.append(r)
        ms = r["ms"]

        def ratio(side: str, r: dict[str, Any] = r) -> str:
            low, high = r["ratio_ci"][side]
            return f"{r['ratio'][side]:.3f}x [{low:.3f}, {high:.3f}]"

        print(f"| {name} | {ms['plain']:.3f} | {ms['engine']:.3f} | {ratio('engine')} | "
              f"{ms['threads']:.3f} | {ratio('threads')} | "
              f"{ms['functional_call']:.3f} | {ratio('functional_call')} |", flush=True)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
