"""Benchmark tasks: a model, its data and default hyperparameters, under a versioned string id.

A task is what ``exogym run --task ID`` trains. The model is built after seeding, so the same seed
gives the same initial weights. Ids carry a version suffix (``-v0``): a change to a task's model,
data or defaults that changes its numbers gets a new version instead of silently changing results.

- ``mnist-cnn-v0`` (alias ``mnist``): MNIST digits, :class:`~exogym.tasks.models.MnistCNN`;
- ``cifar10-cnn-v0``: CIFAR-10 images, :class:`CifarCNN`; the test dataset's ``test_set``
  attribute says which test file was used (the full ``test_batch.bin`` or the first 1,000 images);
- ``shakespeare-char-gpt-v0``: Tiny Shakespeare characters, a 4-layer 128-wide GPT, block 64;
- ``shakespeare-char-gpt-small-v0``: the same data, nanoGPT's "baby GPT" sizes (6 layers, 384 wide,
  6 heads, block 256, dropout 0.2): about 10.8M parameters, slow on CPU;
- ``shakespeare-roles-gpt-v0``: Tiny Shakespeare split by speaking role, one client per role as in
  LEAF (:mod:`exogym.tasks.data.shakespeare_roles`: roles with at least 32 training windows of 64
  characters, 243 clients), the model of ``shakespeare-char-gpt-v0``. Its natural split is used
  only with ``partition="natural"`` and 243 nodes (``--partition natural --nodes 243``): a task has
  no default partition of its own, so without them it trains on the roles' windows shuffled IID.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn
from torch.utils.data import Dataset

from exogym.tasks.gpt import GPT, GPTConfig
from exogym.utils.config import ConfigError
from exogym.utils.plugins import canonical, is_spec, load_object

__all__ = ["ALIASES", "TASKS", "CifarCNN", "Task", "get_task"]

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
        describe_data: ``train -> {key: value}``, more entries for a run's ``config.json`` that
            using the trained model needs (the GPT tasks record their character vocabulary, so
            that ``exogym sample`` needs no corpus); None: nothing more.
        source: where a task from outside the registry was loaded from (``/path/file.py:name``
            or ``module:name``, set by :func:`get_task`), recorded so that ``--resume`` finds it
            again; None for registered tasks.
    """

    id: str
    description: str
    build_model: Callable[[], nn.Module]
    load_data: Callable[[DataDir, bool], tuple[Dataset, Dataset]]
    batch_size: int = 64
    lr: float = 1e-3
    eval_interval: int = 100
    describe_data: Callable[[Dataset], dict[str, Any]] | None = None
    source: str | None = None

    def run_info(self, train: Dataset) -> dict[str, Any]:
        """What a run of this task records in ``config.json`` besides the run's own keys:
        ``{"task": id}``, ``task_source`` for a task loaded from a spec, and the task's
        :attr:`describe_data`."""
        where = {"task_source": self.source} if self.source else {}
        return {"task": self.id, **where,
                **(self.describe_data(train) if self.describe_data else {})}


class CifarCNN(nn.Module):
    """Three 3x3 conv + ReLU + 2x2 max-pool blocks (32, 64, 64 channels), then 1024 -> 128 -> 10.

    Input ``[B, 3, 32, 32]``, output logits ``[B, 10]``; 188,810 parameters with the defaults.
    """

    def __init__(
        self,
        num_classes: int = 10,
        channels: tuple[int, int, int] = (32, 64, 64),
        hidden: int = 128,
    ) -> None:
        super().__init__()
        c1, c2, c3 = channels
        self.features = nn.Sequential(
            nn.Conv2d(3, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # (B, c1, 16, 16)
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # (B, c2, 8, 8)
            nn.Conv2d(c2, c3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # (B, c3, 4, 4)
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(c3 * 4 * 4, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


def _mnist_model() -> nn.Module:
    from exogym.tasks.models import Classifier, MnistCNN

    return Classifier(MnistCNN())


def _mcmahan_model() -> nn.Module:
    """McMahan et al. 2017's MNIST CNN (Section 3): two 5x5 convolutions of 32 and 64
    channels, each followed by 2x2 max pooling, a 512-unit layer and a softmax: 1,663,370
    parameters, as the paper counts them."""
    from exogym.tasks.models import Classifier, MnistCNN

    return Classifier(MnistCNN(channels=(32, 64), hidden=512))


def _mnist_data(data_dir: DataDir, download: bool) -> tuple[Dataset, Dataset]:
    from exogym.tasks.data.mnist import load_mnist

    return load_mnist(data_dir, download=download)


def _cifar_model() -> nn.Module:
    from exogym.tasks.models import Classifier

    return Classifier(CifarCNN())


def _cifar_data(data_dir: DataDir, download: bool) -> tuple[Dataset, Dataset]:
    from exogym.tasks.data.cifar10 import load_cifar10

    return load_cifar10(data_dir, download=download)


def _shakespeare_task(
    task_id: str, cfg: GPTConfig, batch_size: int, lr: float, eval_interval: int
) -> Task:
    def build_model() -> nn.Module:
        return GPT(cfg)

    def load_data(data_dir: DataDir, download: bool) -> tuple[Dataset, Dataset]:
        from exogym.tasks.data.shakespeare import load_shakespeare

        return load_shakespeare(data_dir, block_size=cfg.block_size, download=download)

    return Task(
        id=task_id,
        description=(
            f"Tiny Shakespeare characters, GPT {cfg.n_layer} layers x {cfg.n_embd} "
            f"({cfg.n_head} heads, block {cfg.block_size}, dropout {cfg.dropout}, "
            f"{cfg.num_params():,} parameters); eval: val loss and perplexity "
            "(last 10% of the text)"
        ),
        build_model=build_model,
        load_data=load_data,
        batch_size=batch_size,
        lr=lr,
        eval_interval=eval_interval,
        describe_data=_vocabulary,
    )


ROLES_MIN_WINDOWS = 32
"""``shakespeare-roles-gpt-v0`` keeps the roles with at least this many training windows (a batch
of its default size)."""

ROLES_CLIENTS = 243
"""Its clients (the roles kept from Tiny Shakespeare): the ``--nodes`` of a ``natural`` run."""


def _shakespeare_roles_task(task_id: str, cfg: GPTConfig, batch_size: int, lr: float,
                            eval_interval: int) -> Task:
    def load_data(data_dir: DataDir, download: bool) -> tuple[Dataset, Dataset]:
        from exogym.tasks.data.shakespeare_roles import load_shakespeare_roles

        return load_shakespeare_roles(data_dir, block_size=cfg.block_size,
                                      min_windows=ROLES_MIN_WINDOWS, download=download)

    return dataclasses.replace(
        _shakespeare_task(task_id, cfg, batch_size, lr, eval_interval),
        description=(
            f"Tiny Shakespeare by speaking role (LEAF): {ROLES_CLIENTS} clients, one per role "
            f"with >= {ROLES_MIN_WINDOWS} training windows; run with --partition natural "
            f"--nodes {ROLES_CLIENTS}; GPT {cfg.n_layer} layers x {cfg.n_embd} "
            f"({cfg.num_params():,} parameters); eval: val loss and perplexity (last 10% of "
            "each role's text)"
        ),
        load_data=load_data,
    )


def _vocabulary(train: Dataset) -> dict[str, Any]:
    """A character corpus's vocabulary, in id order (id ``i`` is ``vocab[i]``)."""
    return {"vocab": "".join(train.vocab.chars)}  # type: ignore[attr-defined]


_CHAR_GPT = GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
"""The model of ``shakespeare-char-gpt-v0`` and ``shakespeare-roles-gpt-v0``."""

_MNIST = Task(
    id="mnist-cnn-v0",
    description=(
        "MNIST digits, 2-layer CNN (215,370 parameters); eval: test loss and accuracy "
        "(alias: mnist)"
    ),
    build_model=_mnist_model,
    load_data=_mnist_data,
)

TASKS: dict[str, Task] = {
    t.id: t
    for t in (
        _MNIST,
        Task(
            id="mnist-cnn-mcmahan-v0",
            description=(
                "MNIST digits, McMahan et al. 2017's CNN (two 5x5 convolutions of 32 and 64 "
                "channels, a 512-unit layer: 1,663,370 parameters); eval: test loss and accuracy"
            ),
            build_model=_mcmahan_model,
            load_data=_mnist_data,
        ),
        Task(
            id="cifar10-cnn-v0",
            description=(
                "CIFAR-10 images, 3-layer CNN (188,810 parameters); eval: test loss and accuracy "
                "on test_batch.bin, or on test_batch_first1000.bin when only that is present"
            ),
            build_model=_cifar_model,
            load_data=_cifar_data,
        ),
        _shakespeare_task(
            "shakespeare-char-gpt-v0", _CHAR_GPT, batch_size=32, lr=1e-3, eval_interval=200,
        ),
        _shakespeare_task(
            "shakespeare-char-gpt-small-v0",
            GPTConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384, dropout=0.2),
            batch_size=64, lr=1e-3, eval_interval=250,
        ),
        _shakespeare_roles_task(
            "shakespeare-roles-gpt-v0", _CHAR_GPT, batch_size=ROLES_MIN_WINDOWS, lr=1e-3,
            eval_interval=200,
        ),
    )
}
"""The registered tasks by canonical id."""

TASK_ENTRY_POINTS = "exogym.tasks"
"""The entry point group in which installed packages declare tasks (``id = "module:NAME"``)."""

ALIASES: dict[str, str] = {"mnist": "mnist-cnn-v0"}
"""Short names accepted by :func:`get_task`, mapped to canonical ids."""


def get_task(task_id: str) -> Task:
    """The task registered under ``task_id`` (or an alias), or named by a spec:
    ``path/to/file.py:NAME`` or ``package.module:NAME``, where ``NAME`` is a :class:`Task` or a
    function of no arguments that returns one. An unknown id lists the known ones."""
    if is_spec(task_id):
        obj = load_object(task_id, "task")
        task = obj() if callable(obj) and not isinstance(obj, Task) else obj
        if not isinstance(task, Task):
            got = type(task).__name__
            raise ConfigError(f"task {task_id!r} must be an exogym.tasks.Task or a function "
                              f"returning one; got {got}" + (" (from calling it)" if obj is not
                                                            task else ""))
        return dataclasses.replace(task, source=canonical(task_id))
    task_id = ALIASES.get(task_id, task_id)
    if task_id not in TASKS:
        plugins = plugin_tasks()
        if task_id in plugins:
            return get_task(plugins[task_id])
        close = difflib.get_close_matches(task_id, [*ALIASES, *TASKS, *plugins], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        known = ", ".join([*TASKS, *(f"{a} (= {t})" for a, t in ALIASES.items()), *plugins])
        raise ConfigError(f"unknown task {task_id!r}{hint}; available: {known} (or "
                          "path/to/file.py:NAME, package.module:NAME)")
    return TASKS[task_id]


def plugin_tasks() -> dict[str, str]:
    """``{id: "package.module:NAME"}``: the tasks installed packages declare in the entry point
    group ``exogym.tasks`` (an id exogym already has is not replaced)."""
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=TASK_ENTRY_POINTS)
            if ep.name not in TASKS and ep.name not in ALIASES}
