"""One node's tensors bound into a template module for one call: the loop and threads engines'
form of ``torch.func.functional_call``, at the cost of a few dictionary writes.

``functional_call(module, state, args)`` swaps ``state``'s tensors into ``module`` by name, calls
it and swaps the originals back; to do that for any module it resolves every dotted name through
the submodules and (with ``tie_weights``) walks every submodule on every call. The engines call
the same template with the same names step after step, so the places a module keeps its tensors
are found once
(:class:`Slots`: each submodule's ``_parameters`` or ``_buffers`` dictionary and the key in it)
and a call writes the node's tensors into those places and the originals back afterwards
(:func:`bound`). The module runs its own ``forward`` on the node's tensors (the same autograd graph
as ``functional_call`` builds, so the same numbers); a tensor registered under two names (tied
weights) is one slot per name, both given the node's one tensor, as ``tie_weights=True`` does.
Measured (``bench/node_step.py``, MNIST CNN at batch 8, one thread): the loop's node step
1.069x the plain model call, against 1.076x through ``functional_call``, a difference within
the intervals; the swap was not where the engine's per-node cost is (docs/benchmarks,
"Populations", says where it is).

As with ``functional_call``, a module that *reassigns* a buffer inside ``forward``
(``self.cache = new``) has the reassignment undone when the call ends; updates in place
(BatchNorm's running statistics) land in the node's tensor.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping
from typing import NamedTuple

from torch import Tensor, nn

__all__ = ["Slot", "Slots", "bound", "slots_of"]


class Slot(NamedTuple):
    """One place a module keeps a tensor: ``table[key]``, the tensor named ``name`` (its first
    name in ``named_parameters()`` / ``named_buffers()``, the name the node's state uses)."""

    table: dict[str, Tensor | None]
    key: str
    name: str


class Slots(NamedTuple):
    """Every parameter's and every buffer's place in a module (tied tensors: one per name)."""

    params: tuple[Slot, ...]
    buffers: tuple[Slot, ...]


def _find(module: nn.Module) -> Slots:
    names = {id(p): name for name, p in module.named_parameters()}
    buffer_names = {id(b): name for name, b in module.named_buffers()}
    params: list[Slot] = []
    buffers: list[Slot] = []
    for sub in module.modules():  # each submodule once, however often it is registered
        params += [Slot(sub._parameters, key, names[id(p)])
                   for key, p in sub._parameters.items() if p is not None]
        buffers += [Slot(sub._buffers, key, buffer_names[id(b)])
                    for key, b in sub._buffers.items() if b is not None]
    return Slots(tuple(params), tuple(buffers))


_SLOTS: weakref.WeakKeyDictionary[nn.Module, Slots] = weakref.WeakKeyDictionary()


def slots_of(module: nn.Module) -> Slots:
    """``module``'s slots, found on the first call and kept while the module lives (a template's
    structure does not change: its tensors are only ever swapped, never added)."""
    slots = _SLOTS.get(module)
    if slots is None:
        slots = _SLOTS[module] = _find(module)
    return slots


@contextlib.contextmanager
def bound(module: nn.Module, params: Mapping[str, Tensor],
          buffers: Mapping[str, Tensor]) -> Iterator[nn.Module]:
    """``module`` with ``params`` and ``buffers`` (by name, every name of
    ``named_parameters()`` / ``named_buffers()``) in place of its own tensors; its own are back
    when the block ends, also on an error. Not for two threads at once on one module."""
    slots = slots_of(module)
    saved: list[tuple[dict[str, Tensor | None], str, Tensor | None]] = []
    try:
        for table, key, name in slots.params:
            saved.append((table, key, table[key]))
            table[key] = params[name]
        for table, key, name in slots.buffers:
            saved.append((table, key, table[key]))
            table[key] = buffers[name]
        yield module
    finally:
        for table, key, own in reversed(saved):
            table[key] = own
