#!/usr/bin/env python
"""What the in-process all-reduce costs: rows added in node order, against ``mean(0)``.

Since issue 27 every in-process reduction adds the nodes' rows one after the other in node
order (:func:`exogym.sim.comm.accumulate_rows`), so that a paged run gets the in-memory run's
bits. This times ``InProcessCommunicator.all_reduce_`` of the MNIST CNN's node-stacked
parameter-shaped tensors (a DDP step's gradients) for each ``--nodes`` against two references
on the same tensors: the same order tensor by tensor (one ``add_`` per tensor and row, the
first version) and ``t.mean(0)`` per tensor (torch's own order, which depends on the row count,
the reduction before issue 27); the first column also pays the communicator's checks, byte
accounting and log record, the references do not. Each figure is the median of ``--repeats``
timed calls after warm-up, the three ways interleaved; the results of the first two are checked
equal bit for bit.

Usage::

    python bench/reduce_rows.py --nodes 4,16,64 --repeats 30
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from exogym.sim.comm import InProcessCommunicator
from exogym.tasks.registry import get_task


def per_tensor(tensors: list[torch.Tensor]) -> None:
    """The node-order mean tensor by tensor (the first version of the reduction)."""
    for t in tensors:
        acc = t[0].clone()
        for i in range(1, t.shape[0]):
            acc.add_(t[i])
        t.copy_((acc / t.shape[0]).unsqueeze(0).expand_as(t))


def torch_mean(tensors: list[torch.Tensor]) -> None:
    for t in tensors:
        t.copy_(t.mean(0, keepdim=True).expand_as(t))


def measure(n: int, shapes: list[torch.Size], repeats: int) -> dict[str, float]:
    """Median ms of each way's reduction of N fresh rows per tensor (copies made untimed)."""
    gen = torch.Generator().manual_seed(n)
    base = [torch.randn(n, *s, generator=gen) for s in shapes]
    comm = InProcessCommunicator(n)
    ways: dict[str, Callable[[list[torch.Tensor]], None]] = {
        "comm": lambda ts: comm.all_reduce_(ts, op="mean"), "loop": per_tensor,
        "mean": torch_mean}
    a_t, b_t = [t.clone() for t in base], [t.clone() for t in base]
    ways["comm"](a_t)
    per_tensor(b_t)
    if not all(torch.equal(x, y) for x, y in zip(a_t, b_t, strict=True)):
        raise SystemExit(f"N={n}: all_reduce_ and the tensor-by-tensor order differ")
    times: dict[str, list[float]] = {k: [] for k in ways}
    for k in range(3 + repeats):  # 3 warm-up rounds, then timed ones, the ways interleaved
        for name, fn in ways.items():
            ts = [t.clone() for t in base]
            start = time.perf_counter()
            fn(ts)
            if k >= 3:
                times[name].append(time.perf_counter() - start)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="4,16,64", help="N values (default 4,16,64)")
    p.add_argument("--repeats", type=int, default=30, help="timed calls per way (default 30)")
    a = p.parse_args()
    torch.set_num_threads(1)
    shapes = [q.shape for q in get_task("mnist").build_model().parameters()]
    print(f"MNIST CNN: {len(shapes)} tensors, {sum(s.numel() for s in shapes):,} parameters; "
          f"{torch.get_num_threads()} thread; median of {a.repeats} calls, ms")
    print("| N | all_reduce_ (foreach per row) | tensor by tensor | mean(0) |")
    print("|---|---|---|---|")
    for n in (int(v) for v in a.nodes.split(",")):
        med = measure(n, shapes, a.repeats)
        print(f"| {n} | {med['comm']:.2f} | {med['loop']:.2f} | {med['mean']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
