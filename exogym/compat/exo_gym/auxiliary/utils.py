"""EXO Gym's ``exogym.aux.utils``: ``get_device``, as its examples import it."""

from __future__ import annotations

import torch

__all__ = ["get_device"]


def get_device() -> str:
    """``"cuda"`` if CUDA is available, else ``"mps"`` if Apple's GPU is, else ``"cpu"`` (EXO
    Gym's order)."""
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"
