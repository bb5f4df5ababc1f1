"""Two methods written for ONE node (EXO Gym's form), next to exogym's node-stacked ones.

``PerNodeDDP`` and ``PerNodeDiLoCo`` subclass the per-node base ``exogym.strategy.Strategy``
(EXO Gym's name; also ``exogym.strategy.PerNodeStrategy``) and are
torch.distributed-style code: ``self.model`` is this node's replica, the collectives of
:mod:`exogym.strategy.communicate` meet the other nodes'. ``exogym.Trainer.fit`` runs them on N
simulated nodes (or as real processes: under torchrun, or with ``fit_processes(...,
strategy=as_stacked(PerNodeDDP(spec)))``, ``exogym.run.launch``'s and
``exogym.strategy.per_node``'s);
they compute the same updates as exogym's ``ddp`` and ``diloco``
(``tests/compat/test_per_node.py``), and ``bench/per_node.py`` measures what the per-node form
costs.

Run ``python examples/per_node.py [--steps N]``: each per-node method beside its node-stacked
twin on MNIST, same seed; the final losses agree.

DiLoCo: Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language
Models": H inner steps, then the nodes' mean pseudo-gradient ``theta_global - theta_local``
steps an outer SGD with Nesterov momentum (lr 0.7, momentum 0.9) on the global copy, which every
node restarts from.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn

from exogym.strategy import Strategy
from exogym.strategy.communicate import ReduceOp, all_reduce
from exogym.strategy.optim import OptimSpec


class PerNodeDDP(Strategy):
    """Data parallelism for one node: average every gradient over the nodes, then step."""

    def __init__(self, optim_spec: OptimSpec) -> None:
        super().__init__()
        self.optim_spec = optim_spec

    def step(self) -> None:
        for p in self.model.parameters():
            all_reduce(p.grad, op=ReduceOp.AVG)
        self.optim.step()
        super().step()


class PerNodeDiLoCo(Strategy):
    """DiLoCo for one node (see the module docstring)."""

    def __init__(self, optim_spec: OptimSpec, H: int, outer_lr: float = 0.7) -> None:
        super().__init__()
        self.optim_spec, self.H, self.outer_lr = optim_spec, H, outer_lr

    def _init_node(self, model: nn.Module, rank: int, num_nodes: int) -> None:
        super()._init_node(model, rank, num_nodes)
        self.master = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
        self.outer = torch.optim.SGD(self.master, lr=self.outer_lr, momentum=0.9, nesterov=True)

    def step(self) -> None:
        self.optim.step()
        if (self.local_step + 1) % self.H == 0:
            with torch.no_grad():
                for m, p in zip(self.master, self.model.parameters(), strict=True):
                    delta = m.detach() - p.detach()
                    all_reduce(delta, op=ReduceOp.AVG)
                    m.grad = delta
                self.outer.step()
                for m, p in zip(self.master, self.model.parameters(), strict=True):
                    p.copy_(m)
        super().step()


def main(argv: list[str] | None = None) -> None:
    from exogym import Trainer
    from exogym.strategy import make
    from exogym.tasks import get_task

    p = argparse.ArgumentParser(description="per-node DDP and DiLoCo beside exogym's")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--eval-samples", type=int, default=1000)
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)
    task = get_task("mnist")
    train, test = task.load_data(args.data_dir, args.data_dir is None)
    spec = OptimSpec("adamw", lr=1e-3)
    H = max(args.steps // 5, 1)
    runs: list[tuple[str, Any]] = [("ddp", make("ddp", optim=spec)),
                                   ("PerNodeDDP", PerNodeDDP(spec)),
                                   ("diloco", make("diloco", H=H, optim=spec)),
                                   ("PerNodeDiLoCo", PerNodeDiLoCo(spec, H=H))]
    for name, strategy in runs:
        torch.manual_seed(0)
        r = Trainer(task.build_model(), train, test).fit(
            strategy=strategy, num_nodes=args.nodes, max_steps=args.steps, batch_size=64,
            eval_samples=args.eval_samples, progress=False, network=None)
        print(f"{name:>14}: loss {r.final['eval_loss']:.4f}, accuracy "
              f"{r.final['eval_accuracy']:.4f}, {r.samples / r.train_time_s:,.0f} samples/s")


if __name__ == "__main__":
    main()
