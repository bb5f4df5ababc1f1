#!/usr/bin/env python
"""torch's AdamW implementations over node-stacked parameters: the for-loop (torch's default on
a CPU), foreach and fused, ms per ``step()``.

For each model of ``bench/engines.py`` and each N: N replicas' parameters stacked as
``[N, *shape]`` tensors (as exogym's engine holds them), random gradients, 3 untimed steps,
then the mean of ``--steps`` timed steps; the implementations alternate per (model, N). Why:
``OptimSpec.build`` builds the fused kernel where torch has one
(docs/benchmarks/engines-cpu2-202611.md).

Usage::

    python bench/optimizers.py --models mnist_cnn,gpt,exo_cnn --nodes 2,8,64
"""

from __future__ import annotations

import argparse
import time

import torch
from engines import build  # bench/engines.py, beside this script

KINDS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def step_ms(params: list[torch.Tensor], kind: str, steps: int) -> float:
    opt = torch.optim.AdamW(params, lr=1e-3, **KINDS[kind])
    for _ in range(3):
        opt.step()
    start = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return (time.perf_counter() - start) / steps * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="mnist_cnn,gpt,exo_cnn")
    p.add_argument("--nodes", default="2,8,64")
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args(argv)
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} intra-op threads; AdamW "
          f"step() over stacked parameters, ms, mean of {args.steps} steps\n")
    print("| model | N | parameters | for-loop | foreach | fused | for-loop / fused |\n"
          "|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        shapes = [q.shape for q in build(model).parameters()]
        for n in (int(x) for x in args.nodes.split(",")):
            params = [torch.randn(n, *s, requires_grad=True) for s in shapes]
            for q in params:
                q.grad = torch.randn_like(q)
            ms = {kind: step_ms(params, kind, args.steps) for kind in KINDS}
            print(f"| {model} | {n} | {sum(q.numel() for q in params):,} | "
                  f"{ms['for-loop']:.2f} | {ms['foreach']:.2f} | {ms['fused']:.2f} | "
                  f"{ms['for-loop'] / ms['fused']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
