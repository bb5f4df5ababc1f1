"""Benchmark tasks: a model, its data and default hyperparameters, under a string id.

A task is what ``exogym run --task ID`` trains. The model is built after seeding, so the same seed
gives the same initial weights.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn
from torch.utils.data import Dataset

from exogym.config import ConfigError

__all__ = ["TASKS", "Task", "get_task"]

DataDir = str | os.PathLike[str] | None


@dataclass(frozen=True)
class Task:
    """A benchmark problem.

    Attributes:
        id: the registry id.
        description: one line for ``exogym tasks``.
        build_model: returns a fresh model following the ``model(batch) -> loss`` contract.
        load_data: ``(data_dir, download) -> (train, test)`` datasets.
        batch_size: default batch size per node.
        lr: default inner learning rate.
        eval_interval: default steps between evaluations.
    """

    id: str
    description: str
    build_model: Callable[[], nn.Module]
    load_data: Callable[[DataDir, bool], tuple[Dataset, Dataset]]
    batch_size: int = 64
    lr: float = 1e-3
    eval_interval: int = 100


def _mnist_model() -> nn.Module:
    from exogym.models import Classifier, MnistCNN

    return Classifier(MnistCNN())


def _mnist_data(data_dir: DataDir, download: bool) -> tuple[Dataset, Dataset]:
    from exogym.data.mnist import load_mnist

    return load_mnist(data_dir, download=download)


TASKS: dict[str, Task] = {
    "mnist": Task(
        id="mnist",
        description="MNIST digits, 2-layer CNN (215k parameters); eval: test loss and accuracy",
        build_model=_mnist_model,
        load_data=_mnist_data,
    ),
}


def get_task(task_id: str) -> Task:
    """The task registered under ``task_id``; an unknown id lists the known ones."""
    if task_id not in TASKS:
        close = difflib.get_close_matches(task_id, list(TASKS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown task {task_id!r}{hint}; available: {', '.join(TASKS)}")
    return TASKS[task_id]
