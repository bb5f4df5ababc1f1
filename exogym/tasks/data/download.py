"""Locate, verify and (optionally) download dataset files.

The contract of :func:`ensure_files` is conservative:

* a file that is already present is verified and kept; if its checksum is wrong it is
  **never** overwritten, a :class:`ChecksumError` tells the user to delete it;
* downloads go to a hidden ``.<name>.part`` file in the target folder, are verified, and only
  then atomically renamed to ``<name>``; a failed or corrupt download leaves nothing behind;
* when files cannot be obtained, :class:`DatasetNotFoundError` explains where exogym looked,
  what was tried and how to fix it.

Mirrors: each dataset has its official sources; ``EXOGYM_DATA_MIRRORS`` (:data:`MIRRORS_ENV_VAR`)
adds mirrors tried before them, for a machine that reaches a local copy but not the internet (a
lab's file server, or ``python -m http.server`` in a data folder). Each is the base URL of a
folder laid out like a data directory: ``<url>/mnist/train-images-idx3-ubyte.gz``,
``<url>/tinyshakespeare/input.txt``, ``<url>/cifar10/cifar-10-batches-bin/data_batch_1.bin``.
Whatever a mirror serves is verified against the same checksums as the official files.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from exogym.tasks.data.paths import ENV_VAR

__all__ = [
    "MIRRORS_ENV_VAR",
    "ChecksumError",
    "DatasetNotFoundError",
    "RemoteFile",
    "ensure_files",
    "file_digest",
    "mirrors_for",
    "verify_file",
]

logger = logging.getLogger("exogym")

MIRRORS_ENV_VAR = "EXOGYM_DATA_MIRRORS"
"""Environment variable: base URLs of mirrors laid out like a data directory, separated by spaces,
tried in order before each dataset's official sources (see :func:`mirrors_for`)."""

TIMEOUT_S = 30.0
"""Network timeout (seconds) for each ``urlopen`` call."""

_CHUNK = 1 << 20
_HEX_LEN = {"md5": 32, "sha256": 64}
_HEX_RE = re.compile(r"^[0-9a-fA-F]+$")


class DatasetNotFoundError(FileNotFoundError):
    """Dataset files are missing locally and could not be downloaded."""


class ChecksumError(RuntimeError):
    """A local file does not have the expected checksum."""


@dataclass(frozen=True)
class RemoteFile:
    """A file of a dataset, identified by its name and at least one checksum.

    Attributes:
        name: plain file name (no directory part), used both locally and on mirrors.
        md5: expected MD5 hex digest, or ``None``.
        sha256: expected SHA-256 hex digest, or ``None``.

    Raises:
        ValueError: if ``name`` is empty or contains a path separator, if no checksum is
            given, or if a checksum is not a hex string of the right length.
    """

    name: str
    md5: str | None = None
    sha256: str | None = None

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or "\\" in self.name or self.name in (".", ".."):
            raise ValueError(
                f"RemoteFile name {self.name!r} is invalid; expected a plain file name "
                "without directory separators"
            )
        if self.md5 is None and self.sha256 is None:
            raise ValueError(f"RemoteFile {self.name!r} has no checksum; give md5 and/or sha256")
        for algo, value in self.checksums().items():
            if len(value) != _HEX_LEN[algo] or not _HEX_RE.match(value):
                raise ValueError(
                    f"RemoteFile {self.name!r}: {algo} {value!r} is invalid; expected "
                    f"{_HEX_LEN[algo]} hexadecimal characters"
                )

    def checksums(self) -> dict[str, str]:
        """Return the given checksums as ``{algo: lowercase hex digest}``."""
        out: dict[str, str] = {}
        if self.md5 is not None:
            out["md5"] = self.md5.lower()
        if self.sha256 is not None:
            out["sha256"] = self.sha256.lower()
        return out


def mirrors_for(subdir: str, official: Sequence[str]) -> tuple[str, ...]:
    """The base URLs to fetch the files of ``<data_dir>/<subdir>/`` from, in the order to try them.

    Args:
        subdir: the files' folder inside a data directory, e.g. ``"mnist"`` or
            ``"cifar10/cifar-10-batches-bin"``.
        official: the dataset's own sources, tried last.

    Returns:
        ``<url>/<subdir>/`` for each URL of ``EXOGYM_DATA_MIRRORS`` (none when it is unset or
        blank), then ``official``.

    Raises:
        ValueError: naming the variable and the URL, if a URL is not ``http://HOST/...``,
            ``https://HOST/...`` or ``file:///PATH``.
    """
    urls = os.environ.get(MIRRORS_ENV_VAR, "").split()
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        if not ((parts.scheme in ("http", "https") and parts.hostname)
                or (parts.scheme == "file" and parts.path)):
            raise ValueError(
                f"{MIRRORS_ENV_VAR}: {url!r} is not a mirror URL; expected http://HOST/..., "
                "https://HOST/... or file:///PATH, several separated by spaces"
            )
    return (*(f"{url.rstrip('/')}/{subdir.strip('/')}/" for url in urls), *official)


def file_digest(path: str | os.PathLike[str], algo: str) -> str:
    """Return the lowercase hex digest of the file at ``path``, read in 1 MiB chunks.

    Args:
        path: file to hash.
        algo: any name accepted by :func:`hashlib.new` (e.g. ``"md5"``, ``"sha256"``).

    Raises:
        ValueError: if ``algo`` is not a hash algorithm known to hashlib.
        OSError: if the file cannot be read.
    """
    try:
        h = hashlib.new(algo)
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"unknown hash algorithm {algo!r}; expected one of "
            f"{sorted(hashlib.algorithms_available)}"
        ) from e
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _mismatches(actual: dict[str, str], expected: dict[str, str]) -> list[str]:
    return [
        f"{algo} {actual[algo]} (expected {want})"
        for algo, want in expected.items()
        if actual[algo] != want
    ]


def verify_file(path: str | os.PathLike[str], spec: RemoteFile) -> None:
    """Raise :class:`ChecksumError` naming ``path`` unless it has ``spec``'s checksums."""
    _verify_existing(Path(path), spec)


def _verify_existing(path: Path, spec: RemoteFile) -> None:
    actual = {algo: file_digest(path, algo) for algo in spec.checksums()}
    bad = _mismatches(actual, spec.checksums())
    if bad:
        raise ChecksumError(
            f"existing file {str(path)!r} has the wrong checksum: {'; '.join(bad)}. "
            "It is corrupted or a different version. exogym will not overwrite it: "
            f"delete it (rm {str(path)!r}) to re-download it, or replace it with a correct copy."
        )


def _short(exc: BaseException, limit: int = 160) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fetch(url: str, final: Path, spec: RemoteFile) -> None:
    """Download ``url`` to ``final`` via a verified temp file; raise on any failure."""
    part = final.with_name(f".{final.name}.part")
    hashers = {algo: hashlib.new(algo) for algo in spec.checksums()}
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp, open(part, "wb") as out:
            while chunk := resp.read(_CHUNK):
                out.write(chunk)
                for h in hashers.values():
                    h.update(chunk)
            out.flush()
            os.fsync(out.fileno())
        actual = {algo: h.hexdigest() for algo, h in hashers.items()}
        bad = _mismatches(actual, spec.checksums())
        if bad:
            raise ChecksumError(f"checksum mismatch: {'; '.join(bad)}")
        os.replace(part, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            part.unlink()


def _not_found_message(
    dataset: str,
    folder: Path,
    missing: Sequence[str],
    mirrors: Sequence[str],
    errors: Sequence[str],
    download: bool,
) -> str:
    lines = [
        f"dataset {dataset!r}: required files are missing.",
        f"  folder searched: {folder}",
        f"  missing files:   {', '.join(missing)}",
    ]
    if not download:
        lines.append("  download:        disabled (download=False), no mirror tried")
    elif errors:
        lines.append("  mirrors tried:")
        lines.extend(f"    {e}" for e in errors)
    else:
        lines.append(f"  mirrors:         none configured ({list(mirrors)!r})")
    lines.append(
        f"To fix: put these files in {folder}, or set {ENV_VAR} (or pass --data-dir) to a "
        f"folder containing '{dataset}/' with these files."
    )
    return "\n".join(lines)


def ensure_files(
    folder: Path,
    files: Sequence[RemoteFile],
    mirrors: Sequence[str],
    *,
    dataset: str,
    download: bool = True,
) -> list[Path]:
    """Make sure every file of ``files`` is present in ``folder`` with the right checksum.

    Args:
        folder: directory holding the dataset's files (created if a download is needed).
        files: the files required.
        mirrors: base URLs tried in order; a file's URL is ``mirror.rstrip('/') + '/' + name``.
            Any scheme understood by :func:`urllib.request.urlopen` works, ``file://``
            included.
        dataset: dataset name used in messages (and as the sub-folder name users should create).
        download: if ``False``, never touch the network; missing files are an error.

    Returns:
        ``[folder / f.name for f in files]``, in order; every path exists and is verified.

    Raises:
        ChecksumError: an existing file has a wrong checksum (it is left untouched).
        DatasetNotFoundError: a file is missing and could not be downloaded from any mirror
            (or ``download`` is ``False``). Files downloaded before the failure are kept.
    """
    folder = Path(folder)
    paths = [folder / f.name for f in files]

    missing: list[tuple[RemoteFile, Path]] = []
    for spec, path in zip(files, paths, strict=True):
        if path.exists():
            _verify_existing(path, spec)
        else:
            missing.append((spec, path))
    if not missing:
        return paths

    if not download:
        raise DatasetNotFoundError(
            _not_found_message(
                dataset, folder, [s.name for s, _ in missing], mirrors, [], download=False
            )
        )

    folder.mkdir(parents=True, exist_ok=True)
    for i, (spec, path) in enumerate(missing):
        errors: list[str] = []
        for mirror in mirrors:
            url = mirror.rstrip("/") + "/" + spec.name
            logger.info(
                "exogym: downloading %s (%s) from %s to %s", spec.name, dataset, url, folder
            )
            try:
                _fetch(url, path, spec)
            except Exception as e:  # any failure (network, HTTP, checksum): try the next mirror
                errors.append(f"{url}: {_short(e)}")
                continue
            break
        else:
            still_missing = [s.name for s, _ in missing[i:]]
            raise DatasetNotFoundError(
                _not_found_message(dataset, folder, still_missing, mirrors, errors, download=True)
            )
    return paths
