"""One optimizer step for some nodes only, each node with its own step count.

The inner optimizer is one ``torch.optim`` optimizer over node-stacked parameters, so one
``step()`` moves every node's row and counts one step for all of them (the ``step`` in Adam's
bias correction is one number per parameter tensor). In a world where nodes fail, or fall behind
(docs/design/world.md), only the nodes that computed may move, and a node that missed
steps must keep its own count: its bias correction ``1 - beta ** t`` uses its own ``t``.

:func:`masked_step` does that for :class:`torch.optim.AdamW`, :class:`torch.optim.Adam` and
:class:`torch.optim.SGD` (momentum and Nesterov included) with the formulas of
``torch/optim/adamw.py``, ``adam.py`` and ``sgd.py`` (PyTorch 2.x, their defaults: no amsgrad,
no maximize, dampening 0), computed on the active rows' views only (a fused Adam/AdamW group:
torch's fused kernel on those views, each row with its own step count; otherwise foreach
operations):
the optimizer's own state tensors (``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``) are updated
in place, so the two paths share one state. The per-node counts are kept by the caller (the
strategy's ``node_steps``, ``[n_local]`` int64). An optimizer with its own masked step (exogym's
Muon: ``step(active=...)``) is handed the mask instead. Checked against ``torch.optim`` run on
each node alone, to 1e-12 in float64 (tests/strategy/test_masked_optim.py).
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor

__all__ = ["masked_step", "supports_masked_step"]


def supports_masked_step(optimizer: torch.optim.Optimizer) -> bool:
    """Whether :func:`masked_step` can step ``optimizer`` for a subset of nodes."""
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)):
        return True
    return "active" in inspect.signature(optimizer.step).parameters


@torch.no_grad()
def masked_step(optimizer: torch.optim.Optimizer, active: Tensor, counts: Tensor) -> None:
    """One step of ``optimizer`` (over node-stacked parameters ``[n, ...]``) for the nodes in
    ``active`` (``[n]`` bool) only; ``counts`` (``[n]`` int64, on the CPU) are the nodes' step
    counts before this step and are incremented for the active rows.

    Raises:
        TypeError: an optimizer that cannot step a subset of nodes.
    """
    if not supports_masked_step(optimizer):
        raise TypeError(f"{type(optimizer).__name__} cannot step a subset of the nodes; exogym "
                        "steps AdamW, Adam, SGD and its Muon so")
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)):
        optimizer.step(active=active)  # type: ignore[call-arg]
        counts += active.cpu().long()
        return
    rows = [i for i, a in enumerate(active.tolist()) if a]  # one host read per step
    counts += active.cpu().long()
    t = counts.to(torch.float64)  # the rows' counts after this step, on the CPU
    for group in optimizer.param_groups:
        params = [p for p in group["params"] if p.grad is not None]
        if isinstance(optimizer, torch.optim.SGD):
            _sgd(optimizer, group, params, rows, t)
        else:
            _adam(optimizer, group, params, rows, t)


def _adam(optimizer: torch.optim.Optimizer, group: dict, params: list[Tensor], rows: list[int],
          t: Tensor) -> None:
    """Adam / AdamW (torch's single-tensor formulas) on the ``rows`` of ``params``, as foreach
    operations over the rows' views, in place; ``t``: every row's step count after this step
    (float64, on the CPU)."""
    if group.get("amsgrad") or group.get("maximize"):
        raise TypeError("masked steps support Adam/AdamW without amsgrad and maximize")
    lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
    beta1, beta2 = group["betas"]
    ps: list[Tensor] = []
    grads: list[Tensor] = []
    ms: list[Tensor] = []
    vs: list[Tensor] = []
    sizes: list[float] = []  # lr / (1 - beta1^t), in the parameter's dtype, per view
    bc2: list[float] = []  # sqrt(1 - beta2^t), in the parameter's dtype, per view
    step_size = lr / (1 - torch.pow(beta1, t))
    bc2_sqrt = torch.sqrt(1 - torch.pow(beta2, t))
    t_max = float(t.max())
    for p in params:
        state = optimizer.state[p]
        if not state:  # the first step of any row: torch's own initial state
            state["step"] = _initial_step(group, p)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        # torch's scalar count stays the largest row's, so that its own step() after the rows
        # agree again (the fast path of the caller) continues from the right number
        state["step"].fill_(t_max)
        sz, b2 = step_size.to(p.dtype).tolist(), bc2_sqrt.to(p.dtype).tolist()
        for i in rows:
            ps.append(p.detach()[i])
            grads.append(p.grad[i])
            ms.append(state["exp_avg"][i])
            vs.append(state["exp_avg_sq"][i])
            sizes.append(sz[i])
            bc2.append(b2[i])
    if not ps:
        return
    if group.get("fused"):  # torch's own fused kernel on each row's views: a row steps exactly
        # as that node alone would under torch's fused optimizer (and ~10x faster than the
        # foreach formulas below, which make a pass over the rows per operation)
        steps = [torch.tensor(float(t[i]), dtype=torch.float32, device=ps[0].device)
                 for _ in params for i in rows]
        fused = (torch._fused_adamw_ if isinstance(optimizer, torch.optim.AdamW)
                 else torch._fused_adam_)
        fused(ps, grads, ms, vs, [], steps, lr=lr, beta1=beta1, beta2=beta2,
              weight_decay=wd, eps=eps, amsgrad=False, maximize=False)
        return
    if isinstance(optimizer, torch.optim.AdamW):
        decayed = torch._foreach_mul(ps, 1 - lr * wd)
    else:
        decayed = ps
        if wd != 0:
            grads = torch._foreach_add(grads, ps, alpha=wd)
    torch._foreach_lerp_(ms, grads, 1 - beta1)
    torch._foreach_mul_(vs, beta2)
    torch._foreach_addcmul_(vs, grads, grads, value=1 - beta2)
    denom = torch._foreach_sqrt(vs)
    torch._foreach_div_(denom, bc2)
    torch._foreach_add_(denom, eps)
    update = torch._foreach_div(ms, denom)
    torch._foreach_mul_(update, sizes)
    new = torch._foreach_sub(decayed, update)
    torch._foreach_copy_(ps, new)


def _initial_step(group: dict, p: Tensor) -> Tensor:
    """Adam's step count as ``torch/optim/adam.py`` creates it: on the parameter's device in
    float32 for a fused (or capturable) group, whose kernel reads it there; otherwise a CPU
    scalar of the default float dtype."""
    if group.get("fused") or group.get("capturable"):
        return torch.zeros((), dtype=torch.float32, device=p.device)
    dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    return torch.tensor(0.0, dtype=dtype)


def _sgd(optimizer: torch.optim.Optimizer, group: dict, params: list[Tensor], rows: list[int],
         t: Tensor) -> None:
    """SGD with momentum, dampening and Nesterov as torch computes them, on the ``rows`` of
    ``params`` (foreach over the rows' views, in place); a row's first step (``t == 1``) starts
    its momentum buffer at its gradient."""
    if group.get("maximize"):
        raise TypeError("masked steps support SGD without maximize")
    lr, wd, momentum = group["lr"], group["weight_decay"], group["momentum"]
    dampening, nesterov = group["dampening"], group["nesterov"]
    ps = [p.detach()[i] for p in params for i in rows]
    if not ps:
        return
    grads = [p.grad[i] for p in params for i in rows]
    if wd != 0:
        grads = torch._foreach_add(grads, ps, alpha=wd)
    if momentum != 0:
        bufs = []
        for p in params:
            state = optimizer.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p.detach())
            bufs += [state["momentum_buffer"][i] for i in rows]
        first = [float(t[i]) == 1.0 for _ in params for i in rows]
        new_bufs = torch._foreach_mul(bufs, momentum)
        torch._foreach_add_(new_bufs, torch._foreach_mul(grads, 1 - dampening))
        new_bufs = [g if f else b for g, b, f in zip(grads, new_bufs, first, strict=True)]
        torch._foreach_copy_(bufs, new_bufs)
        grads = torch._foreach_add(grads, bufs, alpha=momentum) if nesterov else bufs
    torch._foreach_sub_(ps, torch._foreach_mul(grads, lr))
