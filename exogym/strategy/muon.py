"""Muon over node-stacked parameters: momentum, per-node Newton-Schulz orthogonalisation, AdamW.

References: K. Jordan, Y. Jin, V. Boza, J. You, F. Cesista, L. Newhouse, J. Bernstein, "Muon: An
optimizer for hidden layers in neural networks" (2024, kellerjordan.github.io/posts/muon), code
github.com/KellerJordan/Muon ``muon.py`` at commit 857d1adc159e098212f828d927460782d3da59e9; the
MuLoCo authors' Muon (B. Therien et al., "MuLoCo: Muon is a Practical Inner Optimizer for DiLoCo",
arXiv:2505.23725): github.com/bentherien/muloco-1 ``muloco/pytorch/muloco.py`` at commit
33cc33315eacd1bb5f179d7d5d9f85e012fe58f2 and github.com/facebookresearch/MuLoCo
``torchtitan/torchtitan/experiments/dion_optimizer/muon.py`` at commit
475bbf4cc05ea404919f6d271285678728d5fc4f; J. Liu et al., "Muon is Scalable for LLM Training"
(Moonlight), arXiv:2502.16982, for the ``"moonlight"`` update scale.

Every parameter is one tensor ``[N, *shape]`` (row ``i`` = node ``i``). A parameter whose node shape
has two or more dimensions is a *matrix* and gets Muon, unless its name matches one of the
``exclude`` patterns; every other parameter (biases, norm gains: one dimension per node; scalars;
excluded names: by default the embeddings and the language-model head, ``*wte*``, ``*wpe*``,
``*embed*``, ``*lm_head*``) gets AdamW. This is the classification of the MuLoCo code
(``parameter_classification.py``: 1-D -> AdamW, embeddings and head by name -> AdamW, other
matrices -> Muon) and Keller Jordan's advice ("Muon should only be used for hidden weight layers").
Without ``names`` the patterns cannot apply and every matrix gets Muon. A conv kernel
``[out, in, kh, kw]`` is the matrix ``[out, in * kh * kw]`` ("view them as 2D and collapse their
last 3 dimensions").

Muon, for a matrix ``W`` with node gradient ``G`` (``mu`` = ``momentum``, ``eta`` = ``muon_lr``,
``lambda`` = ``weight_decay``), every node independently:

1. ``M <- mu M + (1 - mu) G`` (the EMA form of ``muon.py``);
2. ``U = (1 - mu) G + mu M`` with ``nesterov`` (``muon.py``'s default), else ``U = M``;
3. ``O = NS(U)``: ``X = U / (||U||_F + eps)`` (transposed first when rows > cols), then five
   quintic steps ``A = X X^T, X <- a X + (b A + c A^2) X`` with ``(a, b, c)`` =
   ``(3.4445, -4.7750, 2.0315)`` every step and ``eps = 1e-7`` (``ns="jordan"``, ``muon.py``), or
   the five per-step triples of the MuLoCo code and ``eps = 1e-8`` (the optimizer's epsilon
   there; ``ns="muloco"``);
4. ``W <- W (1 - eta lambda) - eta s O`` with the scale ``s`` of the matrix ``[rows, cols]``:
   ``max(1, rows / cols) ** 0.5`` (``scale="jordan"``, ``muon.py``), ``0.2 sqrt(max(rows, cols))``
   (``"moonlight"``: matches AdamW's update RMS, arXiv:2502.16982) or ``sqrt(rows / cols)``
   (``"spectral"``, the MuLoCo code's ``adjust_lr="spectral_norm"``, fan_out / fan_in).

The MuLoCo code's momentum is the sum form ``M <- mu M + G`` (no ``1 - mu``), which is
``1 / (1 - mu)`` times the EMA, with or without Nesterov; step 3's Frobenius normalisation removes a
positive factor, so the two forms give the same ``O`` (up to ``eps`` and round-off; tested). Step 3
runs as batched matrix products over the node dimension, so nodes never mix: the result equals the
per-node iteration to round-off (tested to 1e-6). Its output is only approximately orthogonal: a
singular value ``sigma`` of ``U`` becomes ``f(sigma / ||U||_F)``, ``f`` the composition of the five
quintics; for ``sigma / ||U||_F >= 0.01`` that lies in [0.68, 1.14] for ``"jordan"`` (``muon.py``:
"something like Uniform(0.5, 1.5)") and in [0.977, 1.032] for ``"muloco"``; smaller singular values
stay smaller (0.47 at 0.001). The iteration runs in ``ns_dtype``: float32 by default (on the CPUs
this simulator mostly runs on, bfloat16 products are several times slower, and float32 is the more
accurate), ``"bf16"`` as both authors' codes do on GPUs, ``"fp64"`` for float64 tests.
Both codes' conv handling is incidental (``muon.py`` scales a 4-D kernel by its last two dimensions,
the MuLoCo code by ``out / in``); here every scale uses the ``[out, in * kh * kw]`` view.

AdamW, for every other parameter: ``torch.optim.AdamW``'s update (decoupled decay ``p <- p (1 - lr
lambda)``, ``m`` and ``v`` EMAs with ``betas``, bias corrections ``1 - beta^t``, ``eps`` added to
``sqrt(v_hat)``), which is also ``muon.py``'s ``adam_update`` and the MuLoCo code's AdamW, with a
step count ``t`` per node (``state["step"]``, shape ``[N]``): a node that skips a step keeps its own
count.

``step(active=mask)`` steps only the nodes where the ``[N]`` bool mask is True: the other rows of
every parameter and every state tensor, and their step counts, stay bit-for-bit as they were, and
the active rows get exactly the numbers of an unmasked step.

Two parameter groups, always in this order (either may be empty): group 0 AdamW (``lr``, the
learning rate the rest of exogym reports), group 1 Muon (``muon_lr``); a scheduler scales both.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

__all__ = ["DEFAULT_EXCLUDE", "NS_COEFFICIENTS", "NS_DTYPES", "SCALES", "Muon", "matrix_shape",
           "orthogonalize", "outer_layers", "update_scale"]

NSName = Literal["jordan", "muloco"]
ScaleName = Literal["jordan", "moonlight", "spectral"]
NSDtype = Literal["fp32", "bf16", "fp64"]

#: Newton-Schulz coefficient triples (a, b, c), one per step, and the normalisation epsilon.
NS_COEFFICIENTS: dict[str, tuple[tuple[tuple[float, float, float], ...], float]] = {
    # muon.py: one quintic, five times, "coefficients selected to maximize the slope at zero".
    "jordan": (((3.4445, -4.7750, 2.0315),) * 5, 1e-7),
    # The MuLoCo code's zeropower_via_newtonschulz5 (from Microsoft's Dion): a triple per step.
    "muloco": (((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)), 1e-8),
}
NS_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16,
                                     "fp64": torch.float64}
SCALES: tuple[str, ...] = ("jordan", "moonlight", "spectral")

#: Name patterns routed to AdamW by default: token and position embeddings, the LM head.
DEFAULT_EXCLUDE: tuple[str, ...] = ("*wte*", "*wpe*", "*embed*", "*lm_head*")


def outer_layers(module: nn.Module) -> tuple[str, ...]:
    """The names of ``module``'s weights that are not hidden layers, by their role whatever
    they are called: every ``nn.Embedding``'s, the input layer's (the first module, in
    registration order, that holds a weight of two or more dimensions: an embedding, or a
    network's first convolution) and the output layer's (the last such module: a classifier,
    an LM head; a head tied to the embedding is the embedding). Jordan's rule, "Muon should
    only be used for hidden weight layers", for any model, where :data:`DEFAULT_EXCLUDE` knows
    transformers' names only (an MNIST CNN's input convolution and classifier were Muon's).
    Registration order is forward order in the models exogym ships and in ``nn.Sequential``;
    a model that registers its layers out of order names them with ``optim.muon_exclude``."""
    canonical = {id(p): name for name, p in module.named_parameters()}
    weights = [(m, p) for m in module.modules() for p in m.parameters(recurse=False)
               if p.dim() >= 2 and id(p) in canonical]
    if not weights:
        return ()
    roles = [p for m, p in weights if isinstance(m, nn.Embedding)]
    roles += [weights[0][1], weights[-1][1]]
    return tuple(dict.fromkeys(canonical[id(p)] for p in roles))


def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    """``[rows, cols]`` of one node's tensor of ``shape`` (two or more dimensions):
    ``[shape[0], prod(shape[1:])]``, a conv kernel ``[out, in, kh, kw]`` as ``[out, in*kh*kw]``."""
    if len(shape) < 2:
        raise ValueError(f"Muon needs a tensor with >= 2 dimensions per node, got shape "
                         f"{tuple(shape)}")
    return int(shape[0]), math.prod(int(d) for d in shape[1:])


def update_scale(rows: int, cols: int, rule: str) -> float:
    """The factor ``s`` of the orthogonalised update of a ``rows x cols`` matrix (module doc)."""
    if rule == "jordan":
        return max(1.0, rows / cols) ** 0.5
    if rule == "moonlight":
        return 0.2 * math.sqrt(max(rows, cols))
    if rule == "spectral":
        return math.sqrt(rows / cols)
    raise ValueError(f"scale must be one of {list(SCALES)}, got {rule!r}")


def orthogonalize(u: Tensor, ns: str = "jordan", dtype: torch.dtype = torch.float32) -> Tensor:
    """``NS(u)`` of every matrix of the batch ``u`` (``[N, rows, cols]``), in ``u``'s dtype.

    The Frobenius norm is taken per matrix and every product is a batched ``matmul``, so row ``i``
    of the result depends on row ``i`` of ``u`` only.
    """
    if u.dim() != 3:
        raise ValueError(f"orthogonalize takes a batch of matrices [N, rows, cols], got shape "
                         f"{tuple(u.shape)}")
    if ns not in NS_COEFFICIENTS:
        raise ValueError(f"ns must be one of {sorted(NS_COEFFICIENTS)}, got {ns!r}")
    steps, eps = NS_COEFFICIENTS[ns]
    x = u.to(dtype)
    tall = u.shape[-2] > u.shape[-1]
    if tall:  # iterate on the wide side: X X^T is then the smaller Gram matrix
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)
    for a, b, c in steps:
        gram = x @ x.mT                                  # [N, r, r], r = min(rows, cols)
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    if tall:
        x = x.mT
    return x.to(u.dtype)


def _rows(mask: Tensor, like: Tensor) -> Tensor:
    """``mask`` ``[N]`` shaped to broadcast over ``like`` ``[N, *shape]``."""
    return mask.view(-1, *([1] * (like.dim() - 1)))


def _per_node(values: Tensor, like: Tensor) -> Tensor:
    """A per-node ``[N]`` float64 vector as ``like``'s dtype, shaped ``[N, 1, ...]``."""
    return _rows(values.to(like.dtype), like)


class Muon(torch.optim.Optimizer):
    """Muon for matrices, AdamW for the rest, over node-stacked parameters ``[N, *shape]``.

    Args:
        params: the node-stacked parameters (one tensor each, leading node dimension).
        lr: AdamW's learning rate (group 0).
        muon_lr: Muon's learning rate ``eta`` (group 1).
        momentum: Muon's ``mu``.
        nesterov: Nesterov momentum for Muon (``muon.py``'s default) or plain momentum.
        ns: Newton-Schulz coefficients, ``"jordan"`` or ``"muloco"``.
        ns_dtype: ``"fp32"``, ``"bf16"`` or ``"fp64"``: the precision of the iteration.
        scale: the update scale ``s``: ``"jordan"``, ``"moonlight"`` or ``"spectral"``.
        betas: AdamW's, for the parameters Muon leaves to it.
        eps: AdamW's.
        weight_decay: ``lambda``, decoupled, for both parts (``p <- p (1 - lr lambda)`` with each
            part's own learning rate).
        names: the parameters' names, in order (enables ``exclude``).
        exclude: ``fnmatch`` patterns of names that get AdamW even though they are matrices.
    """

    def __init__(
        self, params: Iterable[Tensor], *, lr: float = 1e-3, muon_lr: float = 0.02,
        momentum: float = 0.95, nesterov: bool = True, ns: NSName = "jordan",
        ns_dtype: NSDtype = "fp32", scale: ScaleName = "jordan",
        betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
        names: Sequence[str] | None = None, exclude: Sequence[str] = DEFAULT_EXCLUDE,
    ) -> None:
        params = list(params)
        if not params:
            raise ValueError("Muon got an empty parameter list")
        if names is not None and len(names) != len(params):
            raise ValueError(f"names must name every parameter: {len(params)} parameters, "
                             f"{len(names)} names")
        if ns not in NS_COEFFICIENTS:
            raise ValueError(f"ns must be one of {sorted(NS_COEFFICIENTS)}, got {ns!r}")
        if ns_dtype not in NS_DTYPES:
            raise ValueError(f"ns_dtype must be one of {sorted(NS_DTYPES)}, got {ns_dtype!r}")
        if scale not in SCALES:
            raise ValueError(f"scale must be one of {list(SCALES)}, got {scale!r}")
        matrices, others = [], []
        for i, p in enumerate(params):
            if not isinstance(p, Tensor) or p.dim() < 1:
                raise ValueError("Muon takes node-stacked tensors [N, *shape], got "
                                 f"{type(p).__name__} of shape {getattr(p, 'shape', None)}")
            name = names[i] if names is not None else None
            excluded = name is not None and any(fnmatch.fnmatchcase(name, pat) for pat in exclude)
            (matrices if p.dim() >= 3 and not excluded else others).append(p)
        groups = [
            {"params": others, "use_muon": False, "lr": lr},
            {"params": matrices, "use_muon": True, "lr": muon_lr},
        ]
        defaults = {"lr": lr, "momentum": momentum, "nesterov": nesterov, "ns": ns,
                    "ns_dtype": ns_dtype, "scale": scale, "betas": tuple(betas), "eps": eps,
                    "weight_decay": weight_decay}
        super().__init__(groups, defaults)

    @property
    def matrices(self) -> list[Tensor]:
        """The parameters Muon orthogonalises (group 1)."""
        return list(self.param_groups[1]["params"])

    @torch.no_grad()
    def step(  # type: ignore[override]
        self, closure: Callable[[], float] | None = None, active: Tensor | None = None,
    ) -> float | None:
        """One step of every node, or of the nodes where ``active`` (``[N]`` bool) is True.

        Returns the closure's loss, if a closure is given (torch's contract).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                mask = self._mask(active, p)
                state = self.state[p]
                if not state:
                    self._init_state(state, p, group["use_muon"])
                if group["use_muon"]:
                    self._muon(p, state, group, mask)
                else:
                    self._adamw(p, state, group, mask)
                step = state["step"]
                step.add_(1 if mask is None else mask.to(step.dtype))
        return loss

    # -- the two updates ---------------------------------------------------------------------------
    @staticmethod
    def _init_state(state: dict[str, Any], p: Tensor, use_muon: bool) -> None:
        state["step"] = torch.zeros(p.shape[0], dtype=torch.int64, device=p.device)
        if use_muon:
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        else:
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def _muon(self, p: Tensor, state: dict[str, Any], group: dict[str, Any],
              mask: Tensor | None) -> None:
        g, m = p.grad, state["momentum_buffer"]
        mu, lr = group["momentum"], group["lr"]
        m_new = torch.lerp(m, g, 1.0 - mu)                            # 1
        u = torch.lerp(g, m_new, mu) if group["nesterov"] else m_new  # 2
        rows, cols = matrix_shape(p.shape[1:])
        o = orthogonalize(u.reshape(p.shape[0], rows, cols), group["ns"],   # 3
                          NS_DTYPES[group["ns_dtype"]]).reshape(p.shape)
        s = update_scale(rows, cols, group["scale"])
        p_new = p * (1.0 - lr * group["weight_decay"]) - (lr * s) * o        # 4
        _commit(m, m_new, mask)
        _commit(p, p_new, mask)

    def _adamw(self, p: Tensor, state: dict[str, Any], group: dict[str, Any],
               mask: Tensor | None) -> None:
        g, m, v = p.grad, state["exp_avg"], state["exp_avg_sq"]
        beta1, beta2 = group["betas"]
        lr = group["lr"]
        t = (state["step"] + 1).to(torch.float64)  # this step's count, per node
        bc1, bc2 = 1.0 - beta1 ** t, 1.0 - beta2 ** t
        m_new = torch.lerp(m, g, 1.0 - beta1)
        v_new = torch.addcmul(v * beta2, g, g, value=1.0 - beta2)
        denom = v_new.sqrt() / _per_node(bc2.sqrt(), p) + group["eps"]
        p_new = p * (1.0 - lr * group["weight_decay"]) - _per_node(lr / bc1, p) * (m_new / denom)
        _commit(m, m_new, mask)
        _commit(v, v_new, mask)
        _commit(p, p_new, mask)

    @staticmethod
    def _mask(active: Tensor | None, p: Tensor) -> Tensor | None:
        if active is None:
            return None
        if active.shape != (p.shape[0],) or active.dtype != torch.bool:
            raise ValueError(f"active must be a bool tensor of shape [N={p.shape[0]}], got "
                             f"{active.dtype} {tuple(active.shape)}")
        return active.to(p.device)


def _commit(dst: Tensor, new: Tensor, mask: Tensor | None) -> None:
    """``dst <- new`` on every row, or on ``mask``'s rows only (the others keep their bits)."""
    if mask is None:
        dst.copy_(new)
    else:
        dst.copy_(torch.where(_rows(mask, dst), new, dst))
