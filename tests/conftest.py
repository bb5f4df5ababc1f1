"""Shared fixtures of the equivalence and determinism tests (opt-in, nothing autouse)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def single_thread() -> Iterator[None]:
    """Run on one intra-op thread: for the tiny models here, thread hand-offs cost more than the
    math, and a busy 2-core machine makes them much worse. The previous setting is restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
