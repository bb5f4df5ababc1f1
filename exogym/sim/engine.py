"""Node-stacked replicas: N copies of one ``nn.Module`` trained in one process.

Every parameter, gradient and buffer of the user's model is held as ONE tensor with a leading node
dimension, ``[N, *shape]``. Node ``i``'s forward pass is the unmodified module run on row ``i``
(the loop and threads engines bind the node's views into the module for the call,
:mod:`exogym.sim.binding`; vmap calls ``torch.func.functional_call`` on the stacked tensors), either

- ``loop``: a Python loop over nodes, each node's forward *and backward* in turn, so that only one
  node's activations are alive at a time (memory grows with N only through parameters and optimizer
  state). Each node's parameters are views of the stacked tensors whose ``.grad`` is preset to a
  view of the stacked gradient, so autograd accumulates straight into ``grads[name][i]``.
- ``vmap``: ``torch.func.vmap`` over the node dimension with ``randomness="different"`` (every node
  draws its own dropout masks), then one backward over the sum of the node losses. The nodes are
  independent, so each row of the gradient is exactly that node's gradient.
- ``threads`` (CPU): the loop's per-node forward and backward, run concurrently by
  ``min(N, P)`` workers (the calling thread and ``min(N, P) - 1`` threads) that share the
  process's ``P`` intra-op threads
  (:mod:`exogym.sim.threads`): every core busy on its own node, as a process per node would be,
  in one process. Each node draws its random numbers from its own generator, seeded each step
  from the global generator's state, so the numbers do not depend on thread timing.

The engines give the same numbers (to float round-off: the threads engine's kernels run with
fewer intra-op threads and may sum in another order) for models without randomness; with
dropout, the loop engine consumes the global RNG node by node, exactly like N separate
``nn.Module`` copies run one after the other, and vmap and threads draw other masks of the same
distribution. On a GPU vmap turns N small models into one batched kernel stream; on a CPU with
several cores, threads is the fastest (docs/benchmarks/engines-cpu2-202611.md). ``auto`` picks vmap
on CUDA, threads on a CPU for N >= 2 when torch has 2 or more intra-op threads, else the loop. If
the model cannot run under vmap (``.item()``, data-dependent control flow, in-place writes of
batched values into fresh tensors), the first step falls back to the loop with a warning; if it
draws from the global generator where threads cannot give each node its own
(``nn.MultiheadAttention``'s dropout, ``F.gumbel_softmax``), likewise (``auto``: a log line, no
warning).

Model contract: ``model(batch)`` returns a scalar loss tensor, a mapping with a scalar ``"loss"``
entry (a dict, or a Hugging Face ``ModelOutput``), or an object with a scalar ``.loss`` attribute.
A batch that is a mapping whose keys are all keyword parameters of the model's ``forward``
(``input_ids``, ``attention_mask``, ``labels`` for a Hugging Face model) is passed as keyword
arguments, ``model(**batch)`` (:func:`call_model`).
Other scalar entries of a mapping (``"accuracy"``) are metrics; non-scalar entries (logits, hidden
states) and non-numbers are ignored (:func:`metrics_of`).

Two options, the same in both engines:

- ``micro_batch_size=m`` (gradient accumulation, for memory): each node's batch of ``B`` rows is
  cut along the batch dimension into ``ceil(B / m)`` micro-batches of ``m`` rows, the last one
  holding the remaining ``B mod m`` rows when ``m`` does not divide ``B``. Micro-batch ``k`` of
  ``b_k`` rows runs forward and backward on its own with its loss scaled by ``b_k / B``, so only
  one micro-batch's activations are alive at a time and the gradient accumulates to that of
  ``sum_k (b_k / B) * loss_k``, the reported loss. That is the full-batch loss and gradient (to
  round-off) when the loss is a mean over samples that do not interact, as a cross-entropy over
  the batch is, and not otherwise: BatchNorm normalises each micro-batch with its own statistics
  (and updates its running statistics once per micro-batch); a loss summed over samples, or
  averaged over a varying number of tokens per sample, is re-weighted by rows. Dropout masks are
  drawn per micro-batch: the same distribution as a whole-batch step, other numbers. ``m >= B``
  (or None) runs the batch whole, the code path and numbers of no micro-batching.
- ``precision="bf16"``: each forward runs under ``torch.autocast(device.type, torch.bfloat16)``,
  each backward outside it (autocast's rule); parameters, gradients and optimizer state stay fp32
  and the returned losses are fp32. Under vmap, autocast sees the operations vmap decomposes a
  layer into, not the layer (pytorch/pytorch#192617): an ``nn.Linear`` with a bias multiplies in
  bf16 but adds the bias in fp32, and on CPU ``F.cross_entropy`` of bf16 logits runs in bf16
  where the loop engine runs it in fp32. The two engines then agree only to bf16 round-off.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.utils._pytree import tree_flatten, tree_map

from exogym.sim.binding import bound
from exogym.sim.threads import (
    NodePool,
    NodeRandomness,
    intra_op_threads,
    node_seeds,
    pool_shape,
)

__all__ = [
    "ENGINES", "PRECISIONS", "EngineName", "NodeStack", "Precision", "available_memory",
    "call_model", "check_memory", "loss_of", "metrics_of", "resolve_device", "run_model",
    "same_device", "stack_bytes",
]

EngineName = Literal["auto", "loop", "vmap", "threads"]
ENGINES = ("auto", "loop", "vmap", "threads")
DEVICES = ("auto", "cpu", "cuda", "mps")
Precision = Literal["fp32", "bf16"]
PRECISIONS = ("fp32", "bf16")

log = logging.getLogger("exogym")


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto`` -> cuda if available, else mps, else cpu. ``cuda:1`` style indices are kept."""
    if isinstance(device, torch.device):
        return device
    kind = device.split(":")[0]
    if kind not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES} (optionally 'cuda:N'), got {device!r}")
    if kind == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but torch.cuda.is_available() is False")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device 'mps' was asked for, but MPS is not available here")
    return torch.device(device)


_CONTRACT = ("model(batch) must return a scalar loss tensor, a mapping with a scalar 'loss' entry "
             "(a dict, or a Hugging Face ModelOutput), or an object with a scalar .loss attribute")


def same_device(a: Any, b: Any) -> bool:
    """Whether two device specs name the same device (``"cpu"`` and ``torch.device("cpu")``);
    ``"auto"`` and ``""`` name themselves."""
    if str(a) in ("auto", "") or str(b) in ("auto", ""):
        return str(a) == str(b)
    try:
        return torch.device(a) == torch.device(b)
    except (RuntimeError, TypeError):
        return a == b


def _entries(out: Any) -> Mapping[str, Any] | None:
    """The named entries of a model output: a mapping as is (``transformers``' ``ModelOutput`` is
    an ``OrderedDict``), ``{"loss": out.loss}`` for another object with a ``loss`` attribute,
    None for a bare tensor."""
    if isinstance(out, Mapping):
        return out
    if not isinstance(out, Tensor) and hasattr(out, "loss"):
        return {"loss": out.loss}
    return None


def _is_scalar(value: Any) -> bool:
    return (isinstance(value, Tensor) and value.numel() == 1 and value.dtype != torch.bool) or (
        isinstance(value, (int, float)) and not isinstance(value, bool))


def _keyword_batch(module: nn.Module, batch: Any) -> bool:
    """Whether ``batch`` goes to ``module`` as keyword arguments: a non-empty mapping whose keys
    are all names of ``forward``'s keyword parameters."""
    if not isinstance(batch, Mapping) or not batch:
        return False
    names = _KEYWORDS.get(type(module))
    if names is None:
        try:
            params = inspect.signature(module.forward).parameters.values()
        except (TypeError, ValueError):  # a forward without a signature: positional
            params = []  # type: ignore[assignment]
        names = _KEYWORDS[type(module)] = frozenset(
            p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                  inspect.Parameter.KEYWORD_ONLY))
    return all(isinstance(k, str) and k in names for k in batch)


_KEYWORDS: dict[type, frozenset[str]] = {}  # forward's keyword parameters, by module class


def call_model(module: nn.Module, state: Any, batch: Any, tie_weights: bool = True) -> Any:
    """``module``'s output on ``batch`` with the tensors ``state`` (``functional_call``):
    ``module(**batch)`` for a mapping of its ``forward``'s keyword parameters (a Hugging Face
    model's ``input_ids``, ``labels``, ...), else ``module(batch)``."""
    if _keyword_batch(module, batch):
        return functional_call(module, state, (), dict(batch), tie_weights=tie_weights)
    return functional_call(module, state, (batch,), tie_weights=tie_weights)


def run_model(module: nn.Module, batch: Any) -> Any:
    """``module`` called on ``batch`` with its own tensors, as :func:`call_model` calls it."""
    return module(**batch) if _keyword_batch(module, batch) else module(batch)


def loss_of(out: Any) -> Tensor:
    """The loss in a model's output: the output itself, ``out["loss"]`` or ``out.loss``."""
    entries = _entries(out)
    if entries is not None:
        if entries.get("loss") is None:  # a ModelOutput leaves out its None entries
            keys = sorted(str(k) for k, v in entries.items() if v is not None)
            raise TypeError(
                f"the model returned no loss: a mapping without 'loss' (keys {keys}). A Hugging "
                "Face causal LM (GPT-2, ...) computes its loss only when given labels: the "
                "dataset needs a 'labels' column (or the batch a 'labels' key; for a causal LM, "
                f"the input_ids themselves). {_CONTRACT}")
        out = entries["loss"]
    if not isinstance(out, Tensor) or out.numel() != 1:
        got = type(out).__name__ + (str(tuple(out.shape)) if isinstance(out, Tensor) else "")
        raise TypeError(f"{_CONTRACT}; got {got}")
    return out.reshape(())


def metrics_of(out: Any) -> dict[str, Tensor]:
    """The metrics a model output reports: ``{"loss": ...}`` and, from a mapping, every other
    entry that is a scalar number (a one-element tensor, an int or a float). Entries that are not
    scalars (logits, hidden states, caches, strings, None) are not metrics and are left out."""
    metrics = {"loss": loss_of(out)}
    entries = _entries(out)
    for key, value in (entries or {}).items():
        if key != "loss" and isinstance(key, str) and _is_scalar(value):
            metrics[key] = torch.as_tensor(value).detach().reshape(())
    return metrics


def stack_bytes(model: nn.Module, num_nodes: int, optimizer_states: int = 2) -> int:
    """Bytes that ``num_nodes`` stacked replicas of ``model`` hold before any activation: per node
    its parameters, their gradients, ``optimizer_states`` optimizer tensors per parameter (Adam:
    2), one more parameter-sized temporary that communication makes (DiLoCo's pseudo-gradients,
    a codec's reconstruction), and its buffers. A lower bound of what a run needs."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return num_nodes * (params * (3 + optimizer_states) + buffers)


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on ``device``: the GPU's free memory, or the host's
    ``MemAvailable`` (Linux); None where it cannot be told."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(model: nn.Module, num_nodes: int, device: torch.device,
                 optimizer_states: int = 2) -> None:
    """Refuse, before allocating anything, a run whose stacked replicas alone
    (:func:`stack_bytes`) would not fit in the device's available memory."""
    need = stack_bytes(model, num_nodes, optimizer_states)
    have = available_memory(device)
    if have is not None and need > have:
        per_node = need / num_nodes
        raise MemoryError(
            f"num_nodes={num_nodes} would need about {need / 1e9:.1f} GB on {device} for the "
            f"replicas alone ({per_node / 1e6:.1f} MB per node: parameters, gradients, "
            f"{optimizer_states} optimizer states per parameter, a communication buffer, "
            "buffers), but only "
            f"{have / 1e9:.1f} GB is available; at most about {max(have // per_node, 1):,.0f} "
            "nodes fit here: use fewer nodes, page them (--resident K --offload disk: K "
            "nodes in memory at a time), or spread them over processes/machines "
            "(--engine process, torchrun)")


def _check_bf16(device: torch.device) -> None:
    """Raise ValueError unless bf16 autocast runs on ``device`` (cpu; cuda with bf16; mps)."""
    allowed = "cpu, cuda where torch.cuda.is_bf16_supported(), or mps with bf16 autocast"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"precision='bf16' needs {allowed}; device {str(device)!r} "
                             "is not available (torch.cuda.is_available() is False)")
        with torch.cuda.device(device):
            if not torch.cuda.is_bf16_supported():
                raise ValueError(
                    f"precision='bf16' needs {allowed}; device {str(device)!r} "
                    f"({torch.cuda.get_device_name(device)}) does not support bfloat16: "
                    "use precision='fp32'"
                )
        return
    if not torch.amp.is_autocast_available(device.type):
        raise ValueError(f"precision='bf16' needs {allowed}; autocast does not run on device "
                         f"type {device.type!r}")
    # Autocast warns and disables itself for a dtype the device type does not support (MPS on
    # an old macOS): make that an error here rather than a silently fp32 run.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if caught:
        raise ValueError(f"precision='bf16' needs {allowed}; on device {str(device)!r} "
                         f"autocast says: {caught[0].message}")


class NodeStack:
    """N replicas of ``model``, every tensor stacked along a leading node dimension.

    Attributes:
        num_nodes: ``N``.
        params: name -> ``[N, *shape]`` leaf tensor (the optimizer's parameters).
        grads: name -> ``[N, *shape]``, also each ``params[name].grad``.
        buffers: name -> ``[N, *shape]`` (BatchNorm running statistics: one per node).
        engine: ``"loop"``, ``"vmap"`` or ``"threads"``, the engine in use.
        auto: the engine was chosen by ``engine="auto"`` (a fallback is then not a warning).
        micro_batch_size: rows per micro-batch in :meth:`forward_backward` (gradient
            accumulation, see the module docstring), or None: each node's batch in one pass.
        precision: ``"fp32"``, or ``"bf16"``: forward passes under bfloat16 autocast.

    Strategies change parameters in place only (``copy_``, ``add_``, optimizer steps); rebinding
    ``params[name]`` would detach the per-node views the loop engine writes gradients through.
    """

    def __init__(
        self, model: nn.Module, num_nodes: int, *, device: torch.device | str = "cpu",
        engine: EngineName = "auto", micro_batch_size: int | None = None,
        precision: Precision = "fp32",
    ) -> None:
        if num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        if micro_batch_size is not None and (
            isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int)
            or micro_batch_size < 1
        ):
            raise ValueError(
                f"micro_batch_size must be None or an integer >= 1, got {micro_batch_size!r}"
            )
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        self.num_nodes = num_nodes
        self.device = resolve_device(device)
        if precision == "bf16":
            _check_bf16(self.device)
        self.micro_batch_size = micro_batch_size
        self.precision: Precision = precision
        self.auto = engine == "auto"
        if engine == "auto":
            engine = auto_engine(self.device, num_nodes)
        if engine == "threads" and self.device.type != "cpu":
            raise ValueError(f"engine='threads' runs nodes in CPU threads, got device "
                             f"{self.device}; allowed there: 'vmap', 'loop' or 'auto'")
        self.engine: Literal["loop", "vmap", "threads"] = engine
        self._vmap_checked = engine != "vmap"
        self._threads_checked = engine != "threads"
        self._pool: NodePool | None = None
        # The global index of row 0 (a group of a paged run, exogym.run.nodes.paging), or of every
        # row (a population's seats, exogym.run.nodes.population): the threads engine seeds each
        # node's generator by its global index.
        self.first_node = 0
        self.row_ids: list[int] | None = None
        # The template module: its own tensors are never used for compute, a node's rows are
        # swapped in (exogym.sim.binding; vmap: functional_call). Kept on the device so that
        # module code creating tensors "like" its parameters lands there.
        self.module = copy.deepcopy(model).to(self.device).train()
        # vmap's functional_call: its weight-tying pass walks every submodule on every call
        # (about 0.3 ms per node per step for a small CNN); only needed when a tensor is
        # registered under two names.
        named = list(self.module.named_parameters(remove_duplicate=False))
        named += list(self.module.named_buffers(remove_duplicate=False))
        self._tied = len({id(t) for _, t in named}) != len(named)
        n = num_nodes
        self.params: dict[str, Tensor] = {}
        self.grads: dict[str, Tensor] = {}
        for name, p in self.module.named_parameters():
            if not p.requires_grad:
                raise ValueError(
                    f"parameter {name!r} has requires_grad=False; frozen parameters are not "
                    "supported yet: register it as a buffer instead"
                )
            stacked = p.detach().unsqueeze(0).repeat(n, *([1] * p.dim())).requires_grad_(True)
            self.params[name] = stacked
            self.grads[name] = torch.zeros_like(stacked)
            stacked.grad = self.grads[name]
        self.buffers: dict[str, Tensor] = {
            name: b.detach().unsqueeze(0).repeat(n, *([1] * b.dim()))
            for name, b in self.module.named_buffers()
        }
        # Loop and threads engines: per-node leaf views whose .grad is a view of the stacked
        # gradient, and views of the node's buffers (bound into the template for a node's step).
        self._node_params: list[dict[str, Tensor]] = []
        self._node_buffers: list[dict[str, Tensor]] = []
        for i in range(n):
            views = {}
            for name, stacked in self.params.items():
                v = stacked[i].detach().requires_grad_(True)
                v.grad = self.grads[name][i]
                views[name] = v
            self._node_params.append(views)
            self._node_buffers.append({name: b[i] for name, b in self.buffers.items()})

    # -- training ---------------------------------------------------------------------------
    def forward_backward(self, batch: Any, active: Sequence[bool] | None = None) -> Tensor:
        """Each node's loss on its own batch and the gradient into :attr:`grads` (accumulated).

        ``batch`` is a pytree whose tensor leaves are ``[N, B, ...]``: row ``i`` is node ``i``'s
        batch. Returns the detached per-node losses, shape ``[N]``: with micro-batches, the
        full-batch mean ``sum_k (b_k / B) * loss_k``. ``active`` (``N`` booleans; None: all):
        only those nodes compute (a world's absent nodes do not); the others' gradients stay
        as they are (zero after :meth:`zero_grad`), their buffers untouched, and their losses
        are reported as 0.
        """
        parts = self._micro_batches(batch)
        if active is not None and all(active):
            active = None
        if self.engine == "threads":
            return self._threads_step(parts, active)
        if self.engine == "vmap":
            if active is not None:
                return self._masked_vmap_step(parts, active)
            if self._vmap_checked:
                return self._vmap_step(parts)
            return self._first_vmap_step(parts)
        return self._loop_step(parts, active)

    def _masked_vmap_step(self, parts: list[tuple[float | None, Any]],
                          active: Sequence[bool]) -> Tensor:
        """vmap over every row, then the absent rows' gradients, buffers and losses undone (the
        batch has one batch per row; an absent node's row is only computed to be discarded)."""
        saved = {name: b.clone() for name, b in self.buffers.items()}
        grads = {name: g.clone() for name, g in self.grads.items()}
        losses = (self._vmap_step(parts) if self._vmap_checked
                  else self._first_vmap_step(parts))
        idle = torch.tensor([not a for a in active], dtype=torch.bool, device=self.device)
        with torch.no_grad():
            for name, g in self.grads.items():
                g[idle] = grads[name][idle]
            for name, b in self.buffers.items():
                b[idle] = saved[name][idle]
        return torch.where(idle, torch.zeros((), dtype=losses.dtype, device=losses.device),
                           losses)

    def _micro_batches(self, batch: Any) -> list[tuple[float | None, Any]]:
        """``(weight, part)`` pairs: ``[(None, batch)]`` (one unscaled pass) or micro-batches."""
        m = self.micro_batch_size
        if m is None:
            return [(None, batch)]
        leaves = [t for t in tree_flatten(batch)[0] if isinstance(t, Tensor)]
        sizes = {t.shape[1] if t.dim() >= 2 else None for t in leaves}
        if len(sizes) != 1 or None in sizes:
            raise ValueError(
                "micro_batch_size needs every tensor in the batch to be [N, B, ...] with one "
                f"batch size B, got shapes {[tuple(t.shape) for t in leaves]}"
            )
        (rows,) = sizes
        if m >= rows:
            return [(None, batch)]
        return [
            ((min(start + m, rows) - start) / rows,
             tree_map(lambda t, s=start: t[:, s:s + m] if isinstance(t, Tensor) else t, batch))
            for start in range(0, rows, m)
        ]

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _node_step(self, i: int, parts: list[tuple[float | None, Any]], module: nn.Module,
                   randomness: NodeRandomness | None = None) -> Tensor:
        """Node ``i``'s forward and backward (every micro-batch) through ``module``, a template
        (the loop's, or a worker thread's copy) with the node's tensors bound in
        (:mod:`.binding`); its detached loss. ``randomness`` (the threads engine's) is pushed
        around the model's forward alone: a random draw happens there, and every operation
        under the mode pays a Python call (the batch's slicing, the loss's handling and the
        ``backward`` call stay outside it)."""
        total: Tensor | None = None
        for weight, part in parts:
            node_batch = _row(part, i)
            with (self._autocast(), bound(module, self._node_params[i], self._node_buffers[i]),
                  randomness or contextlib.nullcontext()):
                out = run_model(module, node_batch)
            loss = _upcast(loss_of(out))
            if weight is None:
                loss.backward()
                total = loss.detach()
            else:
                (loss * weight).backward()
                total = _add_scaled(total, loss.detach(), weight)
        assert total is not None
        return total

    def _loop_step(self, parts: list[tuple[float | None, Any]],
                   active: Sequence[bool] | None = None) -> Tensor:
        losses: list[Tensor | None] = [
            None if active is not None and not active[i]  # an absent node: 0 below
            else self._node_step(i, parts, self.module)
            for i in range(self.num_nodes)
        ]
        return _stack_losses(losses)

    def share_pool(self, other: NodeStack) -> None:
        """Run this stack's nodes in ``other``'s workers (the groups of a paged run: one
        pool for all, each group's template module being the same model)."""
        self._pool = other._node_pool() if other.engine == "threads" else None

    def _node_pool(self) -> NodePool:
        """The threads engine's workers, started on first use: ``pool_shape`` of the calling
        thread's intra-op threads."""
        if self._pool is None:
            workers, per_worker = pool_shape(self.num_nodes, torch.get_num_threads())
            self._pool = NodePool(workers, per_worker, lambda: copy.deepcopy(self.module))
        return self._pool

    @contextlib.contextmanager
    def stepping(self) -> Iterator[None]:
        """Around a training step (:meth:`forward_backward`, the strategy's update, zeroing):
        with the threads engine, the calling thread computes with one intra-op thread
        meanwhile, and so opens no parallel region of its own.

        Why: after each parallel region, the OpenMP threads of the thread that opened it spin
        for some milliseconds waiting for the next (libgomp's default); when the workers start
        right after the optimizer step, that spinning takes a worker's core. Measured on the
        2-core machine of docs/benchmarks/engines-cpu2-202611.md, MNIST CNN, N = 2: the threads
        engine at 4,600 samples/s, 5,800 with the spinning off (``OMP_WAIT_POLICY=PASSIVE``, which
        in turn slows every single-process run). The step's own tensor work in the calling thread
        (an optimizer step over the stacked tensors, a reduction over the nodes) is small
        beside the nodes' forward and backward. The numbers are the same run after run; they
        may differ from a step taken outside this context at round-off (a reduction split
        over another number of threads sums in another order). Other engines: no change."""
        if self.engine != "threads":
            yield
            return
        self._node_pool()  # sized by the caller's thread count, before it drops to one
        with intra_op_threads(1):
            yield

    def _threads_step(self, parts: list[tuple[float | None, Any]],
                      active: Sequence[bool] | None) -> Tensor:
        """The nodes on the pool's workers, each with its own generator (:mod:`.threads`)."""
        pool = self._node_pool()
        first = not self._threads_checked
        if first:  # to undo the step if the model draws from the global generator
            saved = ({n: b.clone() for n, b in self.buffers.items()},
                     {n: g.clone() for n, g in self.grads.items()})
        rng = torch.get_rng_state()
        seeds = node_seeds(self.num_nodes, self.first_node, self.row_ids)
        training = self.module.training
        used = [False] * self.num_nodes

        def run(i: int) -> Tensor:
            module = pool.local()
            if module.training != training:
                module.train(training)
            randomness = NodeRandomness(torch.Generator().manual_seed(seeds[i]))
            loss = self._node_step(i, parts, module, randomness)
            used[i] = randomness.used
            return loss

        nodes = [i for i in range(self.num_nodes) if active is None or active[i]]
        done = dict(zip(nodes, pool.map(run, nodes), strict=True))
        if not torch.equal(torch.get_rng_state(), rng):
            torch.set_rng_state(rng)
            if not first:
                raise RuntimeError(
                    "engine='threads': the model drew from torch's global random generator "
                    "inside a node's forward (an operation exogym cannot give each node its "
                    "own generator, e.g. nn.MultiheadAttention's dropout or F.gumbel_softmax); "
                    "the nodes' draws now depend on thread timing. Run it with engine='loop'.")
            buffers, grads = saved
            for name, b in self.buffers.items():
                b.copy_(buffers[name])
            for name, g in self.grads.items():
                g.copy_(grads[name])
            message = ("the model draws from torch's global random generator in a way exogym "
                       "cannot give each node its own generator (e.g. "
                       "nn.MultiheadAttention's dropout or F.gumbel_softmax); running "
                       "engine='loop'")
            if self.auto:
                log.info("engine='auto': %s", message)
            else:
                warnings.warn(f"engine='threads': {message}", RuntimeWarning, stacklevel=4)
            self.engine = "loop"
            self._threads_checked = True
            pool.close()
            self._pool = None
            return self._loop_step(parts, active)
        self._threads_checked = True
        if any(used):  # the next step's masks differ: move the global generator on by one draw
            torch.randint(2, ())
        return _stack_losses([done.get(i) for i in range(self.num_nodes)])

    def _vmap_step(self, parts: list[tuple[float | None, Any]]) -> Tensor:
        def one_node(params: dict[str, Tensor], buffers: dict[str, Tensor], b: Any) -> Tensor:
            return loss_of(
                call_model(self.module, (params, buffers), b, self._tied)
            )

        total: Tensor | None = None
        for weight, part in parts:
            in_dims = tree_map(lambda t: 0 if isinstance(t, Tensor) else None, part)
            with self._autocast():
                losses = vmap(one_node, in_dims=(0, 0, in_dims), randomness="different")(
                    self.params, self.buffers, part
                )
            losses = _upcast(losses)
            if weight is None:
                losses.sum().backward()
                total = losses.detach()
            else:
                (losses.sum() * weight).backward()
                total = _add_scaled(total, losses.detach(), weight)
        assert total is not None
        return total

    def _first_vmap_step(self, parts: list[tuple[float | None, Any]]) -> Tensor:
        saved_buffers = {name: b.clone() for name, b in self.buffers.items()}
        rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None
        try:
            losses = self._vmap_step(parts)
        except Exception as err:  # model code that vmap cannot batch
            for name, b in self.buffers.items():
                b.copy_(saved_buffers[name])
            torch.set_rng_state(rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)
            self.zero_grad()
            text = str(err).strip()
            first_line = text.splitlines()[0] if text else type(err).__name__
            warnings.warn(
                f"engine='vmap' cannot run this model ({type(err).__name__}: {first_line}); "
                "falling back to engine='loop'",
                RuntimeWarning,
                stacklevel=3,
            )
            self.engine = "loop"
            self._vmap_checked = True
            return self._loop_step(parts)
        self._vmap_checked = True
        return losses

    def zero_grad(self) -> None:
        grads = list(self.grads.values())
        if grads:
            torch._foreach_zero_(grads)

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> Tensor:
        """Clip each node's gradient to L2 norm ``max_norm``; returns the ``[N]`` norms before.

        Per node exactly ``torch.nn.utils.clip_grad_norm_``: ``coef = min(1, max_norm / (norm +
        1e-6))``. One global norm over the stack would let one node's large gradient shrink
        everyone's.
        """
        n = self.num_nodes
        grads = list(self.grads.values())
        per_tensor = torch.stack([g.reshape(n, -1).norm(dim=1) for g in grads])  # [P, N]
        total = per_tensor.norm(dim=0)  # [N]
        coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coef.view(n, *([1] * (g.dim() - 1))))
        return total

    # -- views of one node ---------------------------------------------------------------------
    def node_state(self, i: int) -> dict[str, Tensor]:
        """Node ``i``'s parameters and buffers, as a ``state_dict``-shaped mapping (views)."""
        state = {name: p[i].detach() for name, p in self.params.items()}
        state.update({name: b[i] for name, b in self.buffers.items()})
        return state

    @property
    def float_buffers(self) -> dict[str, Tensor]:
        """Buffers that averaging makes sense for (running statistics, not counters)."""
        return {k: b for k, b in self.buffers.items() if b.is_floating_point()}

    def num_parameters(self) -> int:
        """Parameters of ONE replica."""
        return sum(p.shape[1:].numel() for p in self.params.values())

    def parameter_bytes(self) -> int:
        """Bytes of ONE replica's parameters."""
        return sum(p.shape[1:].numel() * p.element_size() for p in self.params.values())

    def to_batch_device(self, batch: Any) -> Any:
        dev = self.device
        return tree_map(
            lambda t: t.to(dev, non_blocking=True) if isinstance(t, Tensor) else t, batch
        )


def auto_engine(device: torch.device, num_nodes: int) -> Literal["loop", "vmap", "threads"]:
    """``engine="auto"``: vmap on CUDA (N small models become one batched kernel stream);
    on a CPU, threads when there are several nodes and several intra-op threads to share
    between them (one small node's kernels do not keep several cores busy), else the loop."""
    if device.type == "cuda":
        return "vmap"
    if device.type == "cpu" and num_nodes >= 2 and torch.get_num_threads() >= 2:
        return "threads"
    return "loop"


def _row(batch: Any, i: int) -> Any:
    """Node ``i``'s batch: row ``i`` of each tensor leaf of ``batch`` (a tensor or a tuple of
    tensors directly, the common cases: 2 us against the pytree's 7.6 us per node and
    micro-batch on this project's CPU; else through the pytree)."""
    if isinstance(batch, Tensor):
        return batch[i]
    if type(batch) is tuple and all(isinstance(t, Tensor) for t in batch):
        return tuple(t[i] for t in batch)
    return tree_map(lambda t: t[i] if isinstance(t, Tensor) else t, batch)


def _stack_losses(losses: list[Tensor | None]) -> Tensor:
    """``[N]`` losses, an absent node's (None) as 0."""
    like = next(t for t in losses if t is not None)
    return torch.stack([torch.zeros_like(like) if t is None else t for t in losses])


def _add_scaled(total: Tensor | None, value: Tensor, weight: float) -> Tensor:
    """``total + weight * value`` (``weight * value`` when ``total`` is None)."""
    return value * weight if total is None else total + value * weight


def _upcast(loss: Tensor) -> Tensor:
    """A loss that autocast left in half precision, as fp32 (the reported value and its scaling)."""
    return loss.float() if loss.dtype in (torch.bfloat16, torch.float16) else loss
