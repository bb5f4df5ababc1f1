"""One optimizer step for some nodes only, each node with its own step count.

The inner optimizer is one ``torch.optim`` optimizer over node-stacked parameters, so one
``step()`` moves every node's row and counts one step for all of them (the ``step`` in Adam's
bias correction is one number per parameter tensor). In a world where nodes fail, or fall behind
(shared/DESIGN.md section 7), only the nodes that computed may move, and a node that missed
steps must keep its own count: its bias correction ``1 - beta ** t`` uses its own ``t``.

:func:`masked_step` does that for :class:`torch.optim.AdamW`, :class:`torch.optim.Adam` and
:class:`torch.optim.SGD` (momentum and Nesterov included) with the formulas of
``torch/optim/adamw.py``, ``adam.py`` and ``sgd.py`` (PyTorch 2.x, their defaults: no amsgrad,
no maximize, dampening 0), computed for every row and written back only into the active rows:
the optimizer's own state tensors (``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``) are updated
in place, so the two paths share one state. The per-node counts are kept by the caller (the
strategy's ``node_steps``, ``[n_local]`` int64). An optimizer with its own masked step (exogym's
Muon: ``step(active=...)``) is handed the mask instead. Checked against ``torch.optim`` run on
each node alone, to 1e-12 in float64 (tests/test_masked_optim.py).
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
    counts += active.cpu().long()
    t_max = float(counts.max())  # on the CPU: no device sync per parameter
    on_device: dict[torch.device, tuple[Tensor, Tensor]] = {}  # the mask and counts, moved once
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.device not in on_device:
                on_device[p.device] = (active.to(p.device),
                                       counts.to(device=p.device, dtype=torch.float64))
            rows, steps = on_device[p.device]
            keep = rows.view(-1, *([1] * (p.dim() - 1)))
            t = steps.view_as(keep)
            if isinstance(optimizer, torch.optim.SGD):
                _sgd(optimizer, group, p, keep, t)
            else:
                _adam(optimizer, group, p, keep, t, t_max)


def _adam(optimizer: torch.optim.Optimizer, group: dict, p: Tensor, keep: Tensor,
          t: Tensor, t_max: float) -> None:
    """Adam / AdamW (torch's single-tensor formulas) for the rows ``keep``; ``t`` the rows'
    step counts after this step (float64, ``[n, 1, ...]``), ``t_max`` the largest."""
    if group.get("amsgrad") or group.get("maximize"):
        raise TypeError("masked steps support Adam/AdamW without amsgrad and maximize")
    lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
    beta1, beta2 = group["betas"]
    state = optimizer.state[p]
    if not state:  # the first step of any row: torch's own initial state
        state["step"] = torch.tensor(0.0)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    m, v = state["exp_avg"], state["exp_avg_sq"]
    grad = p.grad
    param = p.detach()
    if isinstance(optimizer, torch.optim.AdamW):
        decayed = param * (1 - lr * wd)
    else:
        decayed = param
        if wd != 0:
            grad = grad.add(param, alpha=wd)
    new_m = m.lerp(grad, 1 - beta1)
    new_v = v.mul(beta2).addcmul_(grad, grad, value=1 - beta2)
    bc1 = 1 - torch.pow(beta1, t)
    bc2_sqrt = torch.sqrt(1 - torch.pow(beta2, t))
    step_size = (lr / bc1).to(p.dtype)
    denom = (new_v.sqrt() / bc2_sqrt.to(p.dtype)).add_(eps)
    new_p = decayed - step_size * (new_m / denom)
    m.copy_(torch.where(keep, new_m, m))
    v.copy_(torch.where(keep, new_v, v))
    param.copy_(torch.where(keep, new_p, param))
    # torch's scalar count stays the largest row's, so that its own step() after the rows agree
    # again (the fast path of the caller) continues from the right number
    state["step"].fill_(t_max)


def _sgd(optimizer: torch.optim.Optimizer, group: dict, p: Tensor, keep: Tensor,
         t: Tensor) -> None:
    """SGD with momentum, dampening and Nesterov as torch computes them, for the rows
    ``keep``; a row's first step (``t == 1``) starts its momentum buffer at its gradient."""
    if group.get("maximize"):
        raise TypeError("masked steps support SGD without maximize")
    lr, wd, momentum = group["lr"], group["weight_decay"], group["momentum"]
    dampening, nesterov = group["dampening"], group["nesterov"]
    param = p.detach()
    grad = p.grad if wd == 0 else p.grad.add(param, alpha=wd)
    if momentum != 0:
        state = optimizer.state[p]
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = state["momentum_buffer"] = torch.zeros_like(param)
        first = (t == 1).to(p.device)
        new_buf = torch.where(first, grad, buf * momentum + grad * (1 - dampening))
        buf.copy_(torch.where(keep, new_buf, buf))
        grad = grad.add(new_buf, alpha=momentum) if nesterov else new_buf
    param.copy_(torch.where(keep, param - lr * grad, param))
