"""DiLoCo: H local AdamW steps per node, then an outer step on the mean pseudo-gradient.

Reference: A. Douillard, Q. Feng, A. A. Rusu, R. Chhaparia, Y. Donchev, A. Kuncoro, M. Ranzato,
A. Szlam, J. Shen, "DiLoCo: Distributed Low-Communication Training of Language Models",
arXiv:2311.08105 (Algorithm 1; section 3.1, "Outer Optimizers" and "Asynchronous Communication").

With ``k`` nodes and the global parameters ``theta^(t-1)``, each outer step ``t``:

1. every node ``i`` starts from ``theta^(t-1)`` and takes ``H`` inner steps on its own data with
   the inner optimizer (AdamW), reaching ``theta_i^(t)``;
2. outer gradient: ``Delta^(t) = (1/k) sum_i (theta^(t-1) - theta_i^(t))`` (one all-reduce);
3. ``theta^(t) = OuterOpt(theta^(t-1), Delta^(t))``, chosen by ``outer_optimizer``:

   - ``"nesterov"`` (the paper's choice and the default): SGD with Nesterov momentum, learning
     rate 0.7, momentum 0.9 (the paper's values), in ``torch.optim.SGD``'s form:
     ``b <- mu b + Delta; theta <- theta - eta (Delta + mu b)`` (first step: ``b = Delta``);
   - ``"sgd"``: ``b <- mu b + Delta; theta <- theta - eta b`` (heavy ball; with
     ``outer_momentum=0`` plain SGD, which with ``outer_lr=1`` is FedAvg, as the paper notes);
   - ``"adam"``: ``torch.optim.Adam`` (bias-corrected) with ``outer_betas`` and ``outer_eps``;
     the paper found it unstable and raised its epsilon to 0.1, the default here. With that
     epsilon and pseudo-gradient entries well below 0.1, the first step is about
     ``outer_lr * Delta / (|Delta| + 0.1)``, roughly ``10 outer_lr Delta``: set ``outer_lr``
     (the default 0.7 is Nesterov's); ``outer_lr=0.1`` (about FedAvg's step) reached 97.8% on
     the MNIST task (4 nodes, 500 steps), 0.01 only 91.9%;
4. every node's parameters are replaced by ``theta^(t)``; each node keeps its own inner optimizer
   state across outer steps.

Dropped communication (the paper's "Asynchronous Communication" ablation, Figure 8): at each outer
step every node's outer gradient is dropped with probability ``q``. The decision for outer step
``t`` (0-based) is row ``t`` of uniforms drawn from a ``torch.Generator`` seeded with ``seed``
(``N`` per outer step, see :meth:`DiLoCo.dropped`), so every node sees the same decision.
``Delta^(t)`` is then the mean over the ``M`` surviving nodes only, the outer step uses it, and
only the survivors restart from ``theta^(t)``: "when an outer gradient is dropped, the local
worker continues training for the following H steps starting from its own parameters
theta_i^(t) (as opposed to the shared parameters theta^(t))". Its next outer gradient is again
``theta^(t) - theta_i``, against the current shared parameters. If no node survives (``M = 0``),
nothing is sent, the outer optimizer does not step (its momentum is untouched) and every node
continues from its own parameters. With ``q = 0`` the code path is exactly the undropped one.
Dropping cannot be combined with error feedback (a dropped node's zero message would still flush
its residual).

The paper trains transformers (no BatchNorm); here floating-point buffers are averaged across nodes
(survivors only, with dropping) at each outer step and become the global model's buffers;
integer buffers (counters) of node 0 become the global ones. The global model
evaluated between outer steps is ``theta^(t)`` from the last one. The paper's ``H`` is 500; the
default here is 100, as in the EXO Gym examples, for short runs.

Sent per outer step (every ``H`` steps) by each node, ``P`` = parameter bytes (4 x parameters in
fp32), ``B`` = float buffer bytes:

- no codec: ``2 (N-1)/N * (P + B)`` (one ring all-reduce of the fp32 pseudo-gradient and buffers);
- with ``codec``: the pseudo-gradient goes through it, ``2 (N-1)/N * S_c`` with ``S_c`` the codec's
  payload for ``P`` (``(N-1) * S_c`` for a sparse codec, whose all-reduce is an all-gather), plus
  a separate uncompressed all-reduce of the buffers, ``2 (N-1)/N * B``, if the model has any;
- with ``q > 0`` (or a world's absent nodes, lost messages and deadline cuts): a ring all-reduce
  among the ``M`` survivors, ``2 (M-1)/M * (P + B)`` per survivor and nothing from the others;
  an outer step where all nodes drop sends nothing.

Absent nodes (a world): the outer gradient is the mean over the ``M`` nodes whose pseudo-gradients
arrived, exactly as with ``q`` (the paper's dropped-gradient ablation; ``q`` is a special case of
message loss). A node that is down, or whose message was lost or cut by a ``deadline``, keeps its
own parameters; a node that was down loses what it had not sent and, back up, receives the global
model and the outer optimizer's momentum from a live peer (live recovery, :meth:`DiLoCo.recover`;
``2 P`` bytes for Nesterov, plus the inner optimizer state with ``recovery="copy"``).

MNIST CNN (215,370 fp32 parameters, ``P`` = 861,480 bytes, no buffers), ``N = 4``: 1,292,220
bytes per node per outer step, 12,922.2 bytes per step at ``H = 100``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from exogym.strategy._exo_gym import exo_gym_name
from exogym.strategy.base import (
    StackedStrategy,
    in_range,
    optimizer_tensors,
    positive_int,
    restart_rows,
)

__all__ = ["OUTER_OPTIMIZERS", "DiLoCo", "OuterOptimizerName"]

OuterOptimizerName = Literal["nesterov", "sgd", "adam"]
OUTER_OPTIMIZERS: tuple[str, ...] = ("nesterov", "sgd", "adam")


@dataclass(kw_only=True)
class DiLoCo(StackedStrategy):
    """Distributed low-communication training (inner AdamW, outer optimizer every H steps).

    Attributes:
        H: inner steps per outer step (the paper's H; 500 in the paper).
        outer_optimizer: the outer optimizer: nesterov (SGD with Nesterov momentum, the paper's
            choice), sgd (heavy-ball SGD; plain SGD with outer_momentum=0) or adam.
        outer_lr: the outer optimizer's learning rate (0.7 in the paper, for nesterov).
        outer_momentum: the momentum of nesterov and sgd (0.9 in the paper); unused by adam.
        outer_betas: adam's (beta1, beta2).
        outer_eps: adam's epsilon (0.1 in the paper, which found smaller values unstable).
        q: probability that a node's outer gradient is dropped at an outer step (the paper's
            asynchronous-communication ablation); the mean is over the surviving nodes.
        seed: seed of the drop decisions (one row of N uniforms per outer step).
    """

    id = "diloco"
    supports_participation: ClassVar[bool] = True
    # an earlier `nesterov` switch, which --set nesterov=... would otherwise resolve to the inner
    # optimizer's optim.nesterov: refused with what replaced it
    retired_keys: ClassVar[dict[str, str]] = {
        "nesterov": "the outer optimizer is outer_optimizer=nesterov|sgd|adam (the inner "
                    "optimizer's Nesterov momentum is optim.nesterov)"}
    H: int = 100
    outer_optimizer: OuterOptimizerName = "nesterov"
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    outer_betas: tuple[float, float] = (0.9, 0.999)
    outer_eps: float = 0.1
    q: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int("H", self.H)
        if self.outer_optimizer not in OUTER_OPTIMIZERS:
            raise ValueError(f"outer_optimizer must be one of {list(OUTER_OPTIMIZERS)}, got "
                             f"{self.outer_optimizer!r}")
        in_range("outer_lr", self.outer_lr, 0.0, float("inf"), lo_open=True)
        in_range("outer_momentum", self.outer_momentum, 0.0, 1.0, hi_open=True)
        if self.outer_optimizer == "nesterov" and self.outer_momentum == 0.0:
            raise ValueError("outer_optimizer='nesterov' needs outer_momentum > 0, got "
                             "outer_momentum=0.0; use outer_optimizer='sgd' for plain SGD")
        self.outer_betas = tuple(self.outer_betas)  # type: ignore[assignment]
        if len(self.outer_betas) != 2:
            raise ValueError(f"outer_betas must be two numbers in [0, 1), got {self.outer_betas!r}")
        for i, beta in enumerate(self.outer_betas):
            in_range(f"outer_betas[{i}]", beta, 0.0, 1.0, hi_open=True)
        in_range("outer_eps", self.outer_eps, 0.0, float("inf"), lo_open=True)
        in_range("q", self.q, 0.0, 1.0)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) \
                or not 0 <= self.seed < 2**31:
            raise ValueError(f"seed must be an integer in [0, 2^31), got {self.seed!r}")
        if self.q > 0.0 and self.error_feedback:
            raise ValueError(f"q={self.q} (dropped outer gradients) cannot be combined with "
                             "error_feedback=True: a dropped node would still send its residual; "
                             "allowed: q=0 or error_feedback=False")

    def init_state(self) -> None:
        self.global_params, self.global_buffers = self.snapshot()
        self.outer_steps = 0  # outer steps attempted so far (the drop generator's index t)
        params = list(self.global_params.values())
        self.outer_opt: torch.optim.Optimizer
        if self.outer_optimizer == "adam":
            self.outer_opt = torch.optim.Adam(params, lr=self.outer_lr, betas=self.outer_betas,
                                              eps=self.outer_eps)
        else:
            self.outer_opt = torch.optim.SGD(params, lr=self.outer_lr,
                                             momentum=self.outer_momentum,
                                             nesterov=self.outer_optimizer == "nesterov")

    def communicates(self, step: int) -> bool | None:
        """Only the last step of a round communicates (a subclass with another step: None)."""
        return self._communicates_every_H(step, DiLoCo)

    @torch.no_grad()
    def step(self, step: int) -> None:
        self.inner_step()
        if (step + 1) % self.H == 0:
            self.outer_step()

    def dropped(self, t: int) -> Tensor:
        """``[N]`` bool on the CPU: which nodes' outer gradients are dropped at outer step ``t``.

        Node ``i`` is dropped when ``u[t, i] < q``, with ``u`` the ``[t + 1, N]`` uniforms drawn
        from a CPU generator seeded with ``seed``: one row of ``N`` per outer step, the same on
        every node and whatever happened at other outer steps. All False when ``q = 0``.
        """
        # Regenerating rows 0..t costs O(t N) floats, nothing next to an outer step; a seed mixed
        # from (seed, t) would not do: the CPU generator keeps only a seed's low 32 bits.
        gen = torch.Generator(device="cpu").manual_seed(self.seed)
        return torch.rand(t + 1, self.comm.num_nodes, generator=gen)[t] < self.q

    @torch.no_grad()
    def outer_step(self) -> None:
        """Average the pseudo-gradients, step the global copy, restart every node from it."""
        t = self.outer_steps
        self.outer_steps += 1
        members = self.arrivals()  # a world's: the active nodes whose messages arrive
        if self.q == 0.0 and members is None:
            self._outer_step(None)
            return
        survivors = list(members) if members is not None else [True] * self.comm.num_nodes
        if self.q > 0.0:
            dropped = self.dropped(t).tolist()  # on the CPU: deciding needs no device sync
            survivors = [s and not d for s, d in zip(survivors, dropped, strict=True)]
        if not any(survivors):
            return  # nobody sends: no outer step, every node keeps its own parameters
        self._outer_step(survivors)

    def _outer_step(self, survivors: list[bool] | None) -> None:
        """One outer step over ``survivors`` (``N`` booleans; None: every node)."""
        names = list(self.nodes.params)
        local = [self.nodes.params[k] for k in names]
        buffers = list(self.nodes.float_buffers.values())
        # Delta_i = theta^(t-1) - theta_i^(t), node-stacked: [N, *shape].
        pseudo = [self.global_params[k].unsqueeze(0) - p for k, p in zip(names, local, strict=True)]
        reduced, buffer_means = self.all_reduce_with_buffers(pseudo, buffers, "mean",
                                                             tag="pseudo_grads",
                                                             members=survivors)
        for k, delta in zip(names, reduced, strict=True):
            self.global_params[k].grad = delta
        self.outer_opt.step()
        self.outer_opt.zero_grad(set_to_none=True)
        keep = (None if survivors is None
                else self.comm.local_rows(survivors, self.nodes.device))
        for k, p in zip(names, local, strict=True):
            restart_rows(p, self.global_params[k], keep)
        self.adopt_buffers(buffer_means, self.global_buffers, keep)

    def recover(self, node: int, donor: int) -> None:
        """A node back up gets the global model ``theta^(t)`` and the outer optimizer's state
        (its momentum), and the donor's inner optimizer state (``recovery="copy"``) or a fresh
        one; its local progress since its last outer step is lost."""
        self.recover_from_global(node, donor, self.global_params, self.global_buffers,
                                 optimizer_tensors(self.outer_opt))

    def global_state(self) -> dict[str, Tensor]:
        out = {k: v.clone() for k, v in self.global_params.items()}
        out.update({k: v.clone() for k, v in self.global_buffers.items()})
        return out


def __getattr__(name: str) -> Any:
    """EXO Gym's ``DiLoCoStrategy`` under its path, this module, imported on first use
    (:mod:`exogym.strategy._exo_gym`)."""
    return exo_gym_name(__name__, name, ("DiLoCoStrategy",))
