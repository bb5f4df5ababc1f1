"""Shared fixtures: the registry is restored after every test (autouse); the rest are opt-in."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from exogym import strategy as strategies
from exogym.sim.threads import intra_op_threads

# A test run started in the background of a shell inherits SIGINT ignored, and so would the
# runs it starts: the Ctrl-C tests need Python's own handler.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def single_thread() -> Iterator[None]:
    """Run on one intra-op thread: for the tiny models here, thread hand-offs cost more than the
    math, and a busy 2-core machine makes them much worse. The previous setting is restored."""
    with intra_op_threads(1):
        yield


@pytest.fixture(autouse=True)
def registry_restored() -> Iterator[None]:
    """A test that loads a ``SOURCE:Class`` spec or calls ``register`` adds an id to the strategy
    registry; later tests (and the fresh processes some start) see exogym's own ids only."""
    strategies.registry()  # installed plugins are read once, before the first save
    saved = dict(strategies._ENTRY_POINTS)
    yield
    strategies._ENTRY_POINTS.clear()
    strategies._ENTRY_POINTS.update(saved)
