"""The --ft chaos suite, long form: random kill schedules x strategies on 3 torchft replicas.

Each case draws one or two deaths (a replica, a step, a point in the step: before it, inside a
collective, while serving a heal, while writing a checkpoint; restarted after 0 or 0.5 s, or
never) and runs the strategy under :func:`exogym.run.ft.launch.fit_ft` with a deadline. A case
passes when the run ends normally, every live replica holds the same global model, each
synchronisation was committed exactly as often as without a failure, and the metrics have one
row per step. Printed: one line per case, then the totals and the seconds from a restarted
process's start to its heal (median and worst; ``up`` is the part spent before the replica's
loop starts: spawn, imports, nodes and data).

    python bench/ft_chaos.py --schedules 50            # the goal: 50 x 4 strategies
    python bench/ft_chaos.py --schedules 3 --steps 24  # a quick look
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from exogym.run.ft.launch import FTError, Kill, fit_ft
from exogym.strategy import make

STRATEGIES = {"ddp": {}, "diloco": {"H": 6}, "streaming_diloco": {"H": 12},
              "fedavg": {"H": 6}}


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.fc1, self.fc2 = nn.Linear(6, 16), nn.Linear(16, 3)

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.fc2(torch.tanh(self.fc1(x))), y)


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(960, 6, generator=g),
                         torch.randint(0, 3, (960,), generator=g))


def schedule(rng: random.Random, steps: int, replicas: int) -> list[Kill]:
    kills = []
    for r in rng.sample(range(replicas), rng.choice((1, 2))):
        at = rng.choice(("step", "collective", "serve", "checkpoint"))
        delay = rng.choice((0.0, 0.5, None))
        kills.append(Kill(r, rng.randrange(1, steps - 2), at, delay))
    return kills


def case(sid: str, kills: list[Kill], steps: int, syncs: int, out: Path) -> dict[str, Any]:
    strategy = make(sid, **STRATEGIES[sid], **{"optim.lr": 0.05})
    start = time.perf_counter()
    try:
        result = fit_ft(Tiny(), dataset(), copy.deepcopy(strategy), replicas=3,
                        max_steps=steps, batch_size=4, out_dir=out, kills=kills,
                        checkpoint_every=4, deadline_s=180.0)
    except FTError as err:
        return {"ok": False, "hang": "deadline" in str(err), "why": str(err)[:200]}
    states = list(result.global_states.values())
    equal = bool(states) and all(torch.equal(states[0][k], s[k]) for s in states for k in s)
    planned = set(result.syncs.values()) == {syncs}
    rows = [r["step"] for r in result.rows] == list(range(steps))
    return {"ok": equal and planned and rows, "hang": False, "equal": equal,
            "planned": planned, "rows": rows, "wall_s": time.perf_counter() - start,
            "restarts": result.restarts}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--schedules", type=int, default=50)
    p.add_argument("--steps", type=int, default=36)
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = random.Random(a.seed)
    sids = a.strategies.split(",")
    # synchronisations without a failure: each strategy's plan
    with tempfile.TemporaryDirectory() as tmp:
        plan = {sid: fit_ft(Tiny(), dataset(), make(sid, **STRATEGIES[sid]), replicas=3,
                            max_steps=a.steps, batch_size=4, out_dir=Path(tmp) / sid).syncs[0]
                for sid in sids}
    results, backs, ups = [], [], []
    for i in range(a.schedules):
        kills = schedule(rng, a.steps, 3)
        for sid in sids:
            with tempfile.TemporaryDirectory() as tmp:
                res = case(sid, kills, a.steps, plan[sid], Path(tmp))
            results.append(res)
            healed = [r for r in res.get("restarts", []) if r.get("back_s") is not None]
            for r in healed:
                backs.append((r["back_s"], i, sid))
                ups.append(r["up_s"])
            print(f"{i:3d} {sid:17s} {'ok  ' if res['ok'] else 'FAIL'} "
                  f"{[(k.replica, k.step, k.at, k.restart_after_s) for k in kills]} "
                  f"healed in {[round(r['back_s'], 2) for r in healed]} s "
                  f"{res.get('why', '')}", flush=True)
    passed = sum(r["ok"] for r in results)
    hangs = sum(r["hang"] for r in results)
    print(f"\n{passed}/{len(results)} cases passed, {hangs} hangs")
    if backs:
        worst, at, sid = max(backs)
        print(f"restart -> healed: median {statistics.median(b for b, _, _ in backs):.2f} s, "
              f"worst {worst:.2f} s (schedule {at}, {sid}) over {len(backs)} restarts (of "
              f"which before the loop: median {statistics.median(ups):.2f} s)")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
