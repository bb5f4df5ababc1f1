"""The source of a toy task file, as a researcher would write one (``my_task.py:make_task``);
tests write it into a temporary folder and name it by path."""

from __future__ import annotations

import textwrap


def toy_task_source(task_id: str, description: str = "toy", *, features: int = 4,
                    samples: int = 160, train: int = 128) -> str:
    """A module defining ``make_task()``: a linear classifier of ``features`` inputs on
    ``samples`` seeded points, the first ``train`` for training (batch 8, lr 0.05, an
    evaluation every 2 steps)."""
    return textwrap.dedent(f'''
        import torch
        from torch import nn
        from torch.utils.data import TensorDataset

        from exogym.tasks import Task
        from exogym.tasks.models import Classifier


        def _data(data_dir, download):
            g = torch.Generator().manual_seed(0)
            x = torch.randn({samples}, {features}, generator=g)
            y = (x[:, 0] > 0).long()
            return TensorDataset(x[:{train}], y[:{train}]), TensorDataset(x[{train}:], y[{train}:])


        def make_task():
            return Task(id="{task_id}", description="{description}", load_data=_data,
                        build_model=lambda: Classifier(nn.Linear({features}, 2)), batch_size=8,
                        lr=0.05, eval_interval=2)
    ''')
