"""SPARTA + DiLoCo: sparse parameter averaging every step, a DiLoCo outer step every H steps.

References: the SPARTA paper, M. Beton, M. Baioumy, T. van der Ouderaa, M. Reed, S. Howes,
A. Cheema, G. Vrabie, "Improving the Efficiency of Distributed Training using Sparse Parameter
Averaging", ICLR 2025 workshop, OpenReview stFPf3gzq1 (its SPARTA + DiLoCo experiments), and
A. Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models",
arXiv:2311.08105 (Algorithm 1).

Each step ``t`` (0-based), in the order of the EXO Gym reference (sparse, then DiLoCo):

1. every node takes its inner optimizer step (AdamW);
2. SPARTA's sparse average (see :mod:`exogym.strategy.sparta`): the ``k`` entries of the step's
   index set ``S_t`` (derived from ``seed`` and ``t``, never sent) become their node mean on every
   node;
3. if ``(t + 1) mod H == 0``: DiLoCo's outer step (:meth:`DiLoCo.outer_step`, with its outer
   optimizer, codec and drop options): the mean pseudo-gradient
   ``Delta = theta - (1/N) sum_i theta_i`` drives the outer optimizer on the global copy
   ``theta``, which then replaces every node's parameters.

Averaging entries across nodes leaves the node mean unchanged, so on an outer step (without
dropped nodes) the sparse average does not change the outer step's result; it is kept there, as
in the reference, so that "SPARTA every step" holds literally (``k`` values per ``H`` steps).
The global model is DiLoCo's outer copy ``theta`` from the last outer step. A codec, if set,
applies to DiLoCo's pseudo-gradients as in DiLoCo; the sparse averages travel in the parameters'
dtype (they are parameter values, see :mod:`exogym.strategy.sparta`). ``seed`` is shared by
SPARTA's indices and DiLoCo's drop decisions (``q > 0``).

Sent per ``H`` steps by each node: ``H * 2 (N-1)/N * k * s`` bytes of sparse averages
(``k`` entries of ``s`` bytes, 4 in fp32: ``k = max(1, round(p M))`` with ``policy="random"``,
``floor(M/P)`` or ``ceil(M/P)`` with ``"partition"``) plus DiLoCo's
``2 (N-1)/N * (P + B)`` for the outer step (``P`` parameter bytes, ``B`` float buffer bytes).
MNIST CNN (``M`` = 215,370, ``P`` = 861,480, no buffers), ``N`` = 4, ``p`` = 0.005, ``H`` = 100:
``100 * 6,462 + 1,292,220`` = 1,938,420 bytes per 100 steps, 19,384.2 bytes per step on average.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from exogym.strategy._exo_gym import exo_gym_name
from exogym.strategy.diloco import DiLoCo
from exogym.strategy.sparta import Policy, SparseAverager, check_sparta_config

__all__ = ["SPARTADiLoCo"]


@dataclass(kw_only=True)
class SPARTADiLoCo(DiLoCo):
    """DiLoCo with SPARTA's sparse parameter averaging after every inner step.

    Attributes:
        p: fraction of all parameter entries averaged across the nodes after every step
            (0 < p <= 1; SPARTA's default 0.005).
        policy: which entries: "random" (a fresh uniform random subset each step) or "partition"
            (a fixed random partition into ceil(1/p) parts, cycled in order).
        seed: shared seed of SPARTA's indices (with the step number) and of DiLoCo's drop
            decisions (q > 0); never sent.
    """

    id = "sparta_diloco"
    p: float = 0.005
    policy: Policy = "random"
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_sparta_config(self.p, self.policy, self.seed)

    derived_state = ("averager",)  # SPARTA's indices come from (seed, step) alone

    def init_state(self) -> None:
        super().init_state()
        self.averager = SparseAverager(self.nodes.params, self.p, self.policy, self.seed)

    @torch.no_grad()
    def step(self, step: int) -> None:
        self.inner_step()
        self.averager.average(self.averager.indices(step), self.comm, members=self.arrivals())
        if (step + 1) % self.H == 0:
            self.outer_step()


def __getattr__(name: str) -> Any:
    """EXO Gym's ``SPARTADiLoCoStrategy`` under its path, this module, imported on first use
    (:mod:`exogym.strategy._exo_gym`)."""
    return exo_gym_name(__name__, name, ("SPARTADiLoCoStrategy",))
