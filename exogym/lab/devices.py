"""A registered task's training step, counted (:mod:`exogym.sim.flops`): what ``exogym devices
--task`` prices on each device and ``exogym estimate --task`` takes as its compute, the same
count a run of the task prices (its model, its first batch, its inner optimizer)."""

from __future__ import annotations

from pathlib import Path

from exogym.sim.engine import Precision
from exogym.sim.flops import StepCount, count_step
from exogym.sim.sharding import NodeBatches
from exogym.strategy import make
from exogym.tasks import get_task

__all__ = ["task_step"]


def task_step(task_id: str, *, batch_size: int | None = None, strategy: str = "ddp",
              precision: Precision = "fp32", data_dir: str | Path | None = None,
              download: bool = True) -> tuple[StepCount, int]:
    """One node's training step of ``task_id``'s model at ``batch_size`` (default: the
    task's), with ``strategy``'s inner optimizer at the task's learning rate, counted as a run
    counts it (the first batch of node 0 of ``N = 1``); and the model's parameter count."""
    task = get_task(task_id)
    size = batch_size or task.batch_size
    train, _ = task.load_data(data_dir, download)
    model = task.build_model()
    optim = make(strategy).optim  # its learning rate changes no count
    batch = NodeBatches(train, 1, size, seed=0).peek(0)
    count = count_step(model, batch, optim, precision=precision)
    return count, sum(p.numel() for p in model.parameters())
