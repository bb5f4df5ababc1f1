"""Tests for exogym.tasks.data: data-dir resolution, IDX parsing, MNIST, verified downloads.

The real MNIST files are read from the tests' data folder (the ``mnist_data`` fixture of
``conftest.py``).
"""

from __future__ import annotations

import gzip
import hashlib
import re
import shutil
import struct
from pathlib import Path

import pytest
import torch

from exogym.tasks.data.download import (
    ChecksumError,
    DatasetNotFoundError,
    RemoteFile,
    ensure_files,
    file_digest,
)
from exogym.tasks.data.mnist import FILES, MEAN, MNIST, STD, TEST_LABELS, load_mnist, read_idx
from exogym.tasks.data.paths import ENV_VAR, default_cache_dir, resolve_data_dir


@pytest.fixture(scope="module")
def data_root(mnist_data: Path) -> Path:
    return mnist_data


@pytest.fixture(scope="module")
def mnist_train(data_root: Path) -> MNIST:
    return MNIST(data_root, train=True, download=False)


@pytest.fixture(scope="module")
def mnist_test(data_root: Path) -> MNIST:
    return MNIST(data_root, train=False, download=False)


# --------------------------------------------------------------------------- paths


def test_resolve_data_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert default_cache_dir() == tmp_path / "xdg" / "exogym" / "data"
    assert resolve_data_dir() == tmp_path / "xdg" / "exogym" / "data"

    monkeypatch.setenv(ENV_VAR, "")  # empty counts as unset
    assert resolve_data_dir() == tmp_path / "xdg" / "exogym" / "data"

    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env"))
    assert resolve_data_dir() == tmp_path / "env"
    assert resolve_data_dir(None) == tmp_path / "env"

    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"
    assert resolve_data_dir(str(tmp_path / "arg")) == tmp_path / "arg"
    assert not (tmp_path / "arg").exists()  # resolving never creates


def test_resolve_data_dir_home_expansion_and_relative(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert default_cache_dir() == tmp_path / ".cache" / "exogym" / "data"
    assert resolve_data_dir("~/d") == tmp_path / "d"
    monkeypatch.setenv(ENV_VAR, "~/e")
    assert resolve_data_dir() == tmp_path / "e"

    monkeypatch.chdir(tmp_path)
    out = resolve_data_dir("rel")
    assert out.is_absolute() and out == tmp_path / "rel"


def test_resolve_data_dir_rejects_file(tmp_path: Path) -> None:
    f = tmp_path / "not_a_dir"
    f.write_text("x")
    with pytest.raises(ValueError, match="not_a_dir"):
        resolve_data_dir(f)


# --------------------------------------------------------------------------- read_idx


def test_read_idx_real_files(data_root: Path) -> None:
    folder = data_root / "mnist"
    train_images = read_idx(folder / "train-images-idx3-ubyte.gz")
    train_labels = read_idx(folder / "train-labels-idx1-ubyte.gz")
    test_images = read_idx(folder / "t10k-images-idx3-ubyte.gz")
    test_labels = read_idx(folder / "t10k-labels-idx1-ubyte.gz")
    assert train_images.shape == (60000, 28, 28) and train_images.dtype == torch.uint8
    assert test_images.shape == (10000, 28, 28) and test_images.dtype == torch.uint8
    assert train_labels.shape == (60000,) and train_labels.dtype == torch.uint8
    assert test_labels.shape == (10000,)
    assert int(train_labels[0]) == 5
    assert int(train_labels.max()) == 9 and int(train_labels.min()) == 0
    assert int(torch.bincount(train_labels.long(), minlength=10).sum()) == 60000
    assert int(torch.bincount(test_labels.long(), minlength=10).sum()) == 10000
    assert int(train_images.max()) == 255


def _idx_bytes(code: int, shape: tuple[int, ...], payload: bytes) -> bytes:
    return bytes([0, 0, code, len(shape)]) + struct.pack(f">{len(shape)}I", *shape) + payload


@pytest.mark.parametrize("compress", ["raw", "gz_suffix", "gz_magic_only"])
def test_read_idx_tiny_int16(tmp_path: Path, compress: str) -> None:
    values = [-1, 2, 300, -32768, 32767, 0]
    data = _idx_bytes(0x0B, (2, 3), struct.pack(">6h", *values))
    if compress == "raw":
        path = tmp_path / "tiny.idx"
        path.write_bytes(data)
    else:
        path = tmp_path / ("tiny.idx.gz" if compress == "gz_suffix" else "tiny.idx")
        path.write_bytes(gzip.compress(data))
    out = read_idx(path)
    assert out.dtype == torch.int16
    assert out.tolist() == [[-1, 2, 300], [-32768, 32767, 0]]
    out[0, 0] = 7  # writable, owns its memory


def test_read_idx_tiny_other_dtypes(tmp_path: Path) -> None:
    cases = [
        (0x08, torch.uint8, struct.pack(">3B", 0, 128, 255), [0, 128, 255]),
        (0x09, torch.int8, struct.pack(">3b", -128, 0, 127), [-128, 0, 127]),
        (0x0C, torch.int32, struct.pack(">3i", -(2**31), 1, 2**31 - 1), [-(2**31), 1, 2**31 - 1]),
        (0x0D, torch.float32, struct.pack(">3f", 1.5, -2.25, 0.0), [1.5, -2.25, 0.0]),
        (0x0E, torch.float64, struct.pack(">3d", 1e300, -0.5, 3.0), [1e300, -0.5, 3.0]),
    ]
    for code, dtype, payload, expected in cases:
        path = tmp_path / f"t{code}.idx"
        path.write_bytes(_idx_bytes(code, (3,), payload))
        out = read_idx(path)
        assert out.dtype == dtype and out.tolist() == expected


def test_read_idx_rejects_bad_files(tmp_path: Path) -> None:
    bad_magic = tmp_path / "bad_magic.idx"
    bad_magic.write_bytes(b"\x01\x00\x08\x01" + struct.pack(">I", 1) + b"\x00")
    with pytest.raises(ValueError, match=re.escape("bad_magic.idx")):
        read_idx(bad_magic)

    bad_code = tmp_path / "bad_code.idx"
    bad_code.write_bytes(_idx_bytes(0x07, (1,), b"\x00"))
    with pytest.raises(ValueError, match="dtype code"):
        read_idx(bad_code)

    truncated = tmp_path / "truncated.idx"
    truncated.write_bytes(_idx_bytes(0x08, (2, 2), b"\x00\x01\x02"))
    with pytest.raises(ValueError, match=re.escape("truncated.idx")):
        read_idx(truncated)

    not_gzip = tmp_path / "not_gzip.gz"
    not_gzip.write_bytes(b"plain bytes")
    with pytest.raises(ValueError, match=re.escape("not_gzip.gz")):
        read_idx(not_gzip)


# --------------------------------------------------------------------------- MNIST


def test_mnist_lengths_and_types(mnist_train: MNIST, mnist_test: MNIST) -> None:
    assert len(mnist_train) == 60000 and len(mnist_test) == 10000
    assert MNIST.classes == 10
    assert mnist_train.images.shape == (60000, 1, 28, 28)
    assert mnist_train.images.dtype == torch.float32
    assert mnist_train.targets.shape == (60000,) and mnist_train.targets.dtype == torch.int64
    assert mnist_test.images.shape == (10000, 1, 28, 28)
    assert int(mnist_train.targets[0]) == 5


def test_mnist_normalisation(mnist_train: MNIST) -> None:
    images = mnist_train.images
    assert abs(float(images.mean())) < 0.01
    assert abs(float(images.std()) - 1.0) < 0.01
    assert float(images.min()) == pytest.approx((0.0 - MEAN) / STD, abs=1e-5)
    assert float(images.max()) == pytest.approx((1.0 - MEAN) / STD, abs=1e-5)


def test_mnist_item_access(mnist_train: MNIST) -> None:
    image, label = mnist_train[3]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32
    assert label.shape == () and label.dtype == torch.int64

    images, labels = mnist_train.get_batch([3, 7])
    assert torch.equal(images, torch.stack([mnist_train[3][0], mnist_train[7][0]]))
    assert torch.equal(labels, torch.stack([mnist_train[3][1], mnist_train[7][1]]))

    images_t, labels_t = mnist_train.get_batch(torch.tensor([3, 7]))
    assert torch.equal(images_t, images) and torch.equal(labels_t, labels)

    with pytest.raises(IndexError):
        mnist_train[60000]


def test_mnist_plain_dataloader(mnist_test: MNIST) -> None:
    loader = torch.utils.data.DataLoader(mnist_test, batch_size=32)
    images, labels = next(iter(loader))
    assert images.shape == (32, 1, 28, 28) and labels.shape == (32,)
    assert torch.equal(labels, mnist_test.targets[:32])


def test_load_mnist(data_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(data_root))
    train, test = load_mnist(download=False)
    assert (len(train), len(test)) == (60000, 10000)
    assert train.root == data_root / "mnist"


def test_mnist_missing_without_download(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        MNIST(tmp_path, train=False, download=False)
    msg = str(info.value)
    assert str(tmp_path / "mnist") in msg and "t10k-images-idx3-ubyte.gz" in msg
    assert ENV_VAR in msg


# --------------------------------------------------------------------------- downloads


def test_remote_file_validation() -> None:
    with pytest.raises(ValueError, match="no checksum"):
        RemoteFile("a.gz")
    with pytest.raises(ValueError, match="md5"):
        RemoteFile("a.gz", md5="xyz")
    with pytest.raises(ValueError, match="sha256"):
        RemoteFile("a.gz", sha256="ab" * 16)
    with pytest.raises(ValueError, match=re.escape("dir/a.gz")):
        RemoteFile("dir/a.gz", md5="0" * 32)
    assert RemoteFile("a.gz", md5="AB" * 16).checksums() == {"md5": "ab" * 16}


def test_file_digest(tmp_path: Path) -> None:
    f = tmp_path / "f.bin"
    f.write_bytes(b"hello" * 1000)
    assert file_digest(f, "md5") == hashlib.md5(b"hello" * 1000).hexdigest()
    assert file_digest(f, "sha256") == hashlib.sha256(b"hello" * 1000).hexdigest()
    with pytest.raises(ValueError, match="nope"):
        file_digest(f, "nope")


@pytest.fixture
def good_mirror(data_root: Path, tmp_path: Path) -> Path:
    """A folder holding a real copy of t10k-labels, to be served as a file:// mirror."""
    mirror = tmp_path / "good_mirror"
    mirror.mkdir()
    shutil.copyfile(data_root / "mnist" / TEST_LABELS.name, mirror / TEST_LABELS.name)
    return mirror


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_ensure_files_downloads_from_file_mirror(good_mirror: Path, tmp_path: Path) -> None:
    target = tmp_path / "data" / "mnist"  # does not exist yet
    paths = ensure_files(target, [TEST_LABELS], [good_mirror.as_uri()], dataset="mnist")
    assert paths == [target / TEST_LABELS.name]
    assert file_digest(paths[0], "md5") == TEST_LABELS.md5
    assert _leftovers(target) == [TEST_LABELS.name]  # no .part left
    # Second call: present and verified, no mirror needed.
    assert ensure_files(target, [TEST_LABELS], [], dataset="mnist", download=False) == paths


def test_ensure_files_rejects_corrupt_mirror(tmp_path: Path) -> None:
    bad_mirror = tmp_path / "bad_mirror"
    bad_mirror.mkdir()
    (bad_mirror / TEST_LABELS.name).write_bytes(b"not the real labels")
    target = tmp_path / "target"
    with pytest.raises((ChecksumError, DatasetNotFoundError)) as info:
        ensure_files(target, [TEST_LABELS], [bad_mirror.as_uri() + "/"], dataset="mnist")
    assert "checksum" in str(info.value).lower()
    assert _leftovers(target) == []


def test_ensure_files_falls_back_to_next_mirror(good_mirror: Path, tmp_path: Path) -> None:
    bad_mirror = tmp_path / "bad_mirror"
    bad_mirror.mkdir()
    (bad_mirror / TEST_LABELS.name).write_bytes(b"corrupt")
    empty_mirror = tmp_path / "empty_mirror"
    empty_mirror.mkdir()
    target = tmp_path / "target"
    mirrors = [empty_mirror.as_uri(), bad_mirror.as_uri(), good_mirror.as_uri()]
    (path,) = ensure_files(target, [TEST_LABELS], mirrors, dataset="mnist")
    assert file_digest(path, "md5") == TEST_LABELS.md5
    assert _leftovers(target) == [TEST_LABELS.name]


def test_ensure_files_all_mirrors_fail_message(tmp_path: Path) -> None:
    mirror = tmp_path / "empty_mirror"
    mirror.mkdir()
    target = tmp_path / "target"
    with pytest.raises(DatasetNotFoundError) as info:
        ensure_files(target, [TEST_LABELS], [mirror.as_uri()], dataset="mnist")
    msg = str(info.value)
    for needle in (str(target), TEST_LABELS.name, mirror.as_uri(), ENV_VAR, "--data-dir", "mnist/"):
        assert needle in msg
    assert _leftovers(target) == []


def test_ensure_files_no_download_message(tmp_path: Path) -> None:
    target = tmp_path / "empty"
    with pytest.raises(DatasetNotFoundError) as info:
        ensure_files(target, FILES, ["file:///nowhere/"], dataset="mnist", download=False)
    msg = str(info.value)
    assert str(target) in msg
    assert ENV_VAR in msg
    for f in FILES:
        assert f.name in msg
    assert not target.exists()  # nothing created when not downloading


def test_ensure_files_existing_corrupt_file_untouched(good_mirror: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    corrupt = target / TEST_LABELS.name
    corrupt.write_bytes(b"user data, do not overwrite")
    with pytest.raises(ChecksumError) as info:
        ensure_files(target, [TEST_LABELS], [good_mirror.as_uri()], dataset="mnist")
    msg = str(info.value)
    assert str(corrupt) in msg and TEST_LABELS.md5 in msg and "delete" in msg
    assert corrupt.read_bytes() == b"user data, do not overwrite"
    assert _leftovers(target) == [TEST_LABELS.name]
