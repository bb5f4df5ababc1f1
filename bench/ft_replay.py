"""The same world, real and simulated: a --ft run with real deaths, its failures replayed as a
--world in the simulator, the two compared (exogym/run/ft/replay.py).

MNIST CNN, DiLoCo H = 20, 3 replicas of one node, 200 steps, batch 32, seed 0: replica 1 is
SIGKILLed at step 50 (restarted at once, it heals at a later synchronisation) and replica 2
inside the collective of step 139, a synchronisation (never restarted). The simulator then
trains the same run on the world the real run recorded, with seeds 0 and 1: the two seeds'
loss difference is the scale against which the real run's difference from its replay is read.

    EXOGYM_DATA_DIR=../shared/data python bench/ft_replay.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils.data import Dataset

from exogym import Trainer
from exogym.run.ft.launch import Kill, fit_ft
from exogym.run.ft.replay import compare, losses, world_of
from exogym.strategy import make
from exogym.strategy.base import StackedStrategy
from exogym.tasks import Task, get_task

STEPS, BATCH, REPLICAS = 200, 32, 3


def strategy() -> StackedStrategy:
    return make("diloco", H=20)


def simulate(task: Task, train: Dataset, world: str, seed: int, out: Path) -> None:
    torch.manual_seed(seed)
    Trainer(task.build_model(), train).fit(
        strategy=strategy(), num_nodes=REPLICAS, max_steps=STEPS, batch_size=BATCH,
        engine="loop", device="cpu", seed=seed, progress=False, network=None, world=world,
        out_dir=out, log_interval=1)


def main() -> int:
    task = get_task("mnist-cnn-v0")
    train, _ = task.load_data(None, False)
    with tempfile.TemporaryDirectory() as tmp:
        real = Path(tmp) / "real"
        torch.manual_seed(0)
        fit_ft(task.build_model(), train, strategy(), replicas=REPLICAS, max_steps=STEPS,
               batch_size=BATCH, out_dir=real, seed=0,
               kills=[Kill(1, 50), Kill(2, 139, at="collective", restart_after_s=None)])
        world = world_of(real)
        assert world is not None
        print(f"recorded world: {world}")
        for seed in (0, 1):
            simulate(task, train, world, seed, Path(tmp) / f"sim{seed}")
        result = compare(real, Path(tmp) / "sim0")
        a, b = losses(Path(tmp) / "sim0", False), losses(Path(tmp) / "sim1", False)
        spread = [abs(a[s] - b[s]) for s in sorted(set(a) & set(b))]
        result["seed_spread_mean_abs"] = sum(spread) / len(spread)
        result["seed_spread_max_abs"] = max(spread)
        # before the first death both runs are the same run: round-off only
        r = losses(Path(tmp) / "real", True)
        first = min(step for _, step in result["real"]["fail"])
        before = [abs(r[s] - a[s]) for s in sorted(set(r) & set(a)) if s < first]
        result["loss_max_abs_before_first_death"] = max(before)
        print(json.dumps(result, indent=1))
    return 0 if result["fail_equal"] and result["rejoin_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
