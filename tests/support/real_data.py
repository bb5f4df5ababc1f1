"""Where the tests find the real datasets, and what they do when one is missing.

The fixtures of ``conftest.py`` (``data_dir``, ``mnist_data``, ``cifar10_data``,
``shakespeare_data``) are made from these two functions; ``test_real_data.py`` tests them.

The folder: ``$EXOGYM_DATA_DIR`` when set, else ``../shared/data`` beside the checkout when it
exists, else the user's data folder (``~/.cache/exogym/data``): exogym's own order
(:func:`exogym.tasks.data.paths.resolve_data_dir`) with the checkout's neighbour before the user's
folder. A dataset missing there is downloaded into it by exogym's own loader (every file checked
against its official checksum; the mirrors of ``$EXOGYM_DATA_MIRRORS`` asked first). When that
fails too (no network), the test is skipped with one line saying how to provide the data, or
fails when ``EXOGYM_REQUIRE_DATA=1`` (CI, which has the data: a missing dataset there is a fault).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from exogym.tasks.data import cifar10, mnist, shakespeare
from exogym.tasks.data.download import MIRRORS_ENV_VAR, DatasetNotFoundError
from exogym.tasks.data.paths import ENV_VAR, resolve_data_dir
from support.scripts import ROOT

SHARED_DATA = ROOT.parent / "shared" / "data"
REQUIRE_DATA = "EXOGYM_REQUIRE_DATA"
"""``1``: a dataset the tests cannot find or download fails them instead of skipping them."""


@dataclass(frozen=True)
class Dataset:
    """A dataset as the tests need it.

    Attributes:
        folder: its folder inside the data folder.
        files: what must be in ``folder``, each entry a choice of file names (one suffices).
        what: the files, as the skip line names them.
        download: what a download from the official sources fetches, and its size.
        fetch: exogym's loader, called with the data folder (it downloads what is missing).
    """

    folder: str
    files: tuple[tuple[str, ...], ...]
    what: str
    download: str
    fetch: Callable[[Path], object]

    def present(self, root: Path) -> bool:
        return all(any((root / self.folder / name).is_file() for name in choice)
                   for choice in self.files)


DATASETS: dict[str, Dataset] = {
    "mnist": Dataset("mnist", tuple((f.name,) for f in mnist.FILES), "its 4 .gz files",
                     "11.6 MB", mnist.load_mnist),
    # the official source serves only the whole archive; the tests read all 50,000 images
    "cifar10": Dataset(
        "cifar10/cifar-10-batches-bin",
        (*((name,) for name in cifar10.TRAIN_FILES),
         (cifar10.TEST_FILE, cifar10.PARTIAL_TEST_FILE)),
        "data_batch_1..5.bin and test_batch.bin", "the 170 MB archive", cifar10.load_cifar10),
    "shakespeare": Dataset("tinyshakespeare", ((shakespeare.FILE.name,),), "input.txt", "1.1 MB",
                           shakespeare.load_shakespeare),
}


def data_root() -> Path:
    """The data folder the tests read (absolute; it need not exist)."""
    if os.environ.get(ENV_VAR) or not SHARED_DATA.is_dir():
        return resolve_data_dir()  # $EXOGYM_DATA_DIR, else the user's data folder
    return SHARED_DATA


def _required() -> bool:
    value = os.environ.get(REQUIRE_DATA, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{REQUIRE_DATA}={value!r}: expected 1 (a missing dataset fails the "
                         "tests that read it) or 0 (they are skipped)")
    return value == "1"


def provide(name: str, root: Path, mirrors: str = "") -> Path:
    """``root``, holding dataset ``name`` (a key of :data:`DATASETS`).

    Args:
        name: the dataset.
        root: the data folder; what is missing is downloaded into it.
        mirrors: the value of ``$EXOGYM_DATA_MIRRORS`` for the download (the tests themselves
            run without it: see ``conftest.py``).

    Raises:
        pytest.skip.Exception: the dataset is missing and could not be downloaded: one line
            saying how to provide it.
        pytest.fail.Exception: the same, when ``EXOGYM_REQUIRE_DATA=1``; with exogym's
            account of what was tried.
    """
    data = DATASETS[name]
    required = _required()  # a misspelt setting is an error even where the data is present
    if data.present(root):
        return root
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(MIRRORS_ENV_VAR, mirrors)
            data.fetch(root)
    except DatasetNotFoundError as err:
        line = (f"{name} data missing from {root / data.folder} and downloading it failed: set "
                f"{ENV_VAR} to a folder holding {data.folder}/ ({data.what}), or run the tests "
                f"once online to fetch {data.download} into {root} ({REQUIRE_DATA}=1 says why)")
        if required:
            pytest.fail(f"{line}\n{err}", pytrace=False)
        pytest.skip(line)
    return root
