"""Shared fixtures: the registry is restored after every test (autouse); the rest are opt-in.

Real datasets: a test that reads one asks for it, ``mnist_data``, ``cifar10_data`` or
``shakespeare_data``, each the data folder holding that dataset (downloaded once if missing, else
the test is skipped with one line saying how to provide it: ``support/real_data.py``).
``data_dir`` is the same folder unchecked, for a test that names one but stops before reading it.

Shared helpers that are not fixtures are the package ``support`` (``tests/support/``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.real_data import data_root, provide

from exogym import strategy as strategies
from exogym.sim.threads import intra_op_threads
from exogym.tasks.data.download import MIRRORS_ENV_VAR

# The claims suite refuses code with uncommitted changes (a result names its commit); the tests
# run whatever state the checkout is in (a test of the refusal passes its own checkout).
os.environ["EXOGYM_ALLOW_DIRTY"] = "1"

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


@pytest.fixture(scope="session", autouse=True)
def data_mirrors() -> Iterator[str]:
    """``$EXOGYM_DATA_MIRRORS``, kept for the download of the test data and hidden from the tests:
    a download test sees the mirrors it names, a process a test starts none."""
    value = os.environ.get(MIRRORS_ENV_VAR, "")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(MIRRORS_ENV_VAR, raising=False)
        yield value


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The data folder: ``$EXOGYM_DATA_DIR``, else ``../shared/data`` beside the checkout when it
    exists, else the user's data folder. Not checked: see ``mnist_data`` and the others."""
    return data_root()


@pytest.fixture(scope="session")
def mnist_data(data_dir: Path, data_mirrors: str) -> Path:
    """``data_dir``, holding MNIST's ``mnist/`` (downloaded if missing, else the test skips)."""
    return provide("mnist", data_dir, data_mirrors)


@pytest.fixture(scope="session")
def cifar10_data(data_dir: Path, data_mirrors: str) -> Path:
    """``data_dir``, holding ``cifar10/cifar-10-batches-bin/`` (downloaded if missing, else the
    test skips)."""
    return provide("cifar10", data_dir, data_mirrors)


@pytest.fixture(scope="session")
def shakespeare_data(data_dir: Path, data_mirrors: str) -> Path:
    """``data_dir``, holding ``tinyshakespeare/input.txt`` (downloaded if missing, else the test
    skips)."""
    return provide("shakespeare", data_dir, data_mirrors)
