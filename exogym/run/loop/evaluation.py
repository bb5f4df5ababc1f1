"""The global model against the evaluation set, during training and at the end.

A run evaluates the model its strategy would deploy (:meth:`exogym.strategy.base.StackedStrategy.
global_state`) on a fixed subset of the evaluation set during training (``eval_samples``: the
same subset for every run, seed and strategy, so their curves compare) and on the whole set at
the end; rank 0 computes in a multi-process run and every rank gets the numbers.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils._pytree import tree_map
from torch.utils.data import Dataset

from exogym.run.dist.ranks import RankContext
from exogym.run.output.result import NonFiniteLossError
from exogym.sim.engine import call_model, metrics_of
from exogym.sim.sharding import FixedSubset, iterate_batches

__all__ = ["EvalTimes", "Evaluation", "describe_eval_set", "evaluate_model", "from_lead",
           "load_state"]


class EvalTimes:
    """When a run evaluates during training: every ``interval`` steps and at its last step
    (``enabled``: there is an evaluation set).

    Args:
        interval: steps between two evaluations.
        total_steps: the run's length.
        enabled: whether the run evaluates at all.
    """

    def __init__(self, interval: int, total_steps: int, enabled: bool) -> None:
        self.interval, self.total_steps, self.enabled = interval, total_steps, enabled

    def due(self, done: int) -> bool:
        """Whether the row after ``done`` steps has an evaluation."""
        return self.enabled and done > 0 and (done % self.interval == 0
                                              or done == self.total_steps)

    def steps_to_next(self, step: int) -> int:
        """Steps from ``step`` to the next evaluation, that step included (a paged round ends
        there: an evaluation reads the groups' state of its step, which a round computed
        further ahead has left behind; eager DiLoCo's global model, the nodes' mean, changes
        every step)."""
        if not self.enabled:
            return self.total_steps - step
        return self.interval - step % self.interval


class Evaluation:
    """The evaluation sets of a run and the module that evaluates a global model on them.

    Args:
        model: the user's module (a template: copied).
        dataset: the evaluation set, or None (no evaluation).
        samples: the size of the fixed subset used during training (None: the whole set).
        batch_size: evaluation batch size.
        device: where the evaluation computes.
        ranks: this process's place in a multi-process run, or None.

    Attributes:
        full: the whole evaluation set (the final numbers'); during: the set evaluated during
            training (a :class:`~exogym.sim.sharding.FixedSubset` of ``full``, or ``full``).
    """

    def __init__(self, model: nn.Module, dataset: Dataset | None, samples: int | None,
                 batch_size: int, device: torch.device, ranks: RankContext | None) -> None:
        self.full = self.during = dataset
        if dataset is not None and samples is not None and samples < len(
                dataset):  # type: ignore[arg-type]
            self.during = FixedSubset(dataset, samples)
        self.module = copy.deepcopy(model).to(device).eval()
        self.batch_size, self.device, self.ranks = batch_size, device, ranks
        self.lead = ranks is None or ranks.rank == 0

    def __call__(self, state: dict[str, Tensor], dataset: Dataset,
                 save: Callable[[dict[str, Tensor]], None] | None = None) -> dict[str, float]:
        """The global model ``state`` on ``dataset`` (``eval_*`` metrics; rank 0 computes, every
        rank gets them); ``save``: given the model's ``state_dict`` (``model.pt``)."""
        metrics: dict[str, float] = {}
        if self.lead:
            metrics = evaluate_model(self.module, state, dataset, self.batch_size, self.device)
        metrics = from_lead(metrics, self.ranks)
        if save is not None:
            load_state(self.module, state)  # a state_dict with tied names too
            save(self.module.state_dict())
        return metrics

    def final(self, last: dict[str, Any] | None, state: Callable[[], dict[str, Tensor]],
              allow_nonfinite: bool, strategy: str,
              save: Callable[[dict[str, Tensor]], None] | None) -> dict[str, float]:
        """The last evaluation (``last``: the last metrics row) again on the whole set, if
        training evaluated a subset; a non-finite loss there stops the run (unless allowed)."""
        if self.during is None or last is None:
            return {}
        final = {k: v for k, v in last.items() if k.startswith("eval_")}
        if self.during is not self.full:
            assert self.full is not None
            final = self(state(), self.full, save)
            if not allow_nonfinite and not math.isfinite(final.get("eval_loss", 0.0)):
                raise NonFiniteLossError(
                    f"the global model's eval loss on the whole evaluation set is "
                    f"{final['eval_loss']} at the end (strategy {strategy})")
        return final


def from_lead(value: Any, ranks: RankContext | None) -> Any:
    """Rank 0's ``value`` on every rank (a broadcast); as is in one process."""
    if ranks is None or ranks.world_size == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def describe_eval_set(dataset: Dataset | None) -> str | None:
    """What an evaluation set is: its ``test_set`` attribute, else its size."""
    if dataset is None:
        return None
    name = getattr(dataset, "test_set", None)
    return name if name is not None else f"{len(dataset):,} samples"  # type: ignore[arg-type]


def _to(batch: Any, dev: torch.device) -> Any:
    """A batch's tensors on ``dev``."""
    return tree_map(lambda t: t.to(dev) if isinstance(t, Tensor) else t, batch)


@torch.no_grad()
def evaluate_model(module: nn.Module, state: dict[str, Tensor], dataset: Dataset, batch_size: int,
              dev: torch.device) -> dict[str, float]:
    """Sample-weighted means of the model's scalar metrics over ``dataset``, ``eval_*``."""
    sums: dict[str, Tensor] = {}
    count = 0
    for batch, size in iterate_batches(dataset, batch_size):
        batch = _to(batch, dev)
        metrics = metrics_of(call_model(module, state, batch))
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0) + v.detach().float().reshape(()) * size
        count += size
    out = {f"eval_{k}": float(v) / count for k, v in sums.items()}
    if "eval_perplexity" in out:
        # Perplexity does not average over batches: it is exp of the mean loss.
        out["eval_perplexity"] = math.exp(out["eval_loss"])
    return out


@torch.no_grad()
def load_state(module: nn.Module, state: dict[str, Tensor]) -> None:
    """``state`` (a global model, keyed like a state_dict) into ``module``'s own tensors."""
    for name, value in state.items():
        try:
            target = module.get_parameter(name)
        except AttributeError:
            target = module.get_buffer(name)
        target.copy_(value)
