"""``DilocoSimulator``: the diloco-sim / first EXO Gym interface, over exogym's machinery.

>>> simulator = DilocoSimulator(model_cls=CNNModel, model_kwargs={...},
...                             optimizer_kwargs={"lr": 0.001}, num_nodes=2,
...                             train_dataset=train_ds, eval_dataset=test_ds,
...                             loss_fn=F.cross_entropy, num_epochs=10)
>>> result = simulator.train()

``model_cls(**model_kwargs)`` maps inputs to logits and the datasets yield ``(inputs, targets)``;
the model is wrapped in :class:`exogym.Classifier` with ``loss_fn``. Training runs
:class:`exogym.strategy.DiLoCo` through :class:`exogym.Trainer`. Arguments keep their diloco-sim
names and defaults (``diloco_interval`` is DiLoCo's H, 500; batch size 16 per node).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from exogym.run.output.result import FitResult
from exogym.strategy.optim import OPTIMIZERS, LRSchedule, OptimSpec
from exogym.tasks.models import Classifier

__all__ = ["DilocoSimulator"]


class DilocoSimulator:
    """DiLoCo on ``num_nodes`` simulated nodes, configured the diloco-sim way.

    Args:
        model_cls: the network's class, built as ``model_cls(**model_kwargs)``.
        model_kwargs: its keyword arguments.
        loss_fn: ``loss_fn(logits, targets) -> scalar``.
        train_dataset: the training set, of ``(inputs, targets)``.
        eval_dataset: the evaluation set, of ``(inputs, targets)``.
        optimizer_kwargs: the inner optimizer's arguments.
        optimizer_cls: the inner optimizer (AdamW, Adam or SGD).
        batch_size: per node.
        num_epochs: passes over each node's shard; ``max_local_step`` caps the steps instead.
        eval_interval: steps between evaluations of the global model.
        diloco_interval: H, inner steps per outer step.
        outer_optimizer_cls: the outer optimizer, SGD.
        outer_optimizer_kwargs: its ``lr``, ``momentum``, ``nesterov``.
        cosine_anneal: the inner learning rate decays on a cosine.
        warmup_steps: the inner learning rate's linear warm-up.
        max_norm: per-node gradient clipping.
        save_dir: where metrics are written (none if None).
        device: as in :meth:`exogym.Trainer.fit`.
        engine: as in :meth:`exogym.Trainer.fit`.
        seed: as in :meth:`exogym.Trainer.fit`.
    """

    def __init__(
        self,
        model_cls: type[nn.Module],
        model_kwargs: dict[str, Any],
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        train_dataset: Dataset,
        optimizer_kwargs: dict[str, Any],
        optimizer_cls: type[torch.optim.Optimizer] = torch.optim.AdamW,
        batch_size: int = 16,
        eval_dataset: Dataset | None = None,
        eval_interval: int = 1000,
        num_epochs: float = 1,
        cosine_anneal: bool = False,
        warmup_steps: int = 0,
        num_nodes: int = 4,
        diloco_interval: int = 500,
        outer_optimizer_cls: type[torch.optim.Optimizer] = torch.optim.SGD,
        outer_optimizer_kwargs: dict[str, Any] | None = None,
        max_local_step: int | None = None,
        max_norm: float | None = None,
        save_dir: str | Path | None = None,
        device: str = "auto",
        engine: str = "auto",
        seed: int = 0,
    ) -> None:
        from exogym.strategy.diloco import DiLoCo

        names = {cls: name for name, cls in OPTIMIZERS.items()}
        if optimizer_cls not in names:
            raise ValueError(
                f"optimizer_cls must be one of {[c.__name__ for c in names]}, "
                f"got {getattr(optimizer_cls, '__name__', optimizer_cls)}"
            )
        if outer_optimizer_cls is not torch.optim.SGD:
            raise ValueError(
                "outer_optimizer_cls must be torch.optim.SGD (DiLoCo's outer optimizer), got "
                f"{getattr(outer_optimizer_cls, '__name__', outer_optimizer_cls)}"
            )
        outer = {"lr": 0.7, "nesterov": True, "momentum": 0.9, **(outer_optimizer_kwargs or {})}
        unknown = set(outer) - {"lr", "nesterov", "momentum"}
        if unknown:
            raise ValueError(
                f"outer_optimizer_kwargs accepts lr, momentum, nesterov; got {sorted(unknown)}"
            )
        if not isinstance(outer["nesterov"], bool):
            raise ValueError(f"outer_optimizer_kwargs nesterov must be True or False, got "
                             f"{outer['nesterov']!r}")
        self.strategy = DiLoCo(
            H=diloco_interval,
            outer_lr=outer["lr"],
            outer_momentum=outer["momentum"],
            outer_optimizer="nesterov" if outer["nesterov"] else "sgd",
            optim=OptimSpec(name=names[optimizer_cls], **optimizer_kwargs),
            schedule=LRSchedule(warmup_steps=warmup_steps, cosine=cosine_anneal),
            max_grad_norm=max_norm,
        )
        self.model = Classifier(model_cls(**model_kwargs), loss_fn)
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.num_nodes, self.batch_size = num_nodes, batch_size
        self.num_epochs, self.max_local_step = num_epochs, max_local_step
        self.eval_interval, self.save_dir = eval_interval, save_dir
        self.device, self.engine, self.seed = device, engine, seed

    def train(self, progress: bool = True) -> FitResult:
        """Run the simulation; returns the :class:`exogym.FitResult`."""
        from exogym.run.trainer import Trainer

        trainer = Trainer(self.model, self.train_dataset, self.eval_dataset)
        steps = {"max_steps": self.max_local_step} if self.max_local_step else {
            "num_epochs": self.num_epochs}
        return trainer.fit(
            strategy=self.strategy, num_nodes=self.num_nodes, batch_size=self.batch_size,
            eval_interval=self.eval_interval, engine=self.engine,  # type: ignore[arg-type]
            device=self.device, seed=self.seed, out_dir=self.save_dir, progress=progress,
            **steps,
        )
