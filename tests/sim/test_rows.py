"""A dataset's rows checked before a run trains on them (exogym.sim.rows): a string column, a
Python list where a tensor belongs, rows of unequal shapes are named with the row and field;
what default_collate batches passes."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from exogym import Trainer
from exogym.sim.rows import check_rows


class Rows:
    """A map-style dataset of the given rows (as a Hugging Face ``datasets.Dataset`` is)."""

    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Any:
        return self.rows[i]


ids = torch.arange(4)


@pytest.mark.parametrize(("rows", "says"), [
    ([{"input_ids": ids, "text": "abcd"}] * 3,
     "the train dataset's row 0: row['text'] is a string ('abcd')"),
    ([{"input_ids": [1, 2, 3, 4], "labels": [1, 2, 3, 4]}] * 3,
     "row 0: row['input_ids'] is a Python list of 4 numbers, not a tensor; a datasets.Dataset "
     "gives tensors with .with_format('torch')"),
    ([{"input_ids": ids}, {"input_ids": ids}, {"input_ids": ids[:3]}],
     "rows differ in shape: row['input_ids'] is [4] in row 0 and [3] in row 2"),
    ([(torch.zeros(2), 1), (torch.zeros(3), 1)],
     "row[0] is [2] in row 0 and [3] in row 1"),
    ([(torch.zeros(2), {1, 2})], "row[1] is a set, which exogym cannot batch"),
    ([], "the train dataset is empty"),
])
def test_rows_exogym_cannot_batch_are_named(rows: list[Any], says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        check_rows(Rows(rows), "train")


def test_what_default_collate_batches_passes() -> None:
    check_rows(Rows([(torch.zeros(2), 1)] * 5), "train")  # torchvision's (image, label)
    check_rows(Rows([{"x": np.zeros(3), "y": 2.0}] * 5), "train")
    check_rows(Rows([[1.0, 2]] * 5), "train")  # a row of numbers: a tensor per position
    check_rows(TensorDataset(torch.zeros(4, 2)), "train")  # collates itself: not read


def test_a_run_refuses_such_a_dataset_before_it_starts(tmp_path: Any) -> None:
    good = Rows([(torch.randn(6), i % 3) for i in range(32)])
    bad = Rows([{"x": torch.randn(6), "note": "a"}] * 32)
    with pytest.raises(ValueError, match=r"the evaluation dataset's row 0: row\['note'\]"):
        Trainer(torch.nn.Linear(6, 3), good, bad).fit(max_steps=2, out_dir=tmp_path / "r",
                                                       progress=False)
    assert not (tmp_path / "r").exists()
