"""A dataset's rows checked before a run trains on them: what exogym can batch.

exogym stacks ``batch_size`` rows of a map-style dataset into one batch per node with
``torch.utils.data.default_collate`` (:func:`exogym.sim.sharding.fetch`), so every row must be
a tensor, a number, or a tuple, list or dict of them, and a field must have one shape in every
row. Three datasets a researcher brings break that deep inside torch or the model, with no
word of the dataset (all seen with Hugging Face ``datasets``):

- a column of strings (the raw text beside the token ids): ``default_collate`` keeps a list of
  strings, and the model is called with it;
- no torch format: a ``datasets.Dataset`` gives Python lists until ``.with_format("torch")``, and
  ``default_collate`` turns a row's list of ``L`` ids into ``L`` tensors of the batch, which the
  model cannot take;
- rows of unequal length (text not cut into windows): ``torch.stack`` refuses them.

:func:`check_rows` reads up to :data:`SAMPLED` rows spread over the dataset and names the
dataset, the row, the field and what to do. A dataset with its own ``get_batch`` or a
``TensorDataset`` collates itself and is not read.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from torch import Tensor
from torch.utils.data import TensorDataset

__all__ = ["SAMPLED", "check_rows"]

SAMPLED = 64
"""Rows read by :func:`check_rows`: the first, the last and evenly spaced ones between."""


def check_rows(dataset: Any, what: str) -> None:
    """Raise ValueError naming the row and field if ``dataset`` (the ``what`` dataset: "train",
    "evaluation") has rows exogym cannot batch (the module docstring)."""
    if hasattr(dataset, "get_batch") or type(dataset) is TensorDataset:
        return
    n = len(dataset)
    if n == 0:
        raise ValueError(f"the {what} dataset is empty")
    ids = sorted({int(i) for i in np.linspace(0, n - 1, min(n, SAMPLED))})
    shapes: dict[str, tuple[int, tuple[int, ...]]] = {}
    for i in ids:
        for field, leaf in _leaves(dataset[i], f"the {what} dataset's row {i}"):
            shape = tuple(leaf.shape) if isinstance(leaf, (Tensor, np.ndarray)) else ()
            first = shapes.setdefault(field, (i, shape))
            if first[1] != shape:
                raise ValueError(
                    f"the {what} dataset's rows differ in shape: {field} is {list(first[1])} "
                    f"in row {first[0]} and {list(shape)} in row {i}; exogym stacks a batch's "
                    "rows, so give every row one shape (cut text into windows of one length, "
                    "or pad it)")


def _leaves(row: Any, where: str, field: str = "row", keyed: bool = False,
            ) -> list[tuple[str, Any]]:
    """``(field, value)`` for each tensor or number of ``row``; a string, or a Python list of
    numbers under a key (a column's value, which ``default_collate`` would transpose), is an
    error naming ``where`` and the field (``keyed``: ``row`` is under a key)."""
    if isinstance(row, (Tensor, np.ndarray, numbers.Number)):
        return [(field, row)]
    if isinstance(row, (str, bytes)):
        raise ValueError(f"{where}: {field} is a string ({row[:30]!r}); exogym batches tensors "
                         "and numbers only: drop the column (a datasets.Dataset: "
                         "remove_columns([...])) or encode it as numbers")
    if isinstance(row, Mapping):
        return [leaf for k, v in row.items()
                for leaf in _leaves(v, where, f"{field}[{k!r}]", keyed=True)]
    if isinstance(row, Sequence):
        if keyed and isinstance(row, list) and row and all(
                isinstance(v, numbers.Number) for v in row):
            raise ValueError(f"{where}: {field} is a Python list of {len(row)} numbers, not a "
                             "tensor; a datasets.Dataset gives tensors with "
                             ".with_format('torch') (a dataset of your own: return tensors)")
        return [leaf for k, v in enumerate(row)
                for leaf in _leaves(v, where, f"{field}[{k}]", keyed)]
    raise ValueError(f"{where}: {field} is a {type(row).__name__}, which exogym cannot batch "
                     "(tensors, numbers, and tuples, lists or dicts of them)")
