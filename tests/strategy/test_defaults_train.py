"""Every registered strategy, at its defaults, trains the default task: the run that
``exogym run --task mnist --strategy ID --nodes 4 --steps 500`` makes (MNIST CNN, batch 64 per
node, the task's learning rate, seed 0, the datacenter network that asynchronous methods need)
ends at >= 95% accuracy on the 10,000 test images.

Slow (about a minute per strategy on 2 CPU cores): marked ``slow``, which the default run skips
(``addopts`` in pyproject.toml); run them with ``python -m pytest -q -m slow`` (``-rP`` also shows
each strategy's accuracy, which every test prints).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from exogym import Trainer
from exogym import strategy as strategies
from exogym.strategy import registry
from exogym.tasks.registry import get_task

NODES = 4
STEPS = 500
MIN_ACCURACY = 0.95


@pytest.mark.slow
@pytest.mark.parametrize("strategy_id", registry())
def test_defaults_train_the_default_task(strategy_id: str, mnist_data: Path) -> None:
    # Prepare: as `exogym run` (exogym/cli/run.py) builds it, with every option at its default
    task = get_task("mnist")
    strategy = strategies.make(strategy_id, **{"optim.lr": str(task.lr)})
    torch.manual_seed(0)
    model = task.build_model()
    train, test = task.load_data(mnist_data, True)

    # Execute
    result = Trainer(model, train, test).fit(
        strategy=strategy, num_nodes=NODES, max_steps=STEPS, batch_size=task.batch_size,
        eval_interval=task.eval_interval, seed=0, progress=False, network="datacenter")

    # Assert: the final evaluation is on the whole test set
    accuracy = result.final["eval_accuracy"]
    print(f"{strategy_id}: final eval accuracy {accuracy:.2%}")
    assert len(test) == 10_000
    assert accuracy >= MIN_ACCURACY, (
        f"{strategy_id} at its defaults ends at {accuracy:.2%} accuracy on the default task "
        f"(MNIST CNN, {NODES} nodes, {STEPS} steps); at least {MIN_ACCURACY:.0%} expected")
