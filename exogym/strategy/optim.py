"""Inner optimizers and learning-rate schedules, as small validated configs.

The engine keeps every parameter as one node-stacked tensor ``[N, *shape]``, and one
``torch.optim`` optimizer steps all of them. That equals N independent optimizers exactly when the
optimizer's update is elementwise (each entry depends only on its own gradient history), which is
true of AdamW, Adam and SGD. An optimizer with cross-entry statistics would mix the nodes through
the stacked tensor; Muon (``name="muon"``, :class:`exogym.strategy.muon.Muon`) is offered because
its one cross-entry operation, the orthogonalisation of each matrix, is written per node (batched
over the node dimension); other such optimizers (LAMB's per-tensor trust ratio, Shampoo) are
rejected by name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import torch
from torch import nn

from exogym.strategy.muon import DEFAULT_EXCLUDE, NS_COEFFICIENTS, NS_DTYPES, SCALES, Muon
from exogym.utils.validation import check_int, check_number

__all__ = ["OPTIMIZERS", "LRSchedule", "OptimSpec"]

# Elementwise torch optimizers: stacking N replicas into one tensor leaves each replica's update
# unchanged (bias corrections use the step count, which every node shares).
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adamw": torch.optim.AdamW,
    "adam": torch.optim.Adam,
    "sgd": torch.optim.SGD,
}
# Node-stacked optimizers: not elementwise, written so that no operation crosses the node dimension.
_STACKED: dict[str, type[torch.optim.Optimizer]] = {"muon": Muon}


class _Unset(float):
    """A default that was not given (a float, so the field keeps its type)."""


# torch's own defaults, which EXO Gym's OptimSpec(torch.optim.AdamW, ...) inherits from torch:
_TORCH_WEIGHT_DECAY = {"adamw": 0.01}


@dataclass(kw_only=True)
class OptimSpec:
    """The inner (per-node) optimizer.

    ``name="muon"`` is :class:`exogym.strategy.muon.Muon`: Muon for the matrices, AdamW (``lr``,
    ``betas``, ``eps``) for biases, norms, embeddings and the LM head; the ``muon_*`` fields
    configure it and are unused by the other optimizers. Its defaults are Keller Jordan's
    ``muon.py`` (lr 0.02, momentum 0.95, Nesterov, the fixed quintic, ``max(1, rows/cols)**0.5``).
    ``lr`` stays the AdamW learning rate, so a task's AdamW learning rate applies to the AdamW part.

    Attributes:
        name: one of ``adamw``, ``adam``, ``sgd`` (torch.optim, elementwise) or ``muon``.
        lr: learning rate (the peak value when a schedule is used); Muon's AdamW part.
        weight_decay: decoupled for AdamW and Muon, L2 for Adam and SGD (torch semantics);
            default 0, or torch's default when the optimizer is given as a class
            (EXO Gym's ``OptimSpec(torch.optim.AdamW)``: 0.01).
        betas: Adam's (beta1, beta2); also Muon's AdamW part.
        eps: Adam's epsilon; also Muon's AdamW part.
        momentum: SGD momentum.
        nesterov: SGD Nesterov momentum (needs momentum > 0).
        muon_lr: Muon's learning rate for the matrices.
        muon_momentum: Muon's momentum mu (EMA form).
        muon_nesterov: Nesterov momentum for Muon.
        muon_ns: Newton-Schulz coefficients: jordan (muon.py's quintic x 5) or muloco (the MuLoCo
            code's five per-step triples).
        muon_ns_dtype: precision of the Newton-Schulz iteration: fp32, bf16 or fp64.
        muon_scale: update scale of a rows x cols matrix: jordan (max(1, rows/cols)**0.5),
            moonlight (0.2 sqrt(max(rows, cols))) or spectral (sqrt(rows/cols)).
        muon_exclude: fnmatch patterns of parameter names that get AdamW although they are
            matrices (embeddings, LM head); they apply when the optimizer is built with names.
    """

    name: str = field(default="adamw", kw_only=False)
    lr: float = 1e-3
    weight_decay: float = _Unset(0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    momentum: float = 0.0
    nesterov: bool = False
    muon_lr: float = 0.02
    muon_momentum: float = 0.95
    muon_nesterov: bool = True
    muon_ns: Literal["jordan", "muloco"] = "jordan"
    muon_ns_dtype: Literal["fp32", "bf16", "fp64"] = "fp32"
    muon_scale: Literal["jordan", "moonlight", "spectral"] = "jordan"
    muon_exclude: tuple[str, ...] = DEFAULT_EXCLUDE

    def __post_init__(self) -> None:
        torch_form = isinstance(self.name, type)
        if torch_form:  # EXO Gym's OptimSpec(torch.optim.AdamW, lr=...)
            known = {cls: name for name, cls in {**OPTIMIZERS, **_STACKED}.items()}
            if self.name not in known:
                raise ValueError(
                    f"optimizer class {self.name.__module__}.{self.name.__qualname__} has no "
                    f"exogym equivalent; allowed: "
                    f"{', '.join(f'{c.__module__}.{c.__qualname__}' for c in known)} (or their "
                    f"names {sorted(known.values())})")
            self.name = known[self.name]
        if self.name not in OPTIMIZERS and self.name not in _STACKED:
            raise ValueError(
                f"optimizer name must be one of {sorted(OPTIMIZERS)} (torch.optim, elementwise) "
                f"or one of {sorted(_STACKED)} (node-stacked), got {self.name!r}"
            )
        if type(self.weight_decay) is _Unset:  # torch's default in EXO Gym's (class) form
            self.weight_decay = _TORCH_WEIGHT_DECAY.get(self.name, 0.0) if torch_form else 0.0
        check_number("lr", self.lr, lo=0.0, lo_open=True)
        check_number("weight_decay", self.weight_decay, lo=0.0)
        check_number("eps", self.eps, lo=0.0, lo_open=True)
        self.betas = tuple(self.betas)  # type: ignore[assignment]
        if len(self.betas) != 2:
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        for i, beta in enumerate(self.betas):
            check_number(f"betas[{i}]", beta, lo=0.0, hi=1.0, hi_open=True)
        check_number("momentum", self.momentum, lo=0.0, hi=1.0, hi_open=True)
        if not isinstance(self.nesterov, bool):
            raise ValueError(f"nesterov must be True or False, got {self.nesterov!r}")
        if self.nesterov and (self.name != "sgd" or self.momentum == 0.0):
            raise ValueError("nesterov=True needs name='sgd' and momentum > 0")
        check_number("muon_lr", self.muon_lr, lo=0.0, lo_open=True)
        check_number("muon_momentum", self.muon_momentum, lo=0.0, hi=1.0, hi_open=True)
        if not isinstance(self.muon_nesterov, bool):
            raise ValueError(f"muon_nesterov must be True or False, got {self.muon_nesterov!r}")
        for key, value, allowed in (("muon_ns", self.muon_ns, sorted(NS_COEFFICIENTS)),
                                    ("muon_ns_dtype", self.muon_ns_dtype, sorted(NS_DTYPES)),
                                    ("muon_scale", self.muon_scale, list(SCALES))):
            if value not in allowed:
                raise ValueError(f"{key} must be one of {allowed}, got {value!r}")
        if isinstance(self.muon_exclude, str):  # one pattern, not its characters
            self.muon_exclude = (self.muon_exclude,)
        self.muon_exclude = tuple(self.muon_exclude)
        for pattern in self.muon_exclude:
            if not isinstance(pattern, str) or not pattern:
                raise ValueError(f"muon_exclude must be non-empty name patterns, got "
                                 f"{self.muon_exclude!r}")

    @classmethod
    def from_string(cls, name: str, **kwargs: Any) -> OptimSpec:
        """EXO Gym's ``OptimSpec.from_string("adamw", lr=3e-4)``: the name in any case."""
        if not isinstance(name, str):
            raise TypeError(f"name must be a string, got {type(name).__name__}")
        return cls(name.lower(), **kwargs)

    @property
    def states_per_parameter(self) -> int:
        """Tensors of optimizer state per parameter tensor (Adam: 2 moments; SGD: momentum;
        Muon: at most 2, the AdamW part's moments, plus a per-node step count)."""
        if self.name in ("adam", "adamw", "muon"):
            return 2
        return 1 if self.momentum else 0

    def build(self, params: list[torch.Tensor] | nn.Module,
              names: Sequence[str] | None = None) -> torch.optim.Optimizer:
        """The optimizer over ``params`` (node-stacked tensors), or over a module's parameters
        (EXO Gym's ``optim_spec.build(model)``, their names with them); ``names`` (one per
        parameter) let Muon route ``muon_exclude`` matches to AdamW and are unused by the
        others."""
        if isinstance(params, nn.Module):
            if names is not None:
                raise ValueError("build(module) takes the parameters' names from the module; "
                                 "give names only with a list of tensors")
            named = list(params.named_parameters())
            names, params = [n for n, _ in named], [p for _, p in named]
        if self.name == "muon":
            return Muon(params, lr=self.lr, muon_lr=self.muon_lr, momentum=self.muon_momentum,
                        nesterov=self.muon_nesterov, ns=self.muon_ns,
                        ns_dtype=self.muon_ns_dtype, scale=self.muon_scale, betas=self.betas,
                        eps=self.eps, weight_decay=self.weight_decay, names=names,
                        exclude=self.muon_exclude)
        kwargs: dict[str, Any] = {"lr": self.lr, "weight_decay": self.weight_decay}
        if self.name in ("adam", "adamw"):
            kwargs.update(betas=self.betas, eps=self.eps)
        else:
            kwargs.update(momentum=self.momentum, nesterov=self.nesterov)
        # torch's fused kernel where it has one for these tensors: the same update (to one ulp:
        # Adam's division is ordered otherwise), 4-12x faster than torch's default over stacked
        # CPU tensors (bench/optimizers.py; docs/benchmarks/engines-cpu2-202611.md)
        try:
            return OPTIMIZERS[self.name](params, **kwargs, fused=True)
        except (RuntimeError, ValueError):  # no fused kernel for this device or dtype
            return OPTIMIZERS[self.name](params, **kwargs)


@dataclass(kw_only=True)
class LRSchedule:
    """Linear warm-up, then optionally cosine decay, as a multiplier of the peak lr.

    For step ``t`` (0-based, the step about to be taken), ``W = warmup_steps``, ``T`` the total
    number of training steps and ``r = min_lr_ratio``::

        factor(t) = (t + 1) / W                                   if t < W
                  = r + (1 - r) * (1 + cos(pi * (t - W) / (T - W))) / 2   if cosine, t >= W
                  = 1                                             otherwise

    Attributes:
        warmup_steps: steps of linear warm-up from ``lr / W`` to ``lr``.
        cosine: decay from ``lr`` to ``min_lr_ratio * lr`` over the remaining steps.
        min_lr_ratio: the final lr as a fraction of the peak.
    """

    warmup_steps: int = 0
    cosine: bool = False
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        check_int("warmup_steps", self.warmup_steps, 0)
        if not isinstance(self.cosine, bool):
            raise ValueError(f"cosine must be True or False, got {self.cosine!r}")
        check_number("min_lr_ratio", self.min_lr_ratio, lo=0.0, hi=1.0)

    @property
    def active(self) -> bool:
        return self.warmup_steps > 0 or self.cosine

    def scheduler(self, optimizer: torch.optim.Optimizer,
                  total_steps: int) -> torch.optim.lr_scheduler.LambdaLR | None:
        """A ``LambdaLR`` that multiplies every group's lr by :meth:`factor` (None if inactive):
        the schedule :meth:`StackedStrategy.setup` attaches to the inner optimizer."""
        if not self.active:
            return None
        return torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                 lambda t: self.factor(t, total_steps))

    def factor(self, t: int, total_steps: int) -> float:
        w = self.warmup_steps
        if t < w:
            return (t + 1) / w
        if not self.cosine:
            return 1.0
        span = max(total_steps - w, 1)
        progress = min((t - w) / span, 1.0)
        r = self.min_lr_ratio
        return r + (1.0 - r) * 0.5 * (1.0 + math.cos(math.pi * progress))


def field_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]
