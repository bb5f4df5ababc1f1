"""The training loss of a run between two metrics rows, and the step every scheduler computes.

:class:`TrainLoss` is the one way the run's nodes compute a step (the schedulers'
:class:`~exogym.run.loop.schedule.Compute`): the given nodes compute it where they live (the
holder: forward, backward, the strategy's update and collectives, the clock told), and their
losses are summed on the device (no host sync per step). At a metrics row it gives the mean
training loss over the node-steps since the last one (across processes: every node's), and it
guards against divergence: a non-finite training loss, or evaluation loss, stops the run (the
row written first) unless the run allows it.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor

from exogym.run.output.result import NonFiniteLossError

if TYPE_CHECKING:
    from collections.abc import Callable

    from exogym.run.dist.ranks import RankContext
    from exogym.run.loop.clocking import ClockFeed
    from exogym.run.nodes.holders import Holder
    from exogym.sim.comm import Communicator

__all__ = ["TrainLoss"]

_ADVICE = ("Lower the learning rate(s), clip gradients (--set max_grad_norm=1), or pass "
           "allow_nonfinite=True (--allow-nonfinite) to train on regardless")


class TrainLoss:
    """The run's training loss and node-steps (module docstring).

    Args:
        held: where the nodes live (:class:`~exogym.run.nodes.holders.Holder`).
        feed: the run's clock feed (told of every step's compute).
        ranks: this process's place in a multi-process run, or None.
        allow_nonfinite: train on after a non-finite loss (a warning instead of an error).
        strategy_id: the run's strategy, for messages.
        num_nodes: the run's ``N``, for messages.
        lead: this process warns (rank 0).
    """

    def __init__(self, held: Holder, feed: ClockFeed, ranks: RankContext | None, *,
                 allow_nonfinite: bool, strategy_id: str, num_nodes: int, lead: bool) -> None:
        self.held, self.feed, self.ranks = held, feed, ranks
        self.comm: Communicator = held.comm
        self.allow_nonfinite, self.lead = allow_nonfinite, lead
        self.strategy_id, self.num_nodes = strategy_id, num_nodes
        device = held.nodes.device
        self.loss_sum = torch.zeros((), device=device)
        self.loss_count = 0
        self.loss_nodes = 0  # node-steps in loss_sum (the nodes that computed)
        self.node_steps = 0  # node-steps computed so far (absent nodes take none)
        # First step (0-based) at which each local node's loss was not finite, -1 while it is:
        # tracked on the device (no host sync per step), read at log steps.
        self.first_bad = torch.full((self.comm.n_local,), -1, dtype=torch.long, device=device)
        self.nonfinite: dict[str, Any] | None = None

    def __call__(self, step: int, active: list[bool] | None) -> None:
        """The ``active`` nodes (None: all) compute ``step``; their losses are kept."""
        attendance = self.comm.attendance
        attendance.step, attendance.active = step, active
        self.account(step, active, self.held.step(step, active, self.feed))

    def account(self, step: int, active: list[bool] | None, losses: Tensor) -> None:
        """Keep step ``step``'s per-node ``losses`` of the ``active`` nodes (None: all), computed
        now or, by the asynchronous engine's batched steps, before."""
        # the computing nodes' losses only (others' rows are 0): a run holding the round's
        # clients in seats sums the very same values in the same order
        self.loss_sum += (losses if active is None else
                          losses[self.comm.local_rows(active, losses.device)]).sum()
        self.loss_count += 1
        computed = self.comm.num_nodes if active is None else sum(active)
        self.loss_nodes += computed
        self.node_steps += computed
        if not self.allow_nonfinite or self.nonfinite is None:
            self.first_bad.masked_fill_((self.first_bad < 0) & ~torch.isfinite(losses), step)

    def take(self) -> float:
        """The mean training loss of the node-steps since the last row (across processes: over
        all ``N`` nodes, a collective), and a fresh sum for the next."""
        if self.ranks is not None:
            dist.all_reduce(self.loss_sum)
        mean = float(self.loss_sum) / max(self.loss_nodes, 1)
        self.loss_sum.zero_()
        self.loss_count = 0
        self.loss_nodes = 0
        return mean

    def check(self, row: dict[str, Any], write: Callable[[dict[str, Any]], None]) -> None:
        """At a metrics row: stop the run (``row`` written first with ``write``) on the first
        non-finite training loss of any node, unless allowed (then warn once). A collective in
        a multi-process run, so that every rank stops at the same step."""
        if self.nonfinite is not None:
            return
        bad = _first_bad_steps(self.first_bad, self.comm, self.ranks)
        if not bad:
            return
        first = min(bad.values())
        nodes = [self.held.node_of(i, first) for i, s in bad.items() if s == first]
        self.nonfinite = {"step": first + 1, "nodes": sorted(nodes)}
        message = (f"non-finite training loss at step {first + 1} on node(s) "
                   f"{', '.join(map(str, self.nonfinite['nodes']))} of {self.num_nodes} "
                   f"(strategy {self.strategy_id}): the run diverged")
        if not self.allow_nonfinite:
            write(row)
            raise NonFiniteLossError(f"{message}; metrics so far are written. {_ADVICE}")
        if self.lead:
            warnings.warn(f"{message}; training on (allow_nonfinite=True)", RuntimeWarning,
                          stacklevel=4)

    def check_eval(self, row: dict[str, Any]) -> None:
        """After a row is written: a non-finite evaluation loss stops the run (unless
        allowed)."""
        loss = row.get("eval_loss", 0.0)
        if not self.allow_nonfinite and not math.isfinite(loss):
            raise NonFiniteLossError(
                f"the global model's eval loss is {loss} after step {row['step']} "
                f"(strategy {self.strategy_id}, {self.num_nodes} nodes): the run diverged; "
                f"metrics so far are written. {_ADVICE}")

    def state_dict(self) -> dict[str, Any]:
        return {"loss_sum": self.loss_sum, "loss_count": self.loss_count,
                "loss_nodes": self.loss_nodes, "node_steps": self.node_steps,
                "first_bad": self.first_bad, "nonfinite": self.nonfinite}

    def load_state_dict(self, m: dict[str, Any], node_steps: int) -> None:
        """Restore :meth:`state_dict` (``node_steps``: the count of a checkpoint that has
        none)."""
        self.loss_sum.copy_(m["loss_sum"])
        self.loss_count = int(m["loss_count"])
        self.loss_nodes = int(m["loss_nodes"])
        self.node_steps = int(m.get("node_steps", node_steps))
        self.first_bad.copy_(m["first_bad"])
        self.nonfinite = m["nonfinite"]


def _first_bad_steps(first_bad: Tensor, comm: Communicator,
                     ranks: RankContext | None) -> dict[int, int]:
    """``{global node id: first 0-based step with a non-finite loss}`` over the whole run (a
    collective across processes, so that every rank stops at the same step)."""
    if ranks is not None:
        full = torch.full((comm.num_nodes,), -1, dtype=torch.long, device=first_bad.device)
        full[comm.node_ids] = first_bad
        dist.all_reduce(full, op=dist.ReduceOp.MAX)
        ids: list[int] = list(range(comm.num_nodes))
    else:
        full, ids = first_bad, comm.node_ids
    values = full.tolist()
    return {i: s for i, s in zip(ids, values, strict=True) if s >= 0}
