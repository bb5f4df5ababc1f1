"""Virtual nodes as the run sees them: :class:`PagedNodes`, the holder of a paged run's groups
(:mod:`exogym.run.nodes.paging` pages them in and out)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import Tensor

from exogym.run.nodes.memory import CommBytes, load_nodes, nodes_state
from exogym.run.nodes.paging import Paged
from exogym.run.output.checkpoint import Parts, read_part
from exogym.sim.comm import Communicator
from exogym.sim.sharding import NodeBatches
from exogym.strategy.base import StackedStrategy

if TYPE_CHECKING:
    from exogym.run.nodes.holders import StepClock

__all__ = ["PagedNodes"]


class PagedNodes(CommBytes):
    """Groups of ``K`` nodes, one in memory at a time (:mod:`exogym.run.nodes.paging`). A step is
    computed now, with the steps up to the next synchronisation when the strategy says none of
    them communicates and no world can change who computes (each group then computes the round
    while it is in memory), or was computed earlier with its round: its losses, learning rate,
    epoch and price are kept until the run reaches it, and the round's collectives are counted
    at its last step.

    Args:
        paged: the groups (:class:`~exogym.run.nodes.paging.Paged`).
        hub: the run's communicator (the groups' counters and log).
        batches: the run's data.
        worldly: whether a world (or a deadline) may change who computes at any step (then
            step by step).
        until_evaluation: steps from a step to the next evaluation, that step included (a
            round ends there: an evaluation reads the groups' state of its step).
    """

    def __init__(self, paged: Paged, hub: Communicator, batches: NodeBatches, *,
                 worldly: bool, until_evaluation: Callable[[int], int],
                 total_steps: int) -> None:
        # the first group's nodes and strategy (the run's strategy) stand for the run's
        super().__init__(paged.groups[0].nodes, hub, paged.groups[0].strategy, batches)
        self.paged = paged
        self.worldly, self.until_evaluation, self.total_steps = (
            worldly, until_evaluation, total_steps)
        # A round computed ahead: per step (losses, (lr, epoch), price); the step's (lr, epoch)
        self._ahead: dict[int, tuple[Tensor, tuple[float, int], float | None]] = {}
        self._view: tuple[float, int] = (0.0, 0)

    @property
    def strategies(self) -> list[StackedStrategy]:
        return self.paged.strategies

    def call(self, fn: Callable[[StackedStrategy], None]) -> None:
        self.paged.call(lambda g: fn(g.strategy))

    def step(self, step: int, active: list[bool] | None, clock: StepClock) -> Tensor:
        paged = self.paged
        if step in self._ahead:
            losses, self._view, price = self._ahead.pop(step)
            clock.computed(step, active)
            clock.priced(price)
            if not self._ahead:
                paged.flush()
            return losses
        # partial participation changes who computes only at a round's first step, where a
        # round computed ahead starts anyway
        n = 1 if self.worldly else min(paged.round_length(step, self.total_steps),
                                       self.until_evaluation(step))
        marks, cpu = clock.begin_step(), paged.store.cpu_seconds
        assert isinstance(self.batches, NodeBatches)
        batches = self.batches
        ids, epochs = [], []
        for _ in range(n):
            ids.append(batches.next_indices(active))
            epochs.append(batches.epoch)
        # the clock learns of the step's compute before its collectives ask who arrives (a
        # deadline reads the clock), as in memory
        clock.computed(step, active)
        out = paged.compute(list(range(step, step + n)),
                            lambda k, lo, hi: batches.rows(ids[k], lo, hi), active)
        price = clock.end_step(marks, self.comm.n_local, steps=n,
                              exclude_cpu_s=paged.store.cpu_seconds - cpu)
        for k in range(1, n):
            self._ahead[step + k] = (out[k][0], (out[k][1], epochs[k]), price)
        self._view = (out[0][1], epochs[0])
        return out[0][0]

    def view(self) -> tuple[float, int]:
        return self._view

    @property
    def between_rounds(self) -> bool:
        return not self._ahead

    def global_state(self) -> dict[str, Tensor]:
        # evaluations end a round (until_evaluation), the run ends between rounds
        assert not self._ahead, "a paged run's global model read inside a round"
        return self.paged.global_state()

    def state_dict(self) -> dict[str, Any]:
        return {"groups": {"files": self.paged.group_files()}}  # the groups: the parts

    def load_state_dict(self, state: Mapping[str, Any], folder: Path | None) -> None:
        if folder is None or "groups" not in state:
            raise ValueError("a paged run resumes from a checkpoint folder of a paged run "
                             "(its groups are files beside the state)")
        device = self.nodes.device
        self.paged.load_groups(lambda name: read_part(folder, name, device), load_nodes)

    def parts(self) -> Parts | None:
        paged = self.paged
        return lambda folder, write: paged.write_groups(folder, write, nodes_state)

    def result(self) -> dict[str, Any]:
        return {**super().result(), "paging": self.paged.report()}

    def close(self) -> None:
        self.paged.close()
