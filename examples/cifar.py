"""The EXO Gym post's CIFAR-10 experiment: one node against two nodes with DiLoCo.

Trains the CIFAR-10 CNN on one node (AdamW) and on two nodes with DiLoCo, the same number of
steps per node from the same seed, and prints the test loss and accuracy of each; the post found
that the two-node DiLoCo run, seeing twice the data, ends ahead. ``python examples/cifar.py
--steps 2000``; ``docs/benchmarks/exo-gym-post-cpu2-202611.md`` has a full-length run.
"""

from __future__ import annotations

import argparse

import torch

from exogym import Trainer
from exogym.strategy import make
from exogym.tasks import get_task


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--eval-samples", type=int, default=1000,
                   help="samples of each evaluation during training (the last is on the whole set)")
    p.add_argument("--H", type=int, default=100, help="DiLoCo's inner steps per outer step")
    p.add_argument("--data-dir", default=None, help="a folder holding cifar10/ "
                                                     "(default: download)")
    args = p.parse_args(argv)
    task = get_task("cifar10-cnn-v0")
    train, test = task.load_data(args.data_dir, args.data_dir is None)
    for name, strategy, nodes in (("1 node, AdamW", make("ddp"), 1),
                                  (f"2 nodes, DiLoCo H={args.H}", make("diloco", H=args.H), 2)):
        torch.manual_seed(0)
        result = Trainer(task.build_model(), train, test).fit(
            strategy=strategy, num_nodes=nodes, max_steps=args.steps,
            batch_size=task.batch_size, eval_samples=args.eval_samples, progress=False)
        print(f"{name:>20}: test loss {result.final['eval_loss']:.4f}  accuracy "
              f"{result.final['eval_accuracy']:.2%}  ({result.eval_set})")


if __name__ == "__main__":
    main()
