"""The original EXO Gym example: a character-level GPT on Tiny Shakespeare, DiLoCo over nodes.

Trains ``shakespeare-char-gpt-v0`` (4 layers x 128) with DiLoCo on 4 simulated nodes against
AdamW on one node, the same number of steps from the same seed, writes both runs to ``--out``
and prints their validation loss and a sample of the DiLoCo model's text.
``python examples/nanogpt.py --steps 1000``; the larger nanoGPT "baby GPT" is
``--task shakespeare-char-gpt-small-v0``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from exogym import Trainer
from exogym.lab.sample import sample
from exogym.strategy import make
from exogym.tasks import get_task


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="shakespeare-char-gpt-v0")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--eval-samples", type=int, default=2000,
                   help="samples of each evaluation during training (the last is on the whole set)")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--H", type=int, default=50, help="DiLoCo's inner steps per outer step")
    p.add_argument("--out", type=Path, default=Path("runs/nanogpt-example"))
    p.add_argument("--data-dir", default=None, help="a folder holding tinyshakespeare/ "
                                                     "(default: download)")
    args = p.parse_args(argv)
    task = get_task(args.task)
    train, val = task.load_data(args.data_dir, args.data_dir is None)
    runs = {"adamw, 1 node": (make("ddp"), 1),
            f"diloco H={args.H}, {args.nodes} nodes": (make("diloco", H=args.H), args.nodes)}
    for i, (name, (strategy, nodes)) in enumerate(runs.items()):
        torch.manual_seed(0)
        result = Trainer(task.build_model(), train, val).fit(
            strategy=strategy, num_nodes=nodes, max_steps=args.steps,
            batch_size=task.batch_size, eval_samples=args.eval_samples, progress=False,
            out_dir=args.out / f"run{i}", run_info=task.run_info(train))
        print(f"{name:>24}: val loss {result.final['eval_loss']:.4f}  perplexity "
              f"{result.final['eval_perplexity']:.2f}")
    text = sample(args.out / "run1", prompt="ROMEO:", max_new_tokens=200,
                  data_dir=args.data_dir, download=args.data_dir is None)
    print(text)


if __name__ == "__main__":
    main()
