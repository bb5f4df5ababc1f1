"""DES-LOC: local Adam whose parameters and two moments are averaged on their own periods.

Reference: A. Iacob, L. Sani, M. Safaryan, P. Giampouras, S. Horvath, A. Jovanovic, M. Kurmanji,
P. Aleksandrov, W. F. Shen, X. Qiu, N. D. Lane, "DES-LOC: Desynced Low Communication Adaptive
Optimizers for Training Foundation Models", arXiv:2505.22549 (ICLR 2026, OpenReview 6N2qFixxYZ).
Checked against the first author's code (upstream pytorch/torchft has no DES-LOC; his fork does):

- Iacob-Alexandru-Andrei/torchft, commit 64e15a3b9a6dc0eb0bc650edd5aedf66b0573eae (branch
  ``feat-add-des-loc``), ``torchft/local_sgd.py``: ``DESLoc._step_post_hook``;
- Iacob-Alexandru-Andrei/torchtitan, commit e9d29d4ff55672c7400c082f8a7b18125da9dd5f (branch
  ``final_push``), ``torchtitan/experiments/fl/desloc.py``: ``DesLocController._step_post_hook``,
  and ``experiments/fl/configs/mosaic_mup_16M_torchft.toml`` (``param_sync_every = 32``,
  ``optimizer_sync_every = [64, 128]`` for ``exp_avg``, ``exp_avg_sq``).

Every node ``m`` runs the inner optimizer (Adam/AdamW, :class:`OptimSpec`) on its own data. With
``t`` the 1-based step and ``E_m[.]`` the mean over the nodes, step ``t`` is, per node, with
``average="after"`` (the default, the authors' code: the averages run in a hook after the
optimizer's step):

1. ``g = clip(grad f(x_t^m))`` (clipping is the base's per-node L2 clipping ``max_grad_norm``,
   off by default: the paper clips with a radius ``rho``);
2. the inner optimizer's step: ``u_t = beta1 u_{t-1} + (1 - beta1) g``,
   ``v_t = beta2 v_{t-1} + (1 - beta2) g^2``, ``x_{t+1} = x_t - eta u_t / (sqrt(v_t) + eps)``
   (torch's Adam/AdamW, with its bias corrections and weight decay);
3. ``u_t <- E_m[u_t]`` if ``t mod K_u = 0``; ``v_t <- E_m[v_t]`` if ``t mod K_v = 0``;
   ``x_{t+1} <- E_m[x_{t+1}]`` if ``t mod K_x = 0``: the averages replace the local values on
   every node, so the next gradient is taken at the averaged parameters.

``average="before"`` is the paper's Algorithm 1 as written, its ``sync`` operators inside the
update: at step ``t`` the due states are averaged first (``u_{t-1}``, ``v_{t-1}``, ``x_t``) and
then the optimizer steps, with the gradient taken at the node's own pre-average ``x_t``. Before
the first step the optimizer has no state (all zeros on every node), so there a moment due at
``t = 1`` (a period of 1) is not sent.

The authors' hooks count optimizer steps from the start and fire at multiples of each period, as
``t mod K = 0`` does here. When periods coincide, each state is averaged on its own (one
all-reduce per state: tags ``first_moment``, ``second_moment``, ``params``, in that order). The
moments are read from the inner optimizer's state, ``self.optimizer.state[p]``: ``exp_avg``
(``u``) and ``exp_avg_sq`` (``v``) for Adam and AdamW; ``momentum_buffer`` is a first moment too
(SGD with momentum, the paper's SGDM variant; Muon's matrices), so with Muon the first moment is
each parameter's ``momentum_buffer`` or ``exp_avg`` and the second only the AdamW part's
``exp_avg_sq``. Float buffers (BatchNorm statistics) are averaged with the parameters.

Periods. The paper recommends ``K_u = 3 K_x`` and ``K_v = 6 K_x`` (the moments decay more slowly
than the parameters move); the authors' 16M config uses ``K_u = 2 K_x``, ``K_v = 4 K_x``. Here
``K_x`` defaults to 4 so that short runs synchronise (the paper's headline, 170x less traffic
than DDP, corresponds to ``K_x`` around 256), ``K_u`` to ``3 K_x`` and ``K_v`` to ``K_u``, not
to the paper's ``6 K_x``, because of a hazard of ``K_u < K_v`` (measured, not discussed in the
paper): where a node's gradient has been exactly zero since the start (a ReLU unit dead on that
node, an embedding row of a token it has not seen), its ``v`` is 0 until the first ``v``
average; a ``u`` average before it brings the node the other nodes' momentum, and its next Adam
step there is ``u / (0 + eps)``, ``1e4``-``1e5`` times ``lr``. On the MNIST CNN with 4 nodes,
``K_x = 4`` and ``K_u = 12``, ``K_v = 24`` sends the training loss from 2.0 (step 10) to 71
(step 20), and 500 steps end at 94.66% accuracy (65.73% with ``average="before"``); ``K_v = 12``
(both moments averaged together, so ``v`` is shared from the first ``u`` average on) ends at
98.44% with either placement. ``--set K_v=24`` gives the paper's ratio.

Absent nodes (a world), as in SPARTA: each due average is the mean over the nodes whose
messages arrive (a ring among those ``M``, one draw of message losses per step with an average),
written into their rows only; a node that is down, lost its message or was cut by a ``deadline``
keeps its own values. A node back up copies a live peer's parameters, buffers and optimizer state
(:meth:`StackedStrategy.recover`).

The global model (evaluated, deployed) is the mean of the nodes' parameters and float buffers
(what a final parameter sync would give; node 0's integer buffers): between two parameter
averages no node holds it. Computing it is an evaluation-side view, not counted as traffic.

Sent by each node, ``P`` = parameter bytes, ``B`` = float buffer bytes, ``U`` / ``V`` = bytes of the
first / second moments (``U = V = P`` for Adam; Muon: ``U = P``, ``V`` = the AdamW part's): at a
step ``t`` with ``t mod K_x = 0``, ``2 (N-1)/N * (P + B)``; with ``t mod K_u = 0``,
``2 (N-1)/N * U``; with ``t mod K_v = 0``, ``2 (N-1)/N * V`` (ring all-reduces). Per step on
average, for Adam and the defaults: ``2 (N-1)/N * (P (1 + 1/3 + 1/3) + B) / K_x``. MNIST CNN
(``P`` = 861,480, no buffers), ``N = 4``, ``K_x = 4``: 1,292,220 bytes at every 4th step, twice
as much again at every 12th (``u`` and ``v``): 538,425 bytes per step on average (DDP:
1,292,220).

No codec: DES-LOC exchanges parameter values and optimizer states, not updates (as SPARTA).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import Tensor

from exogym.strategy.base import StackedStrategy, positive_int, restart_rows

__all__ = ["DESLOC", "FIRST_MOMENTS", "SECOND_MOMENTS"]

#: Optimizer-state keys that are a first moment (u) / a second moment (v).
FIRST_MOMENTS: tuple[str, ...] = ("exp_avg", "momentum_buffer")
SECOND_MOMENTS: tuple[str, ...] = ("exp_avg_sq",)

Placement = Literal["after", "before"]
#: Where a due average sits in step t (module docstring): after the inner optimizer's step (the
#: authors' post-step hook) or before it (the paper's Algorithm 1 as written).
PLACEMENTS: tuple[Placement, ...] = ("after", "before")


@dataclass(kw_only=True)
class DESLOC(StackedStrategy):
    """Local Adam with desynchronised averaging of parameters (K_x), u (K_u) and v (K_v).

    Attributes:
        K_x: steps between two parameter averages (the paper's K_x).
        K_u: steps between two first-moment averages (None: 3 K_x, the paper's recommendation).
        K_v: steps between two second-moment averages (None: K_u; the paper recommends 6 K_x,
            which lets a node divide the others' momentum by its own zero v on the MNIST CNN:
            module docstring).
        average: ``"after"`` the inner step (the authors' post-step hook) or ``"before"`` it
            (the paper's Algorithm 1 as written).
    """

    id = "desloc"
    supports_codec: ClassVar[bool] = False
    K_x: int = 4
    K_u: int | None = None
    K_v: int | None = None
    average: Placement = "after"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.average not in PLACEMENTS:
            raise ValueError(f"average must be one of {list(PLACEMENTS)}, got {self.average!r}")
        positive_int("K_x", self.K_x)
        if self.K_u is None:
            self.K_u = 3 * self.K_x
        if self.K_v is None:
            self.K_v = self.K_u
        positive_int("K_u", self.K_u)
        positive_int("K_v", self.K_v)
        if self.optim.name not in ("adam", "adamw", "muon") and not (
                self.optim.name == "sgd" and self.optim.momentum > 0):
            raise ValueError(f"DES-LOC averages the inner optimizer's moments: optim.name must "
                             f"be adam, adamw, muon or sgd with momentum > 0, got "
                             f"{self.optim.name!r} with momentum {self.optim.momentum}")

    @property
    def sync_period(self) -> int | None:
        """None: the global model is the node mean, which every local step moves, so no run
        length leaves it at the initial model or loses local steps (as SPARTA)."""
        return None

    @property
    def u_period(self) -> int:
        """``K_u`` as given, or ``3 K_x``."""
        return self.K_u if self.K_u is not None else 3 * self.K_x

    @property
    def v_period(self) -> int:
        """``K_v`` as given, or ``K_u``."""
        return self.K_v if self.K_v is not None else self.u_period

    @torch.no_grad()
    def step(self, step: int) -> None:
        t = step + 1
        if self.average == "before":
            self._average_due(t)
            self.inner_step()
        else:
            self.inner_step()
            self._average_due(t)

    def _average_due(self, t: int) -> None:
        """Average every state whose period divides the 1-based step ``t``, each on its own,
        among the nodes whose messages arrive (one draw of a world's losses per step)."""
        due = [(t % self.u_period == 0, FIRST_MOMENTS, "first_moment"),
               (t % self.v_period == 0, SECOND_MOMENTS, "second_moment")]
        if not (any(d for d, _, _ in due) or t % self.K_x == 0):
            return
        members = self.arrivals()
        if members is not None and not any(members):
            return
        for is_due, keys, tag in due:
            if is_due:
                self._average(self.moments(keys), tag, members)
        if t % self.K_x == 0:
            tensors = list(self.nodes.params.values()) + list(self.nodes.float_buffers.values())
            self._average(tensors, "params", members)

    def _average(self, tensors: list[Tensor], tag: str, members: list[bool] | None) -> None:
        """The mean over ``members`` (None: all) replaces their rows; the others keep theirs."""
        if not tensors:
            return
        if members is None:
            self.comm.all_reduce_(tensors, "mean", tag=tag)
            return
        means = self.comm.all_reduce(tensors, "mean", tag=tag, members=members)
        keep = self.comm.local_rows(members, self.nodes.device)
        for x, mean in zip(tensors, means, strict=True):
            restart_rows(x, mean, keep)

    def moments(self, keys: tuple[str, ...]) -> list[Tensor]:
        """The inner optimizer's node-stacked state tensors stored under ``keys``, in parameter
        order (empty before the first step)."""
        out = []
        for p in self.nodes.params.values():
            state = self.optimizer.state.get(p, {})
            out += [state[k] for k in keys if isinstance(state.get(k), Tensor)]
        return out

    def global_state(self) -> dict[str, Tensor]:
        """The node mean of the parameters and float buffers; node 0's integer buffers."""
        return self.node_mean_state()
