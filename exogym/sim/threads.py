"""The ``threads`` engine's machinery: nodes computed concurrently in worker threads, each node
drawing its random numbers from its own generator.

On a CPU, one small node's forward and backward do not keep several cores busy (a 28x28
convolution or a 64-token attention splits badly over intra-op threads), while separate processes
(one per node, one thread each) do. :class:`NodePool` gets the same parallelism inside one
process: ``T = min(N, P)`` workers, where ``P`` is the process's intra-op thread count
(``torch.get_num_threads()``), each running whole nodes with ``max(1, P // T)`` intra-op
threads: the thread that takes the step and ``T - 1`` persistent threads. torch releases the GIL
inside its kernels, so the workers' kernels run in parallel; only the per-node Python (module
dispatch, autograd bookkeeping) takes turns. Nodes are handed out one at a time to whichever
worker is free; the numbers do not depend on which worker ran a node,
because every worker has the same intra-op thread count and a node's computation touches only its
own rows of the stacked tensors (gradients, BatchNorm buffers) and its own template module.

**Random numbers.** torch's global generator is shared by all threads, so two workers drawing
dropout masks from it would draw in whatever order the scheduler ran them: nondeterministic.
Instead, every random operation of a node's forward runs with that node's own
``torch.Generator`` (:class:`NodeRandomness`, a thread-local ``TorchFunctionMode``):

- ``F.scaled_dot_product_attention`` with ``dropout_p > 0`` is computed in its math form
  (:func:`attention`; the form torch's CPU kernel takes for a training step with dropout) with
  the node's generator;
- torch's dropout family (``F.dropout``, ``F.dropout1d/2d/3d``, ``F.alpha_dropout``,
  ``F.feature_alpha_dropout`` and the ``torch.dropout``-level functions they call) is computed
  by :func:`dropout` with the node's generator: ATen's own formula (a Bernoulli(1 - p) mask,
  scaled by 1 / (1 - p); alpha dropout's affine correction), so the same distribution;
- every operation that takes a ``generator=`` argument (``torch.rand``, ``randn``, ``randint``,
  ``randperm``, ``bernoulli``, ``normal``, ``multinomial``, ``poisson``, the ``*_like``
  functions, ``Tensor.bernoulli_``, ``uniform_``, ``normal_``, ``random_``, ``exponential_``,
  ``geometric_``, ``cauchy_``, ``log_normal_``, ``torch.rrelu``) gets the node's generator when
  the call gave none; ``F.rrelu`` likewise.

Each step the node generators are seeded from a hash of the global generator's state and the
node's index, without drawing from it; after a step in which some node drew random numbers, the
global generator is advanced by one draw, so the next step's masks differ. A model without
randomness never touches the global generator (the loop engine's numbers, to float round-off);
the same seed gives the same masks run after run and across a checkpoint (the global state is
part of it). An operation that draws from the global generator inside its kernel or inside a
torch function it dispatches to (``nn.MultiheadAttention``'s dropout, ``F.gumbel_softmax``) is
caught: the global state changed during the step. On the first step the engine then falls back
to the loop; on a later step (a random branch first taken late) it is an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import queue
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, wait
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

__all__ = ["NodePool", "NodeRandomness", "attention", "dropout", "intra_op_threads", "node_seeds",
           "pool_shape"]

T = TypeVar("T")

# Functions (and Tensor methods) that take ``generator=``: given the node's when the call gave none.
_TAKES_GENERATOR = frozenset({
    torch.rand, torch.randn, torch.randint, torch.randperm, torch.bernoulli, torch.normal,
    torch.multinomial, torch.poisson, torch.rand_like, torch.randn_like, torch.randint_like,
    torch.rrelu, torch.rrelu_,
    Tensor.bernoulli, Tensor.bernoulli_, Tensor.uniform_, Tensor.normal_, Tensor.random_,
    Tensor.exponential_, Tensor.geometric_, Tensor.cauchy_, Tensor.log_normal_, Tensor.multinomial,
})

# name -> (feature, alpha, in-place) for the functional-level dropouts and the ATen-level ones.
_DROPOUTS: dict[Any, tuple[bool, bool, bool | None]] = {
    F.dropout: (False, False, None), F.alpha_dropout: (False, True, None),
    F.feature_alpha_dropout: (True, True, None),
    F.dropout1d: (True, False, None), F.dropout2d: (True, False, None),
    F.dropout3d: (True, False, None),
    torch.dropout: (False, False, False), torch.dropout_: (False, False, True),
    torch.feature_dropout: (True, False, False), torch.feature_dropout_: (True, False, True),
    torch.alpha_dropout: (False, True, False), torch.alpha_dropout_: (False, True, True),
    torch.feature_alpha_dropout: (True, True, False),
    torch.feature_alpha_dropout_: (True, True, True),
}
_UNBATCHED_DIM = {F.dropout1d: 2, F.dropout3d: 4}  # these add a batch dimension to such inputs

# The constant of SELU, which alpha dropout keeps the mean and variance of (ATen's Dropout.cpp).
_SELU_ALPHA = 1.7580993408473766


def dropout(x: Tensor, p: float, training: bool, generator: torch.Generator, *,
            feature: bool = False, alpha: bool = False, inplace: bool = False) -> Tensor:
    """ATen's dropout with an explicit generator: ``x * m / (1 - p)``, ``m ~ Bernoulli(1 - p)``
    per element (``feature``: per ``[batch, channel]``, broadcast over the rest); ``alpha``:
    ``a (x m + alpha' (m - 1 + p))`` with ``a = 1 / sqrt((alpha'^2 p + 1)(1 - p))``, which keeps
    SELU's mean and variance (``alpha'`` = 1.7580993408473766, ATen's Dropout.cpp). ``p = 1``
    zeroes; not training or ``p = 0`` returns ``x``."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x.mul_(0.0) if inplace else x * 0.0
    if feature:
        if x.dim() < 2:
            raise ValueError(f"feature dropout needs at least 2 dimensions, got {x.dim()}")
        noise = x.new_empty((x.shape[0], x.shape[1]) + (1,) * (x.dim() - 2))
    else:
        noise = torch.empty_like(x)
    noise.bernoulli_(1.0 - p, generator=generator)
    if alpha:
        a = 1.0 / math.sqrt((_SELU_ALPHA ** 2 * p + 1.0) * (1.0 - p))
        b = (noise - 1.0) * (_SELU_ALPHA * a) + _SELU_ALPHA * a * p
        noise = noise * a
        return (x.mul_(noise) if inplace else x * noise).add_(b)
    noise.div_(1.0 - p)
    return x.mul_(noise) if inplace else x * noise


def attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
              dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
              enable_gqa: bool = False, *, generator: torch.Generator) -> Tensor:
    """``F.scaled_dot_product_attention`` in its math form (the form torch's CPU kernel takes
    for a training step with dropout), its attention-weight dropout drawn from ``generator``:
    ``dropout(softmax(q k^T * scale + bias)) v``, ``scale = 1 / sqrt(E)`` by default, ``bias``
    ``-inf`` where ``is_causal`` (position ``t`` sees ``<= t``) or a boolean mask forbids, plus
    a float mask."""
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: give attn_mask or is_causal, not both")
    L, S = query.shape[-2], key.shape[-2]
    factor = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    bias = torch.zeros(L, S, dtype=query.dtype, device=query.device)
    if is_causal:
        allowed = torch.ones(L, S, dtype=torch.bool, device=query.device).tril()
        bias = bias.masked_fill(~allowed, float("-inf"))
    if attn_mask is not None:
        bias = (bias.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
                else bias + attn_mask)
    if enable_gqa:
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], -3)
        value = value.repeat_interleave(query.shape[-3] // value.shape[-3], -3)
    weights = torch.softmax(query @ key.transpose(-2, -1) * factor + bias, dim=-1)
    return dropout(weights, dropout_p, True, generator) @ value


class NodeRandomness(TorchFunctionMode):
    """Routes a node's random operations to ``generator`` (see the module docstring); ``used``
    turns True when one ran. Push it in the thread that runs the node: torch's function modes
    are per thread."""

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        self.generator = generator
        self.used = False

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        kind = _DROPOUTS.get(func)
        if kind is not None:
            return self._dropout(func, kind, args, kwargs)
        if func in _TAKES_GENERATOR and kwargs.get("generator") is None:
            self.used = True
            return func(*args, **{**kwargs, "generator": self.generator})
        if func is F.rrelu:
            return self._rrelu(*args, **kwargs)
        if func is F.scaled_dot_product_attention:
            return self._attention(func, args, kwargs)
        return func(*args, **kwargs)

    def _dropout(self, func: Any, kind: tuple[bool, bool, bool | None],
                 args: Sequence[Any], kwargs: dict[str, Any]) -> Tensor:
        feature, alpha, aten_inplace = kind
        if aten_inplace is None:  # F.dropout(input, p=0.5, training=True, inplace=False)
            names = ("input", "p", "training", "inplace")
            bound = {**dict(zip(names, args, strict=False)), **kwargs}
            x, p = bound["input"], bound.get("p", 0.5)
            training = bound.get("training", not alpha)  # the alpha ones default to False
            inplace = bound.get("inplace", False)
        else:  # torch.dropout(input, p, train)
            names = ("input", "p", "train")
            bound = {**dict(zip(names, args, strict=False)), **kwargs}
            x, p, training, inplace = bound["input"], bound["p"], bound["train"], aten_inplace
        if not training or p == 0.0:
            return func(*args, **kwargs)  # no draw: torch's own path (checks, no-op)
        self.used = True
        unbatched = _UNBATCHED_DIM.get(func) == x.dim()
        if unbatched:
            x = x.unsqueeze(0)
        out = dropout(x, float(p), True, self.generator, feature=feature, alpha=alpha,
                      inplace=inplace and not unbatched)
        if unbatched:
            out = out.squeeze(0)
            if inplace:
                return bound["input"].copy_(out)
        return out

    def _attention(self, func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Tensor:
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                 "enable_gqa")
        bound = {**dict(zip(names, args, strict=False)), **kwargs}
        if not bound.get("dropout_p", 0.0):
            return func(*args, **kwargs)
        self.used = True
        return attention(generator=self.generator, **bound)

    def _rrelu(self, input: Tensor, lower: float = 1.0 / 8, upper: float = 1.0 / 3,
               training: bool = False, inplace: bool = False) -> Tensor:
        if training:
            self.used = True
        op = torch.rrelu_ if inplace else torch.rrelu
        return op(input, lower, upper, training, generator=self.generator)


def node_seeds(num_nodes: int, first: int = 0, ids: Sequence[int] | None = None) -> list[int]:
    """One seed per node from a hash of torch's global generator state and the node's global
    index, without drawing from the global generator: nodes ``first`` to ``first + num_nodes -
    1`` (a group of a paged run), or the given ``ids`` (a population's seated clients)."""
    state = hashlib.blake2b(torch.get_rng_state().numpy().tobytes(), digest_size=16).digest()
    return [
        int.from_bytes(hashlib.blake2b(state + i.to_bytes(8, "little"), digest_size=8).digest(),
                       "little") >> 1
        for i in (range(first, first + num_nodes) if ids is None else ids)
    ]


@contextlib.contextmanager
def intra_op_threads(count: int) -> Iterator[None]:
    """The calling thread computes with ``count`` intra-op threads (``torch.set_num_threads``)
    inside the block; the previous count is restored after it, error or not."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def pool_shape(num_nodes: int, intra_op_threads: int) -> tuple[int, int]:
    """``(workers, intra-op threads per worker)`` for ``num_nodes`` nodes on a process with
    ``intra_op_threads`` intra-op threads: ``T = min(N, P)``, ``max(1, P // T)``."""
    workers = max(1, min(num_nodes, intra_op_threads))
    return workers, max(1, intra_op_threads // workers)


class NodePool:
    """``workers`` concurrent runners of nodes, each with ``threads_per_worker`` intra-op threads:
    the calling thread of :meth:`map` and ``workers - 1`` persistent threads; and a per-thread
    value built on first use by ``make_local`` (the node template module).

    The caller computes nodes too rather than waiting: a step with one worker involves no other
    thread at all, and with several, one wake-up fewer and the caller's hot caches used
    (measured on this project's 2-core machine: handing one node to a sleeping thread and
    waiting for it cost 0.18 ms a step beyond the node's own compute, a tiny model's step 0.36
    against 0.18 ms). Whichever runner takes a node computes it with the same intra-op thread
    count, so the numbers do not depend on who ran it.

    ``torch.set_num_threads`` also sets the count that threads started later take on their
    first parallel kernel; the threads therefore take theirs on start-up and the pool puts the
    process's count back once they have, so that no other thread (a checkpoint writer, the
    user's own) inherits a worker's.
    """

    def __init__(self, workers: int, threads_per_worker: int,
                 make_local: Callable[[], Any]) -> None:
        if workers < 1 or threads_per_worker < 1:
            raise ValueError(f"NodePool needs workers >= 1 and threads_per_worker >= 1, got "
                             f"{workers} and {threads_per_worker}")
        self.workers, self.threads_per_worker = workers, threads_per_worker
        self._make_local = make_local
        self._local = threading.local()
        self._tasks: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        process_threads = torch.get_num_threads()
        ready = threading.Barrier(workers)
        # The threads hold the queue, not the pool: a pool nobody holds is collected, and its
        # finalizer ends them.
        self._threads = [threading.Thread(target=_work, args=(self._tasks, threads_per_worker,
                                                              ready),
                                          daemon=True, name=f"exogym-node-{k}")
                         for k in range(1, workers)]
        for t in self._threads:
            t.start()
        ready.wait()
        torch.set_num_threads(process_threads)
        # At exit too (weakref.finalize runs at exit): the workers end while Python is whole;
        # a daemon thread still alive when the process tears torch down aborts it.
        self._finalizer = weakref.finalize(self, _stop, self._tasks, self._threads)

    def local(self) -> Any:
        """This runner thread's value (built on its first call)."""
        value = getattr(self._local, "value", None)
        if value is None:
            value = self._local.value = self._make_local()
        return value

    def map(self, fn: Callable[[int], T], items: Sequence[int]) -> list[T]:
        """``[fn(i) for i in items]``, run concurrently by the caller and the threads (each item
        to whichever is free); waits for every call to end before raising the first error (in
        ``items`` order), so that no thread is still writing when the caller goes on."""
        futures: list[Future[T]] = []
        for i in items:
            futures.append(Future())
            self._tasks.put((fn, i, futures[-1]))
        with intra_op_threads(self.threads_per_worker):
            while True:
                try:
                    task = self._tasks.get_nowait()
                except queue.Empty:
                    break
                if task is None:  # close() ran meanwhile: the stop is a thread's to take
                    self._tasks.put(None)
                    break
                _run(task)
                del task
        wait(futures)
        return [f.result() for f in futures]

    def close(self) -> None:
        """End the threads (they finish what they hold first)."""
        self._finalizer()


_Task = tuple[Callable[[int], Any], int, Future[Any]]


def _run(task: _Task) -> None:
    fn, item, future = task
    try:
        future.set_result(fn(item))
    except BaseException as err:  # handed to the caller, raised there
        future.set_exception(err)


def _work(tasks: queue.SimpleQueue[_Task | None], intra_op_threads: int,
          ready: threading.Barrier) -> None:
    """A thread of the pool: its intra-op thread count, then tasks until a None."""
    torch.get_num_threads()  # the thread's first parallel call reads the process's count:
    torch.set_num_threads(intra_op_threads)  # made now, then this thread's own count set
    ready.wait()
    while (task := tasks.get()) is not None:
        _run(task)
        del task  # hold nothing of the caller's while waiting


def _stop(tasks: queue.SimpleQueue[_Task | None], threads: list[threading.Thread]) -> None:
    for _ in threads:
        tasks.put(None)
    for t in threads:
        if t is not threading.current_thread():
            t.join()
