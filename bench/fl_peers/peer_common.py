"""What every peer program of ``bench/fl_peers.py`` shares: the workload file, the model, one
client's local training, the evaluation and the result file.

The peers run in their own virtual environments (Flower's, pfl's), which have torch and NumPy
but not exogym, so this module needs only those two. The workload file (an ``.npz`` written by
``bench/fl_peers.py``) holds everything a peer needs to train exactly what exogym's clients
train:

- ``meta``: JSON (seed, partition, rounds, the clients per round ``K``, local steps ``H``,
  batch ``B``, the AdamW settings, the MNIST normalisation, the path of exogym's
  ``tasks/models.py``);
- ``x_train``/``y_train``, ``x_test``/``y_test``: MNIST as uint8 images and int64 labels;
- ``init/NAME``: the initial weights, exogym's (``torch.manual_seed(seed)`` then the task's model);
- ``clients`` ``[R, K]``: round ``r``'s clients (ascending ids), exogym's participation draws;
- ``batches`` ``[R, K, H, B]``: the sample ids the client in slot ``k`` of round ``r`` trains on,
  step by step (its own shard, in exogym's per-node pass order).

The model is exogym's own class, loaded from the file the workload names (``models.py`` imports
only torch), so every tool trains the same network with the same parameter names.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

EVAL_BATCH = 1000


@dataclass
class Workload:
    """The contents of a workload file, as tensors (images normalised as exogym's MNIST)."""

    meta: dict[str, Any]
    images: Tensor  # float32 [60000, 1, 28, 28]
    labels: Tensor  # int64 [60000]
    test_images: Tensor  # float32 [10000, 1, 28, 28]
    test_labels: Tensor  # int64 [10000]
    init_state: dict[str, Tensor]
    clients: np.ndarray  # int64 [R, K]
    batches: Tensor  # int64 [R, K, H, B]

    @property
    def rounds(self) -> int:
        return int(self.clients.shape[0])

    @property
    def per_round(self) -> int:
        return int(self.clients.shape[1])

    def slot(self, round_index: int, client: int) -> int:
        """Where ``client`` stands among round ``round_index``'s clients."""
        where = np.flatnonzero(self.clients[round_index] == client)
        if len(where) != 1:
            raise ValueError(f"client {client} is not among round {round_index}'s clients "
                             f"{self.clients[round_index].tolist()}")
        return int(where[0])

    def client_data(self, round_index: int, slot: int) -> tuple[Tensor, Tensor]:
        """The samples the client of ``slot`` trains on in round ``round_index``, in training
        order: ``([H * B, 1, 28, 28], [H * B])``; step ``s`` takes rows ``s*B`` to ``(s+1)*B``."""
        ids = self.batches[round_index, slot].reshape(-1)
        return self.images[ids], self.labels[ids]

    def samples_per_round(self) -> int:
        return int(self.batches[0].numel())


def normalise(raw: np.ndarray, mean: float, std: float) -> Tensor:
    """uint8 ``[L, 28, 28]`` -> float32 ``[L, 1, 28, 28]``, ``(pixel / 255 - mean) / std``, the
    operations of exogym's MNIST in the same order (so the same floats)."""
    x = torch.from_numpy(np.ascontiguousarray(raw)).to(torch.float32).div_(255.0)
    return x.sub_(mean).div_(std).unsqueeze(1).contiguous()


def load_workload(path: str | os.PathLike[str], rounds: int | None = None) -> Workload:
    """Read a workload file; ``rounds``: keep only the first ``rounds`` rounds."""
    with np.load(path, allow_pickle=False) as f:
        meta = json.loads(str(f["meta"]))
        init = {k.removeprefix("init/"): torch.from_numpy(f[k].copy())
                for k in f.files if k.startswith("init/")}
        arrays = {k: f[k] for k in ("x_train", "y_train", "x_test", "y_test", "clients",
                                    "batches")}
    total = arrays["clients"].shape[0]
    rounds = total if rounds is None else rounds
    if not 1 <= rounds <= total:
        raise ValueError(f"the workload holds {total} rounds; asked for {rounds}")
    mean, std = meta["mnist_mean"], meta["mnist_std"]
    return Workload(
        meta=meta,
        images=normalise(arrays["x_train"], mean, std),
        labels=torch.from_numpy(arrays["y_train"].astype(np.int64)),
        test_images=normalise(arrays["x_test"], mean, std),
        test_labels=torch.from_numpy(arrays["y_test"].astype(np.int64)),
        init_state=init,
        clients=arrays["clients"][:rounds].astype(np.int64),
        batches=torch.from_numpy(arrays["batches"][:rounds].astype(np.int64)),
    )


_LOADED: dict[tuple[str, int | None], Workload] = {}


def cached_workload(path: str | os.PathLike[str], rounds: int | None = None) -> Workload:
    """:func:`load_workload`, once per process (a framework that calls a client's code many
    times in one worker process reads the file once)."""
    key = (str(path), rounds)
    if key not in _LOADED:
        _LOADED[key] = load_workload(path, rounds)
    return _LOADED[key]


@functools.cache
def _exogym_models(source: str) -> Any:
    """exogym's ``tasks/models.py``, loaded from its file (it imports only torch), once per
    process."""
    spec = importlib.util.spec_from_file_location("exogym_task_models", source)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load exogym's models from {source!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model_classes(wl: Workload) -> tuple[type[nn.Module], type[nn.Module]]:
    """``(Classifier, MnistCNN)``: exogym's classes, from the file the workload names."""
    models = _exogym_models(wl.meta["model_source"])
    return models.Classifier, models.MnistCNN


def build_model(wl: Workload, classifier: type[nn.Module] | None = None) -> nn.Module:
    """exogym's ``Classifier(MnistCNN())`` (or ``classifier(MnistCNN())``, a subclass) with the
    workload's initial weights. ``model((x, y))["loss"]`` is the mean cross-entropy."""
    base, cnn = model_classes(wl)
    model = (classifier or base)(cnn())
    model.load_state_dict(wl.init_state)
    return model


def new_optimizer(params: Any, wl: Workload) -> torch.optim.Optimizer:
    """A fresh AdamW with exogym's inner settings for the task (torch's default implementation,
    as a user of the peer would write it)."""
    o = wl.meta["optim"]
    return torch.optim.AdamW(params, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                             weight_decay=o["weight_decay"])


def train_client(model: nn.Module, wl: Workload, round_index: int, slot: int) -> None:
    """One client's round: a fresh AdamW, ``H`` steps of batch ``B`` over its samples, in
    order. ``model`` holds the global weights on entry and the client's on return."""
    x, y = wl.client_data(round_index, slot)
    batch = wl.meta["batch_size"]
    optimizer = new_optimizer(model.parameters(), wl)
    model.train()
    for start in range(0, len(y), batch):
        loss = model((x[start:start + batch], y[start:start + batch]))["loss"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


@torch.no_grad()
def evaluate(model: nn.Module, wl: Workload) -> dict[str, float]:
    """Mean loss and accuracy of ``model`` on the 10,000 MNIST test images."""
    was = model.training
    model.eval()
    loss = correct = 0.0
    n = len(wl.test_labels)
    for start in range(0, n, EVAL_BATCH):
        x, y = wl.test_images[start:start + EVAL_BATCH], wl.test_labels[start:start + EVAL_BATCH]
        out = model((x, y))
        loss += float(out["loss"]) * len(y)
        correct += float(out["accuracy"]) * len(y)
    model.train(was)
    return {"eval_loss": loss / n, "accuracy": correct / n}


def mean_state(states: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """The plain (equal-weight) mean of the clients' models, as exogym's FedAvg takes it."""
    return {k: torch.stack([s[k] for s in states]).mean(dim=0) for k in states[0]}


def peer_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every peer program takes."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--workload", required=True, help="the .npz that bench/fl_peers.py wrote")
    p.add_argument("--rounds", type=int, default=None, help="rounds to train (default: all)")
    p.add_argument("--out", required=True, help="where to write the result (JSON)")
    p.add_argument("--save-model", default=None,
                   help="also write the final global model here (.npz, for --check)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per process")
    return p


def versions(*packages: str) -> dict[str, str]:
    """The installed versions of ``packages`` (and torch, NumPy, Python)."""
    out = {"python": platform.python_version()}
    for name in ("torch", "numpy", *packages):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


class RoundClock:
    """Wall-clock times (``time.time()``, comparable across processes) of the first round's
    start and the last round's end, and each round's duration (a round starts when the
    previous one ended)."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.end: float | None = None
        self.durations: list[float] = []

    @property
    def rounds(self) -> int:
        return len(self.durations)

    def round_started(self) -> None:
        if self.start is None:
            self.start = time.time()

    def round_ended(self) -> None:
        assert self.start is not None, "a round ended before any started"
        now = time.time()
        self.durations.append(now - (self.end or self.start))
        self.end = now


def finish(args: argparse.Namespace, wl: Workload, model: nn.Module, clock: RoundClock,
           tool: str, packages: tuple[str, ...] = (), **extra: Any) -> None:
    """Evaluate the final global model and write the result file (and the model, if asked)."""
    assert clock.start is not None and clock.end is not None, "no round ran"
    result = {
        "tool": tool,
        "rounds": clock.rounds,
        "samples": clock.rounds * wl.samples_per_round(),
        "t_rounds_start": clock.start,
        "t_rounds_end": clock.end,
        "rounds_s": clock.end - clock.start,
        "round_s": clock.durations,
        **evaluate(model, wl),
        "versions": versions(*packages),
        **extra,
    }
    if args.save_model:
        np.savez(args.save_model, **{k: v.detach().cpu().numpy()
                                     for k, v in model.state_dict().items()})
    Path(args.out).write_text(json.dumps(result, indent=1))
