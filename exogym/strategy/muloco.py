"""MuLoCo: DiLoCo with Muon as the inner optimizer.

Reference: B. Therien, X. Huang, A. Defazio, I. Rish, E. Belilovsky, "MuLoCo: Muon is a Practical
Inner Optimizer for DiLoCo", arXiv:2505.23725 (Algorithm 1: DiLoCo's outer loop over a Muon inner
optimizer), and the authors' code: github.com/facebookresearch/MuLoCo at commit
475bbf4cc05ea404919f6d271285678728d5fc4f (``torchtitan/config/diloco/2x_4gpu_muloco.py``, the
multi-worker MuLoCo configuration; ``torchtitan/torchtitan/experiments/dion_optimizer/muon.py`` and
``parameter_classification.py``, the inner Muon), and github.com/bentherien/muloco-1 at commit
33cc33315eacd1bb5f179d7d5d9f85e012fe58f2 (``muloco/pytorch/muloco.py``, the same Muon and outer
step for one worker).

The update is DiLoCo's (:mod:`exogym.strategy.diloco`) with ``K`` workers (``N`` nodes here):
every node takes ``H`` steps of Muon (:mod:`exogym.strategy.muon`: Muon for the hidden matrices,
AdamW for biases, norms, embeddings and the LM head), then the mean pseudo-gradient
``Delta = (1/K) sum_k (theta - theta_k)`` drives an outer SGD with Nesterov momentum,
``b <- mu b + Delta; theta <- theta - eta (Delta + mu b)`` (torch's form; the muloco-1 code's
``u <- mu u + eta Delta; theta <- theta_ref - mu u - eta Delta`` is the same with ``u = eta b``),
and every node restarts from ``theta``, keeping its own Muon state.

Defaults, from ``2x_4gpu_muloco.py``: ``H`` = 30 (``sync_steps``; "H=30 used throughout",
muloco-1's ``muloco-1.md``), outer Nesterov SGD with ``outer_lr`` = 0.9 and ``outer_momentum`` =
0.8; Muon with ``muon_lr`` = 0.044, ``muon_momentum`` = 0.9 without Nesterov, the MuLoCo
Newton-Schulz coefficients (``muon_ns="muloco"``), the spectral update scale
``sqrt(fan_out / fan_in)`` (``adjust_lr="spectral_norm"``), AdamW betas (0.9, 0.99) and weight
decay 0.00125 for both parts. Where this differs from that code: the Newton-Schulz iteration runs in
float32 (the code: bfloat16; ``optim.muon_ns_dtype=bf16`` restores it), and the AdamW part steps at
``optim.lr`` (the task's AdamW learning rate; the code steps it at Muon's 0.044 times a factor of
1). The code's K = 16 sweep picked ``outer_lr`` 1.0 and ``outer_momentum`` 0.9
(``jobs/muloco_paper/diloco_muloco_no-compression_h100.py``); muloco-1 (K = 1) uses 0.7 and 0.6.
Muon leaves the layers that are not hidden to AdamW by their role, whatever their names
(:func:`exogym.strategy.muon.outer_layers`: every embedding, the input layer and the output
layer, as Jordan's Muon and the MuLoCo code's ``parameter_classification.py``, which finds
embeddings and the head by name, keep them; an MNIST CNN's input convolution and classifier
were Muon's before 2026-12-07), and by ``optim.muon_exclude``'s name patterns; so the inner
optimizer is built here with the names (the strategy base builds it from the tensors).

Sent per outer step by each node: DiLoCo's ``2 (N-1)/N * (P + B)`` bytes (one ring all-reduce of
the fp32 pseudo-gradient and float buffers; Muon changes nothing that travels). MNIST CNN, ``N =
4``: 1,292,220 bytes per outer step, 43,074 bytes per step at ``H = 30``.
"""

from __future__ import annotations

import dataclasses
import glob
from dataclasses import dataclass, field

from exogym.strategy.diloco import DiLoCo
from exogym.strategy.muon import outer_layers
from exogym.strategy.optim import OptimSpec

__all__ = ["MuLoCo", "muloco_optim"]


def muloco_optim() -> OptimSpec:
    """The inner optimizer of the authors' MuLoCo configuration (module docstring)."""
    return OptimSpec(name="muon", muon_lr=0.044, muon_momentum=0.9, muon_nesterov=False,
                     muon_ns="muloco", muon_scale="spectral", betas=(0.9, 0.99),
                     weight_decay=0.00125)


@dataclass(kw_only=True)
class MuLoCo(DiLoCo):
    """DiLoCo with a Muon inner optimizer and the MuLoCo paper's settings.

    Attributes:
        H: inner steps per outer step (the paper's H; 30).
        outer_lr: the outer Nesterov SGD's learning rate (0.9).
        outer_momentum: the outer Nesterov SGD's momentum (0.8).
        outer_adamw: the layers that are not hidden (embeddings, the input and output layers,
            by role: :func:`~exogym.strategy.muon.outer_layers`) on AdamW, as the paper's code
            keeps them; False: only ``optim.muon_exclude``'s names.
    """

    id = "muloco"
    H: int = 30
    outer_lr: float = 0.9
    outer_momentum: float = 0.8
    outer_adamw: bool = True
    optim: OptimSpec = field(default_factory=muloco_optim)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.outer_adamw, bool):
            raise ValueError(f"outer_adamw must be true or false, got {self.outer_adamw!r}")
        if self.optim.name != "muon":
            raise ValueError(f"MuLoCo's inner optimizer is Muon: optim.name must be 'muon', got "
                             f"{self.optim.name!r} (DiLoCo with another inner optimizer is "
                             "strategy 'diloco')")

    def init_state(self) -> None:
        # StackedStrategy.setup builds the inner optimizer from the parameter tensors alone; Muon
        # needs their names to send the embeddings and the LM head to AdamW (optim.muon_exclude).
        roles = (tuple(glob.escape(name) for name in outer_layers(self.nodes.module))
                 if self.outer_adamw else ())
        spec = dataclasses.replace(self.optim, muon_exclude=(*self.optim.muon_exclude, *roles))
        self.optimizer = spec.build(list(self.nodes.params.values()),
                                    names=list(self.nodes.params))
        self.scheduler = self.schedule.scheduler(self.optimizer, self.total_steps)
        super().init_state()
