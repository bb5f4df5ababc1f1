"""CIFAR-10 as in-memory tensors, read from the official binary version.

The files of ``cifar-10-batches-bin`` (``data_batch_1.bin`` .. ``data_batch_5.bin`` and
``test_batch.bin``) are looked up in ``<data_dir>/cifar10/cifar-10-batches-bin/`` (see
:func:`exogym.tasks.data.paths.resolve_data_dir`). When batches are missing and downloading is
allowed, the official archive ``cifar-10-binary.tar.gz`` is downloaded into ``<data_dir>/cifar10/``,
verified by MD5 and extracted there. A mirror of ``EXOGYM_DATA_MIRRORS``
(:func:`exogym.tasks.data.download.mirrors_for`) is asked first for the missing batch files
themselves (each verified by :data:`BATCH_FILES`), then for the archive.

Each record of a binary batch is 3073 bytes: one label byte (0..9), then the 32x32 image as three
1024-byte planes (red, green, blue), each plane row-major.

Every batch file read is checked against its official size and checksum (:data:`BATCH_FILES`):
a truncated or altered file is an error naming it, never silently fewer images.

Test set: the official ``test_batch.bin`` (10,000 images) is used when present; otherwise
``test_batch_first1000.bin`` (a file holding only the first 1,000 records of the official test
batch, as in exogym's shared offline data folder) is accepted in its place. The dataset's
:attr:`CIFAR10.test_set` attribute says which one was read.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from exogym.tasks.data.download import (
    DatasetNotFoundError,
    RemoteFile,
    ensure_files,
    mirrors_for,
    verify_file,
)
from exogym.tasks.data.paths import resolve_data_dir

__all__ = [
    "ARCHIVE",
    "BATCH_FILES",
    "CIFAR10",
    "CLASSES",
    "MEAN",
    "MIRRORS",
    "PARTIAL_TEST_FILE",
    "STD",
    "TEST_FILE",
    "TRAIN_FILES",
    "load_cifar10",
    "read_cifar_batch",
    "verify_batch",
]

MIRRORS: tuple[str, ...] = ("https://www.cs.toronto.edu/~kriz/",)
"""Where the official archive is served."""

ARCHIVE = RemoteFile("cifar-10-binary.tar.gz", md5="c32a1d4ab5d03f1284b67883e8d87530")
"""The official CIFAR-10 binary archive with its published MD5."""

TRAIN_FILES: tuple[str, ...] = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
"""The five training batches, 10,000 records each."""
TEST_FILE = "test_batch.bin"
"""The official test batch (10,000 records)."""
PARTIAL_TEST_FILE = "test_batch_first1000.bin"
"""Accepted instead of :data:`TEST_FILE` when that is absent: its first 1,000 records."""

CLASSES: tuple[str, ...] = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)
MEAN: tuple[float, float, float] = (0.4914, 0.4822, 0.4465)
"""Per-channel mean of the training pixels (scaled to [0, 1])."""
STD: tuple[float, float, float] = (0.2470, 0.2435, 0.2616)
"""Per-channel standard deviation of the training pixels (scaled to [0, 1])."""

RECORD_BYTES = 1 + 3 * 32 * 32

# The extracted files, with their sizes and checksums: sha256 of the official archive's training
# batches and of the first-1,000-records test file (shared/data/SHA256SUMS, byte-identical to the
# official release), the published md5 of the full test batch.
BATCH_FILES: dict[str, tuple[int, RemoteFile]] = {
    "data_batch_1.bin": (10_000, RemoteFile("data_batch_1.bin", sha256=(
        "cee916563c9f80d84e3cc88e17fdc0941787f1244f00a67874d45b261883ada5"))),
    "data_batch_2.bin": (10_000, RemoteFile("data_batch_2.bin", sha256=(
        "a591ca11fa1708a91ee40f54b3da4784ccd871ecf2137de63f51ada8b3fa57ed"))),
    "data_batch_3.bin": (10_000, RemoteFile("data_batch_3.bin", sha256=(
        "bbe8596564c0f86427f876058170b84dac6670ddf06d79402899d93ceea26f67"))),
    "data_batch_4.bin": (10_000, RemoteFile("data_batch_4.bin", sha256=(
        "014e562d6e23c72197cc727519169a60359f5eccd8945ad5a09d710285ff4e48"))),
    "data_batch_5.bin": (10_000, RemoteFile("data_batch_5.bin", sha256=(
        "755304fc0b379caeae8c14f0dac912fbc7d6cd469eb67a1029a08a39453a9add"))),
    "test_batch.bin": (10_000, RemoteFile("test_batch.bin",
                                          md5="803d5f7f4d78ea53de84dbe85f74fb6d")),
    "test_batch_first1000.bin": (1_000, RemoteFile("test_batch_first1000.bin", sha256=(
        "8314c96d7cd65618193bab23acdd5d4c4af15bf6dd00a1781d55beedf3be1ef5"))),
}
"""Extracted file name -> (records, checksums): :func:`verify_batch` checks both."""


def verify_batch(path: Path) -> None:
    """A CIFAR-10 batch file must have its official size and checksum (a truncated or altered
    file would otherwise train silently on the wrong data).

    Raises:
        ValueError: the size is wrong (naming the file, the size found and the one expected).
        ChecksumError: the checksum is wrong.
    """
    records, spec = BATCH_FILES[path.name]
    size = path.stat().st_size
    if size != records * RECORD_BYTES:
        raise ValueError(
            f"CIFAR-10 file {str(path)!r} has {size:,} bytes ({size / RECORD_BYTES:,.1f} "
            f"records), expected {records * RECORD_BYTES:,} ({records:,} records): it is "
            "truncated or not the official file; delete it and extract the official "
            f"{ARCHIVE.name} again")
    verify_file(path, spec)
_SUBDIR = "cifar10"
_BATCH_DIR = "cifar-10-batches-bin"


def read_cifar_batch(path: str | os.PathLike[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Read one CIFAR-10 binary batch file.

    Returns:
        ``(images uint8 [L, 3, 32, 32], labels int64 [L])``, channels in R, G, B order.

    Raises:
        ValueError: naming the file, if its size is not a multiple of 3073 bytes or a label is
            outside 0..9.
        OSError: if the file cannot be read.
    """
    path = Path(path)
    data = path.read_bytes()
    if len(data) % RECORD_BYTES != 0:
        raise ValueError(
            f"CIFAR-10 batch {str(path)!r} has {len(data)} bytes, not a multiple of the "
            f"{RECORD_BYTES}-byte record (1 label byte + 3x32x32 pixel bytes)"
        )
    records = np.frombuffer(data, dtype=np.uint8).reshape(-1, RECORD_BYTES)
    labels = torch.from_numpy(records[:, 0].astype(np.int64))
    images = torch.from_numpy(records[:, 1:].reshape(-1, 3, 32, 32).copy())
    if len(labels) and int(labels.max()) > 9:
        raise ValueError(
            f"CIFAR-10 batch {str(path)!r} has a label {int(labels.max())} outside 0..9"
        )
    return images, labels


def _extract(archive: Path, dest: Path) -> None:
    """Extract the regular files under ``cifar-10-batches-bin/`` (no links, no ``..``)."""
    with tarfile.open(archive, "r:gz") as tar:
        members = [
            m for m in tar.getmembers()
            if (m.isfile() or m.isdir()) and m.name.startswith(_BATCH_DIR)
            and ".." not in Path(m.name).parts and not Path(m.name).is_absolute()
        ]
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
            tar.extractall(dest, members=members, filter="data")
        else:
            tar.extractall(dest, members=members)


def _batch_dir(data_dir: str | os.PathLike[str] | None, download: bool) -> Path:
    """The batch folder, fetching what is missing: the batch files themselves from the mirrors of
    ``EXOGYM_DATA_MIRRORS``, else the archive (from those, then :data:`MIRRORS`), extracted."""
    root = resolve_data_dir(data_dir) / _SUBDIR
    folder = root / _BATCH_DIR
    missing = [n for n in TRAIN_FILES if not (folder / n).is_file()]
    has_test = (folder / TEST_FILE).is_file() or (folder / PARTIAL_TEST_FILE).is_file()
    if not missing and has_test:
        return folder
    names = missing + ([] if has_test else [f"{TEST_FILE} (or {PARTIAL_TEST_FILE})"])
    if not download:
        raise DatasetNotFoundError(
            f"dataset 'cifar10': required files are missing.\n"
            f"  folder searched: {folder}\n"
            f"  missing files:   {', '.join(names)}\n"
            f"  download:        disabled (download=False), no mirror tried\n"
            f"To fix: extract the official {ARCHIVE.name} into {root}, or set EXOGYM_DATA_DIR "
            f"(or pass --data-dir) to a folder containing '{_SUBDIR}/{_BATCH_DIR}/'."
        )
    file_mirrors = mirrors_for(f"{_SUBDIR}/{_BATCH_DIR}", ())
    tried = ""
    if file_mirrors:  # a mirror laid out like a data directory serves the files themselves
        try:
            _fetch_batches(folder, missing, has_test, file_mirrors)
            return folder
        except DatasetNotFoundError as err:
            tried = f"\nfetching the files themselves failed too:\n{err}"
    try:
        (archive,) = ensure_files(root, [ARCHIVE], mirrors_for(_SUBDIR, MIRRORS),
                                  dataset=_SUBDIR, download=True)
    except DatasetNotFoundError as err:
        raise DatasetNotFoundError(f"CIFAR-10 files missing in {folder}: {', '.join(names)}; "
                                   f"fetching the archive that holds them failed:\n{err}{tried}"
                                   ) from None
    _extract(archive, root)
    return folder


def _fetch_batches(folder: Path, missing: list[str], has_test: bool,
                   mirrors: Sequence[str]) -> None:
    """Download the ``missing`` training batches and, if ``not has_test``, the test batch (the
    official one, else the first 1,000 records), each verified by :data:`BATCH_FILES`."""
    ensure_files(folder, [BATCH_FILES[n][1] for n in missing], mirrors, dataset=_SUBDIR)
    if not has_test:
        try:
            ensure_files(folder, [BATCH_FILES[TEST_FILE][1]], mirrors, dataset=_SUBDIR)
        except DatasetNotFoundError:
            ensure_files(folder, [BATCH_FILES[PARTIAL_TEST_FILE][1]], mirrors, dataset=_SUBDIR)


class CIFAR10(Dataset):
    """CIFAR-10 train or test split, held in memory as uint8 and normalised per batch.

    Attributes:
        classes: number of classes (10).
        root: the ``cifar-10-batches-bin`` folder read.
        train: whether this is the 50,000-image training split (else the test split).
        test_set: which test file was used, e.g. ``"test_batch.bin (10,000)"`` or
            ``"test_batch_first1000.bin (first 1,000 of the official test set)"``; for the
            training split, ``"data_batch_1..5.bin (50,000)"``.
        data: uint8 ``[L, 3, 32, 32]`` raw pixels (R, G, B).
        targets: int64 ``[L]`` with values in ``0..9``.

    Items and batches are float32 images ``(pixel / 255 - MEAN[c]) / STD[c]``; no augmentation.
    :meth:`get_batch` returns a collated batch by tensor indexing (the trainer's fast path).
    """

    classes = 10

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        train: bool = True,
        *,
        download: bool = True,
    ) -> None:
        """Load a split from ``<root>/cifar10/cifar-10-batches-bin``.

        Args:
            root: data directory (resolved by :func:`resolve_data_dir`).
            train: load the training batches if ``True``, else the test batch.
            download: allow downloading and extracting the official archive when files are
                missing.

        Raises:
            DatasetNotFoundError: files missing and not downloadable.
            ChecksumError: the archive present is corrupted.
            ValueError: a file is not a valid CIFAR-10 binary batch.
        """
        self.root = _batch_dir(root, download)
        self.train = bool(train)
        if self.train:
            for n in TRAIN_FILES:
                verify_batch(self.root / n)
            parts = [read_cifar_batch(self.root / n) for n in TRAIN_FILES]
            self.data = torch.cat([p[0] for p in parts])
            self.targets: torch.Tensor = torch.cat([p[1] for p in parts])
            self.test_set = f"data_batch_1..5.bin ({len(self.targets):,})"
        else:
            full = self.root / TEST_FILE
            path = full if full.is_file() else self.root / PARTIAL_TEST_FILE
            verify_batch(path)
            self.data, self.targets = read_cifar_batch(path)
            if path == full:
                self.test_set = f"{TEST_FILE} ({len(self.targets):,})"
            else:
                self.test_set = (
                    f"{PARTIAL_TEST_FILE} (first {len(self.targets):,} of the official test set)"
                )
        self._mean = torch.tensor(MEAN).view(1, 3, 1, 1) * 255.0
        self._std = torch.tensor(STD).view(1, 3, 1, 1) * 255.0

    def _normalise(self, raw: torch.Tensor) -> torch.Tensor:
        return (raw.to(torch.float32) - self._mean) / self._std

    def __len__(self) -> int:
        """Number of examples."""
        return int(self.targets.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(image [3, 32, 32] float32, label scalar int64)``.

        Raises:
            IndexError: if ``index`` is out of range.
        """
        return self._normalise(self.data[index].unsqueeze(0))[0], self.targets[index]

    def get_batch(
        self, indices: Sequence[int] | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(images [B, 3, 32, 32] float32, targets [B] int64)`` by tensor indexing.

        Raises:
            IndexError: if an index is out of range.
        """
        idx = torch.as_tensor(indices, dtype=torch.long)
        return self._normalise(self.data[idx]), self.targets[idx]

    def __repr__(self) -> str:
        split = "train" if self.train else "test"
        return f"CIFAR10(split={split!r}, size={len(self)}, set={self.test_set!r})"


def load_cifar10(
    data_dir: str | os.PathLike[str] | None = None, *, download: bool = True
) -> tuple[CIFAR10, CIFAR10]:
    """Return ``(train, test)`` CIFAR-10 splits; ``test.test_set`` names the test file used."""
    _batch_dir(data_dir, download)
    return CIFAR10(data_dir, True, download=download), CIFAR10(data_dir, False, download=download)
