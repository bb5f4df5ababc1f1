#!/usr/bin/env python
"""The price of a per-node strategy: samples/s of the same method written per node and
node-stacked, side by side, on the MNIST CNN.

For every N in ``--nodes``, each method is trained by ``Trainer.fit`` in both forms from the same
seed on the same data (real MNIST training images when found, else ``--synthetic`` tensors of
the same shapes), batch ``--batch-size`` per node, no evaluation, no simulated network:

- **DDP**: exogym's ``ddp`` against ``examples/per_node.py``'s ``PerNodeDDP``
  (``all_reduce(grad, op=AVG)`` of every parameter's gradient, then the optimizer step: EXO
  Gym's ``SimpleReduceStrategy`` written out);
- **DiLoCo**: exogym's ``diloco`` (H = ``--H``) against its ``PerNodeDiLoCo`` (the outer
  Nesterov step on a master copy every H steps).

Samples/s = ``N * batch * (steps - warmup) / seconds`` between the rows logged after ``--warmup``
steps and after the last step (the rows' ``wall_s``). Repeats alternate the forms (stacked,
per-node; then per-node, stacked; ...), one run at a time; the table gives the medians and the
ratio per-node / stacked. The two forms' final global models are compared (they must agree to
1e-4: the same method; ``--H`` divides ``--steps``, so DiLoCo ends on an outer step).

Usage::

    python bench/per_node.py --nodes 4,16,64 --steps 12 --warmup 4 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

from exogym import Classifier, MnistCNN, Trainer
from exogym.strategy.ddp import DDP
from exogym.strategy.diloco import DiLoCo
from exogym.strategy.optim import OptimSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from per_node import PerNodeDDP, PerNodeDiLoCo  # examples/per_node.py

LR = 1e-3


def _data(args: argparse.Namespace) -> Any:
    if not args.synthetic:
        from exogym.tasks.data.download import DatasetNotFoundError
        from exogym.tasks.data.mnist import MNIST

        try:
            return MNIST(args.data_dir, train=True, download=False)
        except DatasetNotFoundError as err:
            print(f"MNIST not found ({err}); using random tensors", file=sys.stderr)
    need = max(args.nodes) * args.batch_size * args.steps
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(need, 1, 28, 28, generator=g),
                         torch.randint(0, 10, (need,), generator=g))


def _run(strategy: Any, data: Any, n: int, args: argparse.Namespace
         ) -> tuple[float, list[torch.Tensor]]:
    torch.manual_seed(0)
    trainer = Trainer(Classifier(MnistCNN()), data)
    trainer.fit(strategy=strategy, num_nodes=n, max_steps=args.steps,
                batch_size=args.batch_size, log_interval=args.warmup, network=None,
                progress=False, seed=0, allow_unsynced=True)
    r = trainer.result
    assert r is not None
    rows = {row["step"]: row["wall_s"] for row in r.history}
    seconds = rows[args.steps] - rows[args.warmup]
    samples = n * args.batch_size * (args.steps - args.warmup)
    return samples / seconds, [t.detach().clone() for t in r.model.state_dict().values()]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="4,16,64")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="per node (default: 32)")
    p.add_argument("--H", type=int, default=4, help="DiLoCo's H; divides --steps (default: 4)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--synthetic", action="store_true")
    args = p.parse_args(argv)
    args.nodes = [int(x) for x in args.nodes.split(",")]
    if not 0 < args.warmup < args.steps or args.steps % args.warmup:
        p.error("--warmup must be > 0, below --steps, and divide it (the rows are logged every "
                "--warmup steps)")
    if args.steps % args.H:
        p.error("--H must divide --steps (the forms' global models are compared after the last "
                "outer step)")
    data = _data(args)
    spec = OptimSpec("adamw", lr=LR)
    methods = {"DDP": (lambda: DDP(optim=spec), lambda: PerNodeDDP(spec)),
               "DiLoCo": (lambda: DiLoCo(H=args.H, optim=spec),
                          lambda: PerNodeDiLoCo(spec, H=args.H))}
    print(f"# torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores, "
          f"{torch.get_num_threads()} intra-op threads; MNIST CNN, batch {args.batch_size} per "
          f"node, {args.steps} steps ({args.warmup} untimed), medians of {args.repeats}")
    print("| method | N | node-stacked samples/s | per-node samples/s | per-node / stacked |")
    print("|---|---|---|---|---|")
    for n in args.nodes:
        for name, (stacked, per_node) in methods.items():
            rates: dict[str, list[float]] = {"stacked": [], "per-node": []}
            finals: dict[str, list[torch.Tensor]] = {}
            for rep in range(args.repeats):
                order = [("stacked", stacked), ("per-node", per_node)]
                for form, make in (order if rep % 2 == 0 else order[::-1]):
                    rate, finals[form] = _run(make(), data, n, args)
                    rates[form].append(rate)
            for a, b in zip(finals["stacked"], finals["per-node"], strict=True):
                if a.is_floating_point() and not torch.allclose(a, b, rtol=0, atol=1e-4):
                    raise AssertionError(f"{name} N={n}: the two forms' parameters differ by "
                                         f"{(a - b).abs().max().item():.2e}")
            s, q = statistics.median(rates["stacked"]), statistics.median(rates["per-node"])
            print(f"| {name} | {n} | {s:,.0f} | {q:,.0f} | {q / s:.2f} |", flush=True)


if __name__ == "__main__":
    main()
