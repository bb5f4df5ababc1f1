"""Streaming DiLoCo: DiLoCo that syncs one fragment of the model at a time, quantized, overlapped.

Reference: A. Douillard, Y. Donchev, K. Rush, S. Kale, Z. Charles, Z. Garrett, G. Teston,
D. Lacey, R. McIlroy, J. Shen, A. Ramé, A. Szlam, M. Ranzato, P. Barham, "Streaming DiLoCo with
overlapping communication: Towards a Distributed Free Lunch", arXiv:2501.18512 (Algorithm 2),
which extends DiLoCo (Douillard et al., arXiv:2311.08105) in three ways:

1. **Streaming partial updates.** The parameters are split into ``P`` fragments of "layers",
   strided: layer ``i`` goes to fragment ``i mod P`` (the paper's strided pattern, at transformer
   block granularity). Here a *layer* is a module that owns parameters (a ``Linear``, a ``Conv2d``,
   a norm), taken in the order the model registers them; modules that own only floating-point
   buffers follow, so every float buffer belongs to exactly one fragment. Fragment ``p`` is
   synchronised every ``H`` inner steps at the offset ``t_p = floor(p H / P)``: with ``t`` the
   number of inner steps taken (``t = step + 1``), fragment ``p`` starts a sync after inner step
   ``t`` when ``t >= 1`` and ``t = t_p (mod H)``. So over each window of ``H`` steps fragments
   ``1, 2, ..., P-1`` sync at ``t_1, ..., t_{P-1}`` and fragment 0 closes it at ``t = H, 2H...``
   (``P = 1`` is DiLoCo's schedule).
2. **Quantized outer gradients.** At the sync start every node ``m`` sends its fragment's
   pseudo-gradient ``Delta_{m,p} = theta_p - theta_{m,p}^(t)`` (``theta_p``: the global fragment
   from this fragment's previous outer step) through the transport codec ``quantization``
   (default ``"fp4"``: FP4 E3M0, see :class:`exogym.sim.codecs.FP4Codec`); the reconstructions are
   averaged in fp32, ``Delta_p = (1/M) sum_m Q(Delta_{m,p})``, and the outer optimizer runs in
   full precision.
3. **Overlapping communication.** The nodes keep training for ``tau`` inner steps while the
   all-reduce is in flight (``tau = 0``: blocking). The outer step is
   ``theta_p <- OuterOpt_p(theta_p, Delta_p)``, Nesterov SGD as in DiLoCo (torch's form:
   ``b <- mu b + Delta_p; theta_p <- theta_p - eta (Delta_p + mu b)``, first step ``b = Delta_p``),
   one outer optimizer per fragment. After inner step ``t + tau`` every node merges the new global
   fragment into its local one: ``theta_{m,p} <- alpha theta_{m,p} + (1 - alpha) theta_p``.
   ``alpha = 0`` discards the ``tau`` steps of local progress on that fragment (the other
   fragments keep theirs), ``alpha = 1`` would never adopt the global fragment.

The outer step only reads values fixed at the sync start (``theta_p`` and ``Delta_p``), and
fragment ``p`` is not touched again before ``t + H``; so computing it at the sync start, as done
here, gives the same numbers as computing it on receipt at ``t + tau`` as Algorithm 2 writes. The
global model (:meth:`global_state`, for evaluation) is every fragment's latest outer value, hence
includes a sync still "in flight" (what one would deploy after waiting for it). Between syncs each
node keeps its own inner optimizer state, as in DiLoCo.

Floating-point buffers (BatchNorm statistics; the paper's transformers have none) ride with their
module's fragment: averaged across nodes, in full precision, at the fragment's sync start, merged
into every node with the same ``alpha`` at ``t + tau`` and copied into the global model; integer
buffers (counters) are node 0's.

The paper's settings: ``H = 100``, fragments of a few transformer blocks, an overlap ``tau`` of a
few inner steps, FP4 E3M0 outer gradients, outer Nesterov SGD. Defaults here: ``H = 100``,
``P = 2``, ``tau = 1``, ``alpha = 0.5``, ``"fp4"``, outer learning rate 0.7 and momentum 0.9
(DiLoCo's).

Sent per sync of fragment ``p`` by each node: ``2 (N-1)/N * (S_p + B_p)`` bytes (ring all-reduce)
with ``S_p = sum over the fragment's tensors of codec.payload_bytes(numel, dtype)``: for ``"fp4"``
``ceil(numel / 2) + 4`` bytes per tensor (4-bit codes, one fp32 scale), ``4 numel`` for fp32
(``quantization=None``); ``B_p`` = the fragment's float buffers in full precision, a separate
all-reduce tagged ``fragment{p}/buffers``. Every fragment syncs once per ``H`` steps, so the
average is ``2 (N-1)/N * (sum_p S_p + B) / H`` bytes per step: about ``1/8`` of DiLoCo's with fp4,
and the peak (one sync) is one fragment's share, about ``1/P`` of the model for balanced
fragments. (A sparse codec, e.g. ``"topk:0.1"``, travels as an all-gather: ``(N-1) * S_p``.)
Each all-reduce is logged with
``overlap = tau > 0`` (it runs under the compute of the next ``tau`` steps) and tag
``fragment{p}``.

Absent nodes (a world): a fragment's sync averages the nodes whose pseudo-gradients arrive (a ring
among those ``M``) and only they merge the new global fragment ``tau`` steps later; the others
keep their local fragment. A node back up receives every global fragment and the outer
optimizers' momenta from a live peer.

MNIST CNN (215,370 fp32 parameters in 8 tensors of 4 layers, no buffers), ``N = 4``, defaults
(``P = 2``, fp4): fragment 0 = conv1 + fc1 (201,248 parameters, ``S_0`` = 100,640 bytes), fragment 1
= conv2 + fc2 (14,122 parameters, ``S_1`` = 7,077 bytes): 150,960 and 10,615.5 bytes per node per
sync, 161,575.5 bytes per ``H = 100`` steps = 1,615.8 bytes per step (DiLoCo in fp32: 12,922.2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from exogym.sim.codecs import Codec, make_codec
from exogym.strategy.base import StackedStrategy, in_range, optimizer_tensors, positive_int

__all__ = ["StreamingDiLoCo", "strided_fragments"]


def strided_fragments(layers: list[list[str]], P: int) -> list[list[str]]:
    """Layer ``i`` (a list of tensor names) goes to fragment ``i mod P``; names kept in order."""
    if len(layers) < P:
        raise ValueError(
            f"P={P} fragments need at least {P} layers (modules owning parameters or float "
            f"buffers), "
            f"the model has {len(layers)}"
        )
    fragments: list[list[str]] = [[] for _ in range(P)]
    for i, names in enumerate(layers):
        fragments[i % P].extend(names)
    return fragments


def _owner(name: str) -> str:
    """The module that owns tensor ``name`` (``"head.1.weight"`` -> ``"head.1"``)."""
    return name.rpartition(".")[0]


def _group_by_owner(names: list[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(_owner(name), []).append(name)
    return groups


@dataclass(kw_only=True)
class StreamingDiLoCo(StackedStrategy):
    """DiLoCo with P strided fragments synced in turn, FP4 pseudo-gradients, overlapped syncs.

    Attributes:
        H: inner steps between two syncs of the same fragment (the paper's H; 100 in the paper).
        P: number of fragments; fragment p syncs at the offset floor(p H / P) (P <= H).
        tau: inner steps a sync overlaps with before its outer update is merged
            (0 <= tau < H // P; 0 = blocking).
        alpha: mixing factor of the merge, local <- alpha local + (1 - alpha) global
            (0 = take the global fragment).
        quantization: transport codec of the pseudo-gradients (exogym.sim.codecs spec: "fp4" is
            FP4 E3M0 as in the paper; "int8", "fp16", ...; None = fp32).
        outer_lr: the outer optimizer's learning rate (eta).
        outer_momentum: the outer optimizer's momentum (mu).
        nesterov: Nesterov momentum for the outer SGD (the paper's choice); False gives heavy-ball.
    """

    id = "streaming_diloco"
    H: int = 100
    P: int = 2
    tau: int = 1
    alpha: float = 0.5
    quantization: str | None = "fp4"
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True

    def __post_init__(self) -> None:
        # The transport codec is `quantization` (the paper's knob), built by _make_codec below;
        # the base class's `codec` field would be a second name for it.
        if self.codec is not None:
            raise ValueError(
                f"StreamingDiLoCo sends its pseudo-gradients through quantization=..., not "
                f"codec=...: set quantization={self.codec!r} (got codec={self.codec!r}); "
                f"allowed: codec=None"
            )
        try:
            make_codec(self.quantization, error_feedback=self.error_feedback)
        except ValueError as err:
            raise ValueError(f"quantization={self.quantization!r}: {err}") from None
        super().__post_init__()
        positive_int("H", self.H)
        positive_int("P", self.P)
        if self.P > self.H:
            raise ValueError(
                f"P must be <= H (at most one fragment starts a sync per step), got P={self.P} "
                f"with H={self.H}"
            )
        if (isinstance(self.tau, bool) or not isinstance(self.tau, int)
                or not 0 <= self.tau < self.H // self.P):
            raise ValueError(
                f"tau must be an integer with 0 <= tau < H // P = {self.H // self.P} (a sync must "
                f"land before the next fragment's starts), got {self.tau!r}"
            )
        in_range("alpha", self.alpha, 0.0, 1.0)
        in_range("outer_lr", self.outer_lr, 0.0, float("inf"), lo_open=True)
        in_range("outer_momentum", self.outer_momentum, 0.0, 1.0, hi_open=True)
        if self.nesterov and self.outer_momentum == 0.0:
            raise ValueError("nesterov=True needs outer_momentum > 0")

    def _make_codec(self) -> Codec | None:
        """The pseudo-gradients' transport codec, from ``quantization`` (fresh for every run)."""
        return make_codec(self.quantization, error_feedback=self.error_feedback,
                          seed=self.codec_seed)

    # -- schedule -------------------------------------------------------------------------------
    @property
    def offsets(self) -> list[int]:
        """``t_p = floor(p H / P)``: fragment ``p`` syncs after inner step ``t = t_p (mod H)``."""
        return [p * self.H // self.P for p in range(self.P)]

    def fragment_syncing(self, t: int) -> int | None:
        """The fragment whose sync starts after inner step ``t`` (1-based), or None."""
        if t < 1:
            return None
        r = t % self.H
        # floor(p H / P) = r  <=>  r P / H <= p < (r + 1) P / H: the candidate is ceil(r P / H).
        p = -(-r * self.P // self.H)
        return p if p < self.P and p * self.H // self.P == r else None

    # -- state ----------------------------------------------------------------------------------
    def init_state(self) -> None:
        nodes = self.nodes
        param_layers = _group_by_owner(list(nodes.params))
        buffer_layers = _group_by_owner(list(nodes.float_buffers))
        layers = [names + buffer_layers.pop(owner, []) for owner, names in param_layers.items()]
        layers += list(buffer_layers.values())  # modules with float buffers and no parameters
        fragments = strided_fragments(layers, self.P)
        self.fragment_params = [[k for k in f if k in nodes.params] for f in fragments]
        self.fragment_buffers = [[k for k in f if k not in nodes.params] for f in fragments]
        self.int_buffers = [k for k, b in nodes.buffers.items() if not b.is_floating_point()]

        state = nodes.node_state(0)
        self.global_params = {k: state[k].clone() for k in nodes.params}
        self.global_buffers = {k: state[k].clone() for k in nodes.buffers}
        # One outer optimizer per fragment (None for a fragment of buffers only): fragments
        # step at different times, each on its own Nesterov momentum.
        self.outer_optimizers = [
            torch.optim.SGD([self.global_params[k] for k in names], lr=self.outer_lr,
                            momentum=self.outer_momentum, nesterov=self.nesterov)
            if names else None
            for names in self.fragment_params
        ]
        # inner step t -> (fragment to merge after it, the nodes that took part in its sync;
        # None: all)
        self._merges: dict[int, tuple[int, list[bool] | None]] = {}

    # -- the step -------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, step: int) -> None:
        self.inner_step()
        t = step + 1
        p = self.fragment_syncing(t)
        if p is not None:
            members = self.arrivals()
            if members is None or any(members):
                self._start_sync(p, members)
                self._merges[t + self.tau] = (p, members)
        merge = self._merges.pop(t, None)
        if merge is not None:
            self._merge(*merge)

    @torch.no_grad()
    def _start_sync(self, p: int, members: list[bool] | None = None) -> None:
        """All-reduce fragment ``p``'s quantized pseudo-gradient among ``members`` (None: all),
        step its global copy."""
        nodes, overlap = self.nodes, self.tau > 0
        names, outer = self.fragment_params[p], self.outer_optimizers[p]
        if outer is not None:
            # Delta_{m,p} = theta_p - theta_{m,p}, node-stacked [N, *shape].
            pseudo = [self.global_params[k].unsqueeze(0) - nodes.params[k] for k in names]
            reduced = self.comm.all_reduce(pseudo, "mean", tag=f"fragment{p}", overlap=overlap,
                                           codec=self.transport_codec, members=members)
            for k, delta in zip(names, reduced, strict=True):
                self.global_params[k].grad = delta
            outer.step()
            outer.zero_grad(set_to_none=True)

        buffers = self.fragment_buffers[p]
        if buffers:
            means = self.comm.all_reduce([nodes.buffers[k] for k in buffers], "mean",
                                         tag=f"fragment{p}/buffers", overlap=overlap,
                                         members=members)
            for k, mean in zip(buffers, means, strict=True):
                self.global_buffers[k].copy_(mean)
        for k in self.int_buffers:
            self.global_buffers[k].copy_(nodes.buffers[k][0])

    @torch.no_grad()
    def _merge(self, p: int, members: list[bool] | None = None) -> None:
        """``theta_{m,p} <- alpha theta_{m,p} + (1 - alpha) theta_p`` on every node that took
        part in the fragment's sync (``members``; None: all)."""
        pairs = [(self.nodes.params[k], self.global_params[k]) for k in self.fragment_params[p]]
        pairs += [(self.nodes.buffers[k], self.global_buffers[k]) for k in self.fragment_buffers[p]]
        keep = None if members is None else self.comm.local_rows(members, self.nodes.device)
        for local, glob in pairs:
            if keep is not None:
                merged = local * self.alpha + glob * (1.0 - self.alpha)
                local.copy_(torch.where(keep.view(-1, *([1] * (local.dim() - 1))), merged, local))
            elif self.alpha == 0.0:
                local.copy_(glob.expand_as(local))
            else:
                local.mul_(self.alpha).add_(glob, alpha=1.0 - self.alpha)

    def recover(self, node: int, donor: int) -> None:
        """A node back up gets every global fragment and their outer optimizers' momenta, and
        the donor's inner optimizer state (``recovery="copy"``) or a fresh one."""
        shared = [t for opt in self.outer_optimizers if opt is not None
                  for t in optimizer_tensors(opt)]
        self.recover_from_global(node, donor, self.global_params, self.global_buffers, shared)

    @property
    def overlap_steps(self) -> int | None:
        """The fragment all-reduce overlaps ``tau`` steps of compute (the paper's overlap)."""
        return self.tau

    def global_state(self) -> dict[str, Tensor]:
        out = {k: v.clone() for k, v in self.global_params.items()}
        out.update({k: v.clone() for k, v in self.global_buffers.items()})
        return out
