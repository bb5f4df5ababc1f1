"""DiLoCo whose outer all-reduce overlaps the next inner phase: delayed or eager outer step.

Reference: S. Kale, A. Douillard, Y. Donchev, "Eager Updates For Overlapped Communication and
Computation in DiLoCo", arXiv:2502.12996 (2025): Algorithm 2 (DiLoCo with naive delayed outer
gradients, Figure 2), Algorithm 3 (eager updates), Figure 5 (naive vs eager as H varies), Table 2
("1-outer-step delayed", "1-outer-step eager", "2-outer-steps eager"). Built on DiLoCo
(:mod:`exogym.strategy.diloco`, arXiv:2311.08105), whose outer optimizers it shares.

With ``N`` nodes (the paper's ``M``) and ``d = delay``, at the end of every inner phase ``t`` (every
``H`` inner steps) node ``m``, which started the phase from its outer parameters
``theta_m^(t-1)`` and reached ``x_m^(t)``:

1. sends ``Delta_m^(t) = theta_m^(t-1) - x_m^(t)``; the all-reduce of the mean
   ``Delta^(t) = (1/N) sum_m Delta_m^(t)`` starts and runs under the next ``d`` inner phases
   (``d H`` steps of compute);
2. applies the mean that has arrived, ``Delta^(t-d)``, with the outer optimizer:

   - naive (``eager=False``, Algorithm 2): ``theta^(t) = OuterOpt(theta^(t-1), Delta^(t-d))``.
     Every node computes the same thing, so one global copy and one outer optimizer state are
     kept (as DiLoCo);
   - eager (``eager=True``, the default, Algorithm 3): node ``m`` replaces its own stale
     contribution to the delayed mean by its fresh outer gradient,
     ``D_m^(t) = Delta^(t-d) + (1/N) (Delta_m^(t) - Delta_m^(t-d))
     = (1/N) (Delta_m^(t) + sum_{k != m} Delta_k^(t-d))``, and
     ``theta_m^(t) = OuterOpt_m(theta_m^(t-1), D_m^(t))``. The algorithm is written per replica,
     so the nodes' models differ and each node keeps its own outer optimizer state (its own
     Nesterov momentum);
3. restarts its next inner phase from ``theta^(t)`` (naive) or its own ``theta_m^(t)`` (eager).
   Each node keeps its inner optimizer state, as in DiLoCo.

``delay = 0`` is DiLoCo, bit for bit (its code path). ``N = 1``: the eager form is DiLoCo
(``Delta^(t-d) = Delta_1^(t-d)``, so ``D_1^(t) = Delta_1^(t)``). With an SGD outer optimizer
(Nesterov or heavy ball, linear in its gradients) the node mean of the eager models is the outer
optimizer run on the mean eager gradient ``(1/N) Delta^(t) + (1 - 1/N) Delta^(t-d)``.

Open choices, each tested by hand in tests/strategy/test_diloco_eager.py:

- the first ``d`` rounds, before any mean has arrived: ``Delta^(t-d) = Delta_m^(t-d) = 0``. Naive:
  no outer step (a step on a zero gradient is the same for SGD and Nesterov, torch starting the
  momentum at the first gradient; for Adam it would count a step), and every node restarts from
  the unchanged ``theta^(0)``: its progress is in flight, and restarting from its own parameters
  would count it twice. This is the bootstrap of PCCL's asynchronous DiLoCo. Eager:
  ``D_m^(t) = Delta_m^(t) / N`` (Algorithm 3's formula with the zero delayed terms);
- the last ``d`` means, still in flight when the run ends, are never applied (the clock still
  waits for them);
- the global model (evaluation, the returned model): naive, ``theta^(t)`` (DiLoCo's); eager, the
  node mean of the parameters (SPARTA's and DES-LOC's convention for nodes that differ). Right
  after an outer step, and so at the end of a run that ``H`` divides, it is the mean of the
  ``theta_m^(t)``. (The mean of the ``theta_m`` between outer steps would need the other
  processes' outer parameters, which the process engine's evaluation does not gather.)
- ``delay >= 2`` (Table 2's 2-outer-steps row): the mean of round ``t`` is applied at round
  ``t + d``, its own stale contribution replaced the same way.

Absent nodes (a world) and dropped outer gradients (``q``, as in DiLoCo): the mean of round
``t`` is over the ``M_t`` nodes whose outer gradients arrive (``S_t``). A round where none
arrives is skipped (nothing is sent or applied), so a mean is applied at the ``d``-th round that
sends after its own. Naive: ``theta`` steps with the mean that is due; the nodes of ``S_t``
restart from it, the others keep their parameters (DiLoCo's rule; their next outer gradient is
taken against the new ``theta``). Eager: each contribution is weighted by its own round's count,
``D_m^(t) = Delta^(t-d) - s_m^(t-d) Delta_m^(t-d) / M_{t-d} + s_m^(t) Delta_m^(t) / M_t``
(``s_m = 1`` if node ``m``'s outer gradient arrived in that round, else 0), the paper's formula
when everyone arrives; so every node applies each mean once and its own contributions eagerly
at their weight in their mean, none twice. Every active node applies it (one whose message was
lost applies the others' delayed work and keeps its own parameters, its progress sent next
round); nodes that computed nothing (down, or sitting out after a deadline cut) miss it and are
marked out of sync, to be recovered from a live peer when they compute again. Recovery: naive,
the global model, its buffers, the outer momentum and the means in flight (DiLoCo's recovery);
eager, the donor's ``theta_m`` (the node's parameters and outer parameters), its outer
optimizer state, its buffers, its record of what it sent in the rounds in flight (the node
replaces the donor's stale contributions, which its copied ``theta_m`` already holds) and the
means in flight; both: the donor's inner optimizer state (``recovery="copy"``) or a fresh one.

Floating-point buffers (BatchNorm; the paper's transformers have none) travel in the same
all-reduce as the outer gradients, so their mean also arrives ``d`` rounds later; the nodes that
restart adopt it then (no eager replacement: running statistics are not increments), and keep
their own before the first one arrives. Integer buffers of the global model: node 0's. With a
transport ``codec`` the outer gradients go through it, and the eager form subtracts the node's
uncompressed ``Delta_m^(t-d)`` (the mean holds its reconstruction: they differ by the
compression error).

Sent per outer step (every ``H`` steps) by each node: DiLoCo's bytes, ``2 (N-1)/N * (P + B)``
(``P`` parameter bytes, ``B`` float buffer bytes; ``M_t`` in place of ``N`` with absent nodes),
MNIST CNN with ``N = 4``: 1,292,220 bytes per outer step, 12,922.2 per step at ``H = 100``. The
all-reduce is logged with ``overlap=True``, tag ``pseudo_grads`` (``pseudo_grads{j}``, ``j`` the
round modulo ``d``, when ``d >= 2``, so that a round only waits for the all-reduce whose mean it
applies), and :attr:`overlap_steps` is ``d H``: the simulated clock runs it under ``d H`` steps of
compute and adds only what does not fit (the last one, awaited at the end of the run).

Code checked against (read, not copied): PCCL's asynchronous DiLoCo,
PrimeIntellect-ai/pccl ``python/examples/nanogpt_diloco/async_diloco.py`` at commit 5708ac2f
(the naive form: after its inner steps a node waits for the previous round's all-reduce, steps
the outer optimizer with it and copies the outer parameters into its model; in the first round no
outer step, the model reset to the unchanged outer parameters); torchft
``torchft/local_sgd.py`` at commit 7e1c8d1e, whose ``fragment_sync_delay`` is Streaming DiLoCo's
``tau`` (fewer than ``sync_every`` inner steps, overlap within a round), not a round's delay; it
has no eager form. The equations of Algorithms 2 and 3 above come from summaries of the paper
(the algorithms' own text could not be read here), which describe the eager update as a mixture
of the current local outer gradient with the delayed outer gradients of the other replicas.

Defaults: ``H = 30`` (the paper's Table 2 setting), Nesterov with momentum 0.9 as DiLoCo, outer
learning rate 0.4 (the paper tunes the delayed forms' outer learning rate below DiLoCo's 0.7,
Table 2; its exact value could not be read here, so 0.4 is this project's choice, measured), eager,
one round of delay (the paper's main setting). On the default task (MNIST CNN, 4 nodes, 500
steps, 2026-11-25): 97.64% with these defaults; DiLoCo's ``H = 100`` and outer learning rate 0.7
reached 94.84% (eager; 96.38% naive): with 5 rounds the delayed momentum overshoots and the
evaluation loss oscillates; ``H = 100`` with outer learning rate 0.5, 0.4, 0.3: 97.56%, 97.38%,
96.64% (with final eval losses 0.17-0.31, the rounds too few to settle); ``H = 50`` at 0.4:
96.97%. ``--set H=100 --set outer_lr=0.7`` gives DiLoCo's settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from exogym.strategy.base import _optimizer_rows, optimizer_tensors, restart_rows
from exogym.strategy.diloco import DiLoCo
from exogym.strategy.masked import masked_step

__all__ = ["DiLoCoEager"]


def _rows(mask: Tensor, like: Tensor) -> Tensor:
    """``[n_local]`` ``mask`` shaped to broadcast over node-stacked ``like``."""
    return mask.view(-1, *([1] * (like.dim() - 1)))


@dataclass(kw_only=True)
class DiLoCoEager(DiLoCo):
    """DiLoCo with its outer all-reduce overlapped with the next ``delay`` inner phases.

    Attributes:
        eager: the eager outer gradient, each node's fresh outer gradient in place of its stale
            contribution to the delayed mean (the paper's Algorithm 3); False: the naive delayed
            mean (Algorithm 2).
        delay: outer rounds the all-reduce of the outer gradients overlaps: 1 is the paper's
            1-outer-step overlap, 2 its 2-outer-steps row; 0 is DiLoCo (blocking).
        H: inner steps per round (30, the paper's Table 2; DiLoCo's default is 100).
        outer_lr: the outer optimizer's learning rate (0.4: lower than DiLoCo's 0.7, as the paper
            tunes it for the delayed forms; module docstring).
    """

    id = "diloco_eager"
    # each node keeps its own outer model and state: a client selected again would need the
    # eager bookkeeping of the rounds it missed (not modelled)
    supports_participation: ClassVar[bool] = False
    H: int = 30
    outer_lr: float = 0.4
    eager: bool = True
    delay: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.eager, bool):
            raise ValueError(f"eager must be True or False, got {self.eager!r}")
        if isinstance(self.delay, bool) or not isinstance(self.delay, int) or self.delay < 0:
            raise ValueError(f"delay must be an integer >= 0 (outer rounds; 0 is DiLoCo), got "
                             f"{self.delay!r}")

    @property
    def per_node(self) -> bool:
        """Whether each node keeps its own outer parameters and optimizer (eager, delay >= 1)."""
        return self.eager and self.delay > 0

    def init_state(self) -> None:
        self.rounds_sent = 0  # rounds that sent something (they rotate the tags when d >= 2)
        # The means of the last rounds, oldest first: {"grads", "buffers", "count" (M_t)}.
        self.in_flight: list[dict[str, Any]] = []
        if not self.per_node:
            super().init_state()  # theta, its buffers, one outer optimizer, the round counter
            return
        self.outer_steps = 0
        self.outer_params = {k: p.detach().clone() for k, p in self.nodes.params.items()}
        self.node_outer_opt = self._outer_optimizer(list(self.outer_params.values()))
        # Each node's outer step count, all N (every process knows who stepped): Adam's bias
        # correction and the first momentum step of a node that missed some.
        self.outer_counts = torch.zeros(self.comm.num_nodes, dtype=torch.long)
        # What each node sent in each round in flight, s_m Delta_m (node-stacked), oldest first.
        self.sent: list[list[Tensor]] = []

    def _outer_optimizer(self, params: list[Tensor]) -> torch.optim.Optimizer:
        if self.outer_optimizer == "adam":
            return torch.optim.Adam(params, lr=self.outer_lr, betas=self.outer_betas,
                                    eps=self.outer_eps)
        return torch.optim.SGD(params, lr=self.outer_lr, momentum=self.outer_momentum,
                               nesterov=self.outer_optimizer == "nesterov")

    @torch.no_grad()
    def outer_step(self) -> None:
        """Send this round's outer gradients, apply the mean that has arrived, restart."""
        if self.delay == 0:
            super().outer_step()
            return
        t = self.outer_steps
        self.outer_steps += 1
        members = self.arrivals()  # a world's: the active nodes whose messages arrive
        survivors = None if members is None else list(members)
        if self.q > 0.0:
            alive = survivors if survivors is not None else [True] * self.comm.num_nodes
            dropped = self.dropped(t).tolist()
            survivors = [s and not d for s, d in zip(alive, dropped, strict=True)]
        if survivors is not None and not any(survivors):
            return  # nobody sends: the round is skipped
        self._round(survivors)

    def _round(self, survivors: list[bool] | None) -> None:
        nodes, comm = self.nodes, self.comm
        names = list(nodes.params)
        start = (self.outer_params if self.per_node
                 else {k: v.unsqueeze(0) for k, v in self.global_params.items()})
        fresh = [start[k] - nodes.params[k] for k in names]  # Delta_m^(t), [n_local, *shape]
        tag = "pseudo_grads" if self.delay == 1 else f"pseudo_grads{self.rounds_sent % self.delay}"
        self.rounds_sent += 1
        means, buffer_means = self._all_reduce(fresh, list(nodes.float_buffers.values()), tag,
                                               survivors)
        count = comm.num_nodes if survivors is None else sum(survivors)
        self.in_flight.append({"grads": means, "buffers": buffer_means, "count": count})
        due = self.in_flight.pop(0) if len(self.in_flight) > self.delay else None
        keep = None if survivors is None else comm.local_rows(survivors, nodes.device)
        if self.per_node:
            self._eager_step(names, fresh, count, due, survivors, keep)
        else:
            self._naive_step(names, due, keep)

    def _all_reduce(self, payload: list[Tensor], buffers: list[Tensor], tag: str,
                    members: list[bool] | None) -> tuple[list[Tensor], list[Tensor]]:
        """:meth:`all_reduce_with_buffers`, overlapped: one all-reduce of the outer gradients
        and the float buffers, or with a codec the buffers uncompressed in a second one."""
        codec = self.transport_codec
        if codec is None:
            out = list(self.comm.all_reduce(payload + buffers, "mean", tag=tag, overlap=True,
                                            members=members))
            return out[: len(payload)], out[len(payload):]
        grads = list(self.comm.all_reduce(payload, "mean", tag=tag, overlap=True, codec=codec,
                                          members=members))
        return grads, (list(self.comm.all_reduce(buffers, "mean", tag=f"{tag}/buffers",
                                                 overlap=True, members=members))
                       if buffers else [])

    def _naive_step(self, names: list[str], due: dict[str, Any] | None,
                    keep: Tensor | None) -> None:
        """``theta <- OuterOpt(theta, Delta^(t-d))``; the members restart from ``theta``."""
        if due is not None:
            for k, delta in zip(names, due["grads"], strict=True):
                self.global_params[k].grad = delta
            self.outer_opt.step()
            self.outer_opt.zero_grad(set_to_none=True)
        for k in names:
            restart_rows(self.nodes.params[k], self.global_params[k], keep)
        if due is not None:
            self.adopt_buffers(due["buffers"], self.global_buffers, keep)

    def _eager_step(self, names: list[str], fresh: list[Tensor], count: int,
                    due: dict[str, Any] | None, survivors: list[bool] | None,
                    keep: Tensor | None) -> None:
        """Each node's ``D_m`` (see the module docstring), its own outer step, the members'
        restart from their ``theta_m``."""
        # s_m Delta_m^(t): what this round's mean holds of each node (zero if it did not arrive)
        sent = fresh if keep is None else [torch.where(_rows(keep, f), f, torch.zeros_like(f))
                                           for f in fresh]
        if due is None:  # no mean has arrived: Delta^(t-d) = Delta_m^(t-d) = 0
            grads = [s / count for s in sent]
            stepping = survivors
        else:
            stale = self.sent.pop(0)
            grads = [(mean.unsqueeze(0) - old / due["count"]) + s / count
                     for mean, old, s in zip(due["grads"], stale, sent, strict=True)]
            stepping = self.comm.active  # every node that computed applies the mean
            if stepping is not None:  # the others missed it: recovered when they compute again
                self.request_recovery([not a for a in stepping])
        self.sent.append(sent)
        for k, g in zip(names, grads, strict=True):
            self.outer_params[k].grad = g
        self._step_nodes(stepping)
        self.node_outer_opt.zero_grad(set_to_none=True)
        for k in names:
            theta, p = self.outer_params[k], self.nodes.params[k]
            p.copy_(theta if keep is None else torch.where(_rows(keep, p), theta, p))
        if due is not None:
            for b, mean in zip(self.nodes.float_buffers.values(), due["buffers"], strict=True):
                restart_rows(b, mean, keep)

    def _step_nodes(self, stepping: list[bool] | None) -> None:
        """One step of the nodes' outer optimizer for ``stepping`` (``N`` booleans; None: all),
        each node with its own count (:func:`exogym.strategy.masked.masked_step`)."""
        counts = self.outer_counts[self.comm.node_ids]  # this process's rows (a copy)
        rows = (torch.ones(self.nodes.num_nodes, dtype=torch.bool, device=self.nodes.device)
                if stepping is None else self.comm.local_rows(stepping, self.nodes.device))
        # decided on every node (not this process's or group's rows): each part of a run
        # spread over processes, or paged in groups, takes the path the whole run takes
        everyone = stepping is None or all(stepping)
        if everyone and bool((self.outer_counts == self.outer_counts[0]).all()):
            self.node_outer_opt.step()  # every node, one count: exactly torch's step
        else:
            masked_step(self.node_outer_opt, rows, counts)
        self.outer_counts += torch.tensor([True] * self.comm.num_nodes if stepping is None
                                          else stepping, dtype=torch.long)

    @torch.no_grad()
    def recover(self, node: int, donor: int) -> None:
        """A node back up gets the run's outer state (see the module docstring) from ``donor``;
        its local progress since its last outer step is lost."""
        in_flight = [t for r in self.in_flight for t in (*r["grads"], *r["buffers"])]
        if not self.per_node:
            self.recover_from_global(node, donor, self.global_params, self.global_buffers,
                                     [*optimizer_tensors(self.outer_opt), *in_flight])
            return
        self.send_global(in_flight, node, donor, tag="recovery")
        rows = [*self.outer_params.values(), *optimizer_tensors(self.node_outer_opt),
                *(t for sent in self.sent for t in sent), *self.nodes.buffers.values()]
        if self.recovery == "copy":
            rows += _optimizer_rows(self.optimizer, self.nodes.num_nodes)
        self.copy_rows(rows, donor, node, tag="recovery")
        self.outer_counts[node] = self.outer_counts[donor]
        row = self._row(node)
        if row is not None:
            for k, p in self.nodes.params.items():
                p[row].copy_(self.outer_params[k][row])
        self._after_recovery(node, donor)

    @property
    def overlap_steps(self) -> int | None:
        """The all-reduce of round ``t`` is applied ``delay`` rounds, ``delay * H`` steps, later."""
        return self.delay * self.H if self.delay > 0 else None

    def global_state(self) -> dict[str, Tensor]:
        if not self.per_node:
            return super().global_state()
        return self.node_mean_state()
