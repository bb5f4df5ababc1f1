"""A Hugging Face ``datasets.Dataset`` that exogym cannot batch is refused before the run, with
what to do (exogym.sim.rows); each failed deep inside torch or transformers before."""

from __future__ import annotations

import re

import pytest
import torch

datasets = pytest.importorskip("datasets", reason='the hf extra: pip install -e ".[hf]"')

from exogym import Trainer  # noqa: E402

ROWS = [[1, 2, 3, 4]] * 16


@pytest.mark.parametrize(("columns", "torch_format", "says"), [
    ({"input_ids": ROWS, "labels": ROWS, "text": ["abcd"] * 16}, True,
     "row 0: row['text'] is a string ('abcd')"),  # was AttributeError: 'dict' ... 'size'
    ({"input_ids": [[1, 2, 3, 4], [1, 2, 3]] * 8}, True,
     "rows differ in shape: row['input_ids'] is [4] in row 0 and [3] in row 1"),  # torch.stack
    ({"input_ids": ROWS, "labels": ROWS}, False,
     "row['input_ids'] is a Python list of 4 numbers, not a tensor; a datasets.Dataset gives "
     "tensors with .with_format('torch')"),  # was AttributeError: 'list' ... 'size'
])
def test_a_dataset_exogym_cannot_batch_is_refused_with_what_to_do(
        columns: dict[str, list], torch_format: bool, says: str) -> None:
    ds = datasets.Dataset.from_dict(columns)
    if torch_format:
        ds = ds.with_format("torch")
    with pytest.raises(ValueError, match=re.escape(says)):
        Trainer(torch.nn.Linear(4, 4), ds, ds).fit(max_steps=2, progress=False)
