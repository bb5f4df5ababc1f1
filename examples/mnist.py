"""The original EXO Gym example: MNIST on 4 simulated nodes with five strategies.

Trains the MNIST CNN with DDP (EXO Gym's SimpleReduce), SPARTA, DiLoCo, FedAvg and DeMo from the
same seed and prints one line each: eval loss and accuracy, what each node sent, and the time
on a simulated network. ``python examples/mnist.py --steps 500``;
``exogym compare --task mnist`` does the same with plots and a results table.
"""

from __future__ import annotations

import argparse

import torch

from exogym import Trainer
from exogym.sim.network import format_duration
from exogym.strategy import make
from exogym.tasks import get_task

STRATEGIES = {"ddp": {}, "sparta": {}, "diloco": {"H": 100}, "fedavg": {"H": 100}, "demo": {}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--eval-samples", type=int, default=1000,
                   help="samples of each evaluation during training (the last is on the whole set)")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--network", default="home-100mbps")
    p.add_argument("--data-dir", default=None, help="a folder holding mnist/ (default: download)")
    args = p.parse_args(argv)
    task = get_task("mnist")
    train, test = task.load_data(args.data_dir, args.data_dir is None)
    for sid, settings in STRATEGIES.items():
        H = min(settings.get("H", 1), args.steps)  # a short run still synchronises
        torch.manual_seed(0)
        result = Trainer(task.build_model(), train, test).fit(
            strategy=make(sid, **({"H": H} if "H" in settings else {})), num_nodes=args.nodes,
            max_steps=args.steps, batch_size=task.batch_size, network=args.network,
            eval_samples=args.eval_samples, progress=False)
        assert result.clock is not None  # a network was given
        print(f"{sid:>7}: eval loss {result.final['eval_loss']:.4f}  accuracy "
              f"{result.final['eval_accuracy']:.2%}  sent/node "
              f"{max(result.bytes_sent) / 1e6:8.2f} MB  {args.network}: "
              f"{format_duration(result.clock.total_s)}")


if __name__ == "__main__":
    main()
