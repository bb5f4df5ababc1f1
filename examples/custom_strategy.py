"""Your own strategy in one file: local SGD whose averaging period grows (a worked example).

The idea (a stand-in for yours): early in training the nodes' models drift apart quickly and
should be averaged often; later they agree and can train alone for longer. So the first round
lasts ``H`` local steps and every round after it ``rho`` times longer than the one before (at most
``H_max``); at the end of each round every node's parameters become the nodes' mean, as FedAvg
does. ``docs/writing-a-strategy.md`` explains each part of this file.

Run it from the command line (any strategy id position accepts ``FILE.py:Class``)::

    exogym run --task mnist --strategy examples/custom_strategy.py:GrowingLocalSGD \\
        --set H=10 --set rho=2 --nodes 4 --steps 500
    exogym compare --task mnist --strategies fedavg,examples/custom_strategy.py:GrowingLocalSGD \\
        --set H=20 --nodes 4 --steps 500

or as a script: ``python examples/custom_strategy.py [--steps N]`` trains it next to FedAvg on
MNIST with the same seed and prints both results.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from exogym.strategy import StackedStrategy
from exogym.strategy.base import positive_int, restart_rows


@dataclass(kw_only=True)
class GrowingLocalSGD(StackedStrategy):
    """Local steps of the inner optimizer; the nodes' parameters averaged at the end of rounds
    of ``H, rho H, rho^2 H, ...`` steps (each rounded up, at most ``H_max``).

    Bytes per round and node: a ring all-reduce of the parameters and float buffers,
    ``2 (N-1)/N * (P + B)``; nothing in between.

    Absent nodes (a world): the mean is over the nodes whose parameters arrived, and only they
    adopt it; a node back up gets the last averaged model from a live peer.

    Attributes:
        H: steps of the first round.
        rho: each round is ``rho`` times the previous one (1: FedAvg with period ``H``).
        H_max: the longest round.
    """

    id = "growing_local_sgd"
    H: int = 10
    rho: float = 2.0
    H_max: int = 1000

    def __post_init__(self) -> None:
        super().__post_init__()  # the shared fields: optim, schedule, codec, deadline, ...
        positive_int("H", self.H)
        positive_int("H_max", self.H_max)
        if not (isinstance(self.rho, int | float) and math.isfinite(self.rho) and self.rho >= 1):
            raise ValueError(f"rho must be a finite number >= 1, got {self.rho!r}")
        if self.H_max < self.H:
            raise ValueError(f"H_max must be >= H={self.H}, got {self.H_max}")

    def init_state(self) -> None:
        # Everything set here is the run's state: saved in checkpoints and restored on resume.
        self.period = self.H
        self.next_sync = self.H  # the step count after which the current round ends
        self.averaged = {k: v.clone() for k, v in self.nodes.node_state(0).items()}

    @torch.no_grad()
    def step(self, step: int) -> None:
        self.inner_step()  # every node's own optimizer step on its own gradient
        if step + 1 == self.next_sync:
            self.average()
            self.period = min(math.ceil(self.period * self.rho), self.H_max)
            self.next_sync += self.period

    @torch.no_grad()
    def average(self) -> None:
        names = list(self.nodes.params) + list(self.nodes.float_buffers)
        tensors = list(self.nodes.params.values()) + list(self.nodes.float_buffers.values())
        members = self.arrivals()  # None: every node; else N booleans (whose message arrived)
        if members is None:
            self.comm.all_reduce_(tensors, "mean", tag="params")  # counts bytes and time
            means = [t[0] for t in tensors]
        elif any(members):
            means = list(self.comm.all_reduce(tensors, "mean", tag="params", members=members))
            keep = self.comm.local_rows(members, self.nodes.device)
            for t, mean in zip(tensors, means, strict=True):
                restart_rows(t, mean, keep)
        else:
            return  # nothing arrived: every node keeps its own parameters
        for name, mean in zip(names, means, strict=True):
            self.averaged[name].copy_(mean)
        self.copy_counters(self.averaged)

    def recover(self, node: int, donor: int) -> None:
        params = {k: self.averaged[k] for k in self.nodes.params}
        self.recover_from_global(node, donor, params, self.averaged)

    def global_state(self) -> dict[str, Tensor]:
        return {k: v.clone() for k, v in self.averaged.items()}


def main(argv: list[str] | None = None) -> None:
    from exogym import Trainer
    from exogym.strategy import make
    from exogym.tasks import get_task

    p = argparse.ArgumentParser(description="GrowingLocalSGD against FedAvg on MNIST")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-samples", type=int, default=1000,
                   help="samples of each evaluation during training (the last is on the whole set)")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)
    task = get_task("mnist")
    train, test = task.load_data(args.data_dir, args.data_dir is None)
    for strategy in (make("fedavg", H=20), GrowingLocalSGD(H=5, rho=2.0)):
        torch.manual_seed(0)
        result = Trainer(task.build_model(), train, test).fit(
            strategy=strategy, num_nodes=args.nodes, max_steps=args.steps,
            batch_size=task.batch_size, eval_samples=args.eval_samples, progress=False)
        print(f"{strategy.id:>18}: eval loss {result.final['eval_loss']:.4f}, accuracy "
              f"{result.final['eval_accuracy']:.2%}, sent per node "
              f"{max(result.bytes_sent) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
