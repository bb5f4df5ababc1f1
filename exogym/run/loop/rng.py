"""Every random generator a run draws from, saved and restored with its checkpoint."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["rng_state", "set_rng_state"]


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every random generator a run draws from: torch's (CPU, and the GPUs'), Python's and
    NumPy's global ones (a user's dataset or model may use them)."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": (torch.cuda.get_rng_state_all() if device.type == "cuda" else None),
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]),
    }


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Restore :func:`rng_state`."""
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
    version, *rest = state["python"]
    random.setstate((version, tuple(rest[0]), rest[1]))
    name, keys, *tail = state["numpy"]
    np.random.set_state((name, keys.cpu().numpy().astype(np.uint32), *tail))
