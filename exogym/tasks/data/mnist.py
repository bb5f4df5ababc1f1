"""MNIST as in-memory tensors, read from the original IDX files.

The four original files (``train-images-idx3-ubyte.gz`` ...) are looked up in
``<data_dir>/mnist/`` (see :func:`exogym.tasks.data.paths.resolve_data_dir`), verified by MD5 and
downloaded from public mirrors when missing (unless ``download=False``), after any mirror of
``EXOGYM_DATA_MIRRORS`` (:func:`exogym.tasks.data.download.mirrors_for`).
"""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from exogym.tasks.data.download import RemoteFile, ensure_files, mirrors_for
from exogym.tasks.data.paths import resolve_data_dir

__all__ = ["FILES", "MEAN", "MIRRORS", "MNIST", "STD", "load_mnist", "read_idx"]

MIRRORS: tuple[str, ...] = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
"""Public mirrors serving the original MNIST file names, tried in order."""

TRAIN_IMAGES = RemoteFile("train-images-idx3-ubyte.gz", md5="f68b3c2dcbeaaa9fbdd348bbdeb94873")
TRAIN_LABELS = RemoteFile("train-labels-idx1-ubyte.gz", md5="d53e105ee54ea40749a09fcbcd1e9432")
TEST_IMAGES = RemoteFile("t10k-images-idx3-ubyte.gz", md5="9fb629c4189551a2d022fa330f9573f3")
TEST_LABELS = RemoteFile("t10k-labels-idx1-ubyte.gz", md5="ec29112dd5afa0611ce80d1b7f02629c")

FILES: tuple[RemoteFile, ...] = (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS)
"""The four original MNIST files with their official MD5 checksums."""

MEAN = 0.1307
"""Mean pixel value of the MNIST training set (pixels scaled to [0, 1])."""
STD = 0.3081
"""Standard deviation of the MNIST training-set pixels (pixels scaled to [0, 1])."""

_SUBDIR = "mnist"
_GZIP_MAGIC = b"\x1f\x8b"
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_bytes(path: Path) -> bytes:
    with open(path, "rb") as f:
        head = f.read(2)
    if path.name.endswith(".gz") or head == _GZIP_MAGIC:
        try:
            with gzip.open(path, "rb") as g:
                return g.read()
        except (OSError, EOFError, zlib.error) as e:
            raise ValueError(f"IDX file {str(path)!r} is not a valid gzip stream: {e}") from e
    return path.read_bytes()


def read_idx(path: str | os.PathLike[str]) -> torch.Tensor:
    """Read an IDX file (optionally gzip-compressed) into a tensor.

    The file is gunzipped when its name ends with ``.gz`` or it starts with the gzip magic
    bytes. Header: two zero bytes, a dtype code (``0x08`` uint8, ``0x09`` int8, ``0x0B`` int16,
    ``0x0C`` int32, ``0x0D`` float32, ``0x0E`` float64; multi-byte values big-endian), the
    number of dimensions, then one big-endian uint32 per dimension.

    Returns:
        A writable tensor (it owns its memory) of the file's shape, with the native-endian
        torch dtype matching the code.

    Raises:
        ValueError: naming the file, if the magic, dtype code, header or payload size is wrong.
        OSError: if the file cannot be read.
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4 or data[0:2] != b"\x00\x00":
        raise ValueError(
            f"IDX file {str(path)!r} has a bad magic number {data[:4].hex() or '<empty>'}; "
            "expected 2 zero bytes, a dtype code and the number of dimensions"
        )
    code, ndim = data[2], data[3]
    if code not in _IDX_DTYPES:
        allowed = ", ".join(f"0x{c:02X}" for c in _IDX_DTYPES)
        raise ValueError(
            f"IDX file {str(path)!r} has unknown dtype code 0x{code:02X}; allowed: {allowed}"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(
            f"IDX file {str(path)!r} is truncated: header needs {header} bytes for {ndim} "
            f"dimensions, file has {len(data)}"
        )
    shape = struct.unpack(f">{ndim}I", data[4:header])
    dtype = _IDX_DTYPES[code]
    expected = math.prod(shape) * dtype.itemsize
    if len(data) - header != expected:
        raise ValueError(
            f"IDX file {str(path)!r} has {len(data) - header} payload bytes, expected "
            f"{expected} for shape {shape} and dtype {dtype.name}"
        )
    array = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    array = array.astype(dtype.newbyteorder("="), copy=True)
    return torch.from_numpy(array)


class MNIST(Dataset):
    """MNIST train or test split, in memory: the pixels as bytes, normalised per batch.

    Attributes:
        classes: number of classes (10).
        root: folder holding the four IDX files (``<data_dir>/mnist``).
        train: whether this is the 60,000-image training split (else the 10,000-image test split).
        pixels: uint8 ``[L, 1, 28, 28]``, the files' pixels.
        images: float32 ``[L, 1, 28, 28]``, equal to ``(pixel / 255 - MEAN) / STD`` (a
            property: the whole split normalised on each access; batches normalise theirs).
        targets: int64 ``[L]`` with values in ``0..9``.
        test_set: the images file and size, e.g. ``"t10k-images-idx3-ubyte.gz (10,000)"``, for a
            run's records.

    Batch access: :meth:`get_batch` returns a whole collated batch ``(images[idx],
    targets[idx])`` by tensor indexing, the fast path exogym's trainer uses; a plain
    ``torch.utils.data.DataLoader`` works too, through ``__getitem__`` and default collation.
    """

    classes = 10

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        train: bool = True,
        *,
        download: bool = True,
    ) -> None:
        """Load a split, downloading and verifying its files as needed.

        Args:
            root: data directory (resolved by :func:`resolve_data_dir`: argument, then
                ``EXOGYM_DATA_DIR``, then the user cache); files are in ``root/"mnist"``.
            train: load the training split if ``True``, else the test split.
            download: allow downloading missing files from :data:`MIRRORS` (after those of
                ``EXOGYM_DATA_MIRRORS``, :func:`~exogym.tasks.data.download.mirrors_for`).

        Raises:
            DatasetNotFoundError: files missing and not downloadable.
            ChecksumError: a present file is corrupted.
            ValueError: a file is not a valid MNIST IDX file.
        """
        self.root = resolve_data_dir(root) / _SUBDIR
        self.train = bool(train)
        specs = (TRAIN_IMAGES, TRAIN_LABELS) if self.train else (TEST_IMAGES, TEST_LABELS)
        img_path, lbl_path = ensure_files(
            self.root, specs, mirrors_for(_SUBDIR, MIRRORS), dataset=_SUBDIR, download=download
        )
        raw_images = read_idx(img_path)
        raw_labels = read_idx(lbl_path)
        if raw_images.dtype != torch.uint8 or tuple(raw_images.shape[1:]) != (28, 28):
            raise ValueError(
                f"{str(img_path)!r} holds {raw_images.dtype} {tuple(raw_images.shape)}; "
                "expected uint8 images of shape (N, 28, 28)"
            )
        if raw_labels.dim() != 1 or raw_labels.shape[0] != raw_images.shape[0]:
            raise ValueError(
                f"{str(lbl_path)!r} holds labels of shape {tuple(raw_labels.shape)}; expected "
                f"({raw_images.shape[0]},) to match {img_path.name}"
            )
        self.targets: torch.Tensor = raw_labels.to(torch.int64)
        lo, hi = (int(self.targets.min()), int(self.targets.max())) if len(self.targets) else (0, 0)
        if lo < 0 or hi >= self.classes:
            raise ValueError(
                f"{str(lbl_path)!r} has labels outside 0..{self.classes - 1}: min {lo}, max {hi}"
            )
        # kept as bytes (47 MB for the training split, not 188 MB of float32), normalised per
        # batch: the same float32 operations in the same order, the same values
        self.pixels: torch.Tensor = raw_images.unsqueeze(1).contiguous()
        self.test_set = f"{img_path.name} ({len(self.targets):,})"

    @property
    def images(self) -> torch.Tensor:
        """Every image, normalised: float32 ``[L, 1, 28, 28]`` (built on each access)."""
        return _normalise(self.pixels)

    def __len__(self) -> int:
        """Number of examples (60,000 for train, 10,000 for test)."""
        return int(self.targets.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(image [1, 28, 28] float32, label scalar int64)``; negative indices allowed.

        Raises:
            IndexError: if ``index`` is out of range.
        """
        return _normalise(self.pixels[index]), self.targets[index]

    def get_batch(
        self, indices: Sequence[int] | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return a batch ``(images [B, 1, 28, 28], targets [B])`` by tensor indexing.

        Args:
            indices: 1-D list or tensor of integer indices (may repeat, may be negative).

        Raises:
            IndexError: if an index is out of range.
        """
        idx = torch.as_tensor(indices, dtype=torch.long)
        return _normalise(self.pixels[idx]), self.targets[idx]

    def __repr__(self) -> str:
        split = "train" if self.train else "test"
        return f"MNIST(split={split!r}, size={len(self)}, root={str(self.root)!r})"


def _normalise(pixels: torch.Tensor) -> torch.Tensor:
    """``(pixel / 255 - MEAN) / STD`` in float32."""
    return pixels.to(torch.float32).div_(255.0).sub_(MEAN).div_(STD)


def load_mnist(
    data_dir: str | os.PathLike[str] | None = None, *, download: bool = True
) -> tuple[MNIST, MNIST]:
    """Return ``(train, test)`` MNIST splits from ``data_dir`` (resolved as in :class:`MNIST`).

    All four files are checked (and downloaded if allowed) up front, so a missing-files error
    lists every missing file at once.
    """
    root = resolve_data_dir(data_dir)
    ensure_files(root / _SUBDIR, FILES, mirrors_for(_SUBDIR, MIRRORS), dataset=_SUBDIR,
                 download=download)
    return MNIST(root, train=True, download=download), MNIST(root, train=False, download=download)
