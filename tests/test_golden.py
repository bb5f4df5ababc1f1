"""Golden trajectories (torchft's regression tests; STYLE point 8c): every strategy's numbers on a
tiny fixed run, recorded in ``tests/golden/trajectories.json``, must not change unless a change
means to change them. The world and per-node timelines (shared/DESIGN.md section 7) must leave a
perfect world exactly here: the file was recorded before they existed.

Regenerate (and review the diff) with ``EXOGYM_REGEN_GOLDEN=1 python -m pytest
tests/test_golden.py``; a strategy missing from the file is skipped, saying so.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resume_cases import Net, data
from test_conformance import small

from exogym import Trainer
from exogym.strategy import make, registry

GOLDEN = Path(__file__).resolve().parent / "golden" / "trajectories.json"
REGEN = os.environ.get("EXOGYM_REGEN_GOLDEN") == "1"


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(name.encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def trajectory(sid: str, engine: str) -> dict[str, Any]:
    """A tiny 3-node run with BatchNorm and dropout (randomness and buffers), on a network."""
    torch.manual_seed(1)
    result = Trainer(Net(norm=True, drop=True), data(), data()).fit(
        strategy=make(sid, **small(sid)), num_nodes=3, max_steps=8, batch_size=8,
        log_interval=2, eval_interval=4, eval_samples=40, engine=engine, seed=7,
        network="home-100mbps", step_time=0.01, progress=False)
    return {
        "train_loss": [r["train_loss"] for r in result.history],
        "eval_loss": [r.get("eval_loss") for r in result.history],
        "final": result.final,
        "bytes_sent": result.bytes_sent,
        "collectives": len(result.comm_log),
        "sim_time_s": result.clock.total_s if result.clock else None,
        "model": _digest(result.model.state_dict()),
    }


def _load() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


@pytest.mark.parametrize("engine", ["loop", "vmap"])
@pytest.mark.parametrize("sid", registry())
def test_golden_trajectory(sid: str, engine: str, single_thread: None) -> None:
    key = f"{sid}/{engine}"
    got = json.loads(json.dumps(trajectory(sid, engine)))  # the JSON round trip of the file
    golden = _load()
    if REGEN:
        golden[key] = got
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        return
    if key not in golden:
        pytest.skip(f"{key} has no golden trajectory yet: record it with EXOGYM_REGEN_GOLDEN=1")
    assert got == golden[key], key
