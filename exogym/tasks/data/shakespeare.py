"""Tiny Shakespeare, character level, as next-character prediction windows (nanoGPT style).

The corpus ``input.txt`` (1,115,394 characters, 65 distinct) is looked up in
``<data_dir>/tinyshakespeare/`` (see :func:`exogym.tasks.data.paths.resolve_data_dir`), verified by
SHA-256 and downloaded from the char-rnn repository when missing (unless ``download=False``), after
any mirror of ``EXOGYM_DATA_MIRRORS`` (:func:`exogym.tasks.data.download.mirrors_for`).

As in nanoGPT's ``shakespeare_char``: the vocabulary is the sorted set of characters of the whole
text (token id = rank of the character), the training split is the first 90% of the encoded text
and the validation split the last 10%.

Windows: a split of ``L`` tokens with block size ``T`` and stride ``s`` has
``(L - T - 1) // s + 1`` windows; window ``i`` starts at token ``i * s`` and yields
``x = tokens[i*s : i*s + T]``, ``y = tokens[i*s + 1 : i*s + T + 1]`` (both int64 ``[T]``). By
default the training split uses stride 1 (every position is a window start, like nanoGPT's random
offsets) and the validation split stride ``T`` (non-overlapping windows, so an evaluation pass reads
each validation character about once).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset

from exogym.tasks.data.download import RemoteFile, ensure_files, mirrors_for
from exogym.tasks.data.paths import resolve_data_dir

__all__ = ["FILE", "MIRRORS", "CharVocab", "ShakespeareChar", "load_shakespeare", "read_text",
           "split_text"]

MIRRORS: tuple[str, ...] = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/",
)
"""Where ``input.txt`` is served."""

FILE = RemoteFile(
    "input.txt", sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
)
"""Tiny Shakespeare with its SHA-256."""

TRAIN_FRACTION = 0.9
_SUBDIR = "tinyshakespeare"


class CharVocab:
    """Character vocabulary: the sorted distinct characters of a text.

    Attributes:
        chars: the characters, in id order.
        stoi: character -> id.
    """

    def __init__(self, text: str) -> None:
        if not text:
            raise ValueError("cannot build a character vocabulary from an empty text")
        self.chars: tuple[str, ...] = tuple(sorted(set(text)))
        self.stoi: dict[str, int] = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        """int64 ids ``[len(text)]``; raises ``ValueError`` on a character not in the vocabulary."""
        try:
            return torch.tensor([self.stoi[c] for c in text], dtype=torch.int64)
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} is not in the vocabulary") from e

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """The text of a 1-D sequence of ids."""
        return "".join(self.chars[int(i)] for i in ids)


class ShakespeareChar(Dataset):
    """One split of a character corpus as ``(x, y)`` windows of ``block_size`` tokens.

    Attributes:
        tokens: int64 ``[L]``, the split's encoded text.
        vocab: the :class:`CharVocab` (shared by both splits).
        block_size: ``T``, tokens per window.
        stride: ``s``, tokens between consecutive window starts.
        split: ``"train"`` or ``"val"``.
        test_set: what this split is, for a run's records.

    ``len`` is ``(L - T - 1) // s + 1``; index ``i`` is the window starting at ``i * s``.
    :meth:`get_batch` returns ``(x [B, T], y [B, T])`` by tensor indexing.
    """

    def __init__(
        self, tokens: torch.Tensor, vocab: CharVocab, block_size: int, stride: int, split: str
    ) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size={block_size!r} is invalid; expected an int >= 1")
        if not isinstance(stride, int) or stride < 1:
            raise ValueError(f"stride={stride!r} is invalid; expected an int >= 1")
        if tokens.dim() != 1 or tokens.numel() < block_size + 1:
            raise ValueError(
                f"{split} split has {tokens.numel()} tokens; block_size={block_size} needs at "
                f"least {block_size + 1}"
            )
        self.tokens = tokens.to(torch.int64)
        self.vocab = vocab
        self.block_size = block_size
        self.stride = stride
        self.split = split
        self._offsets = torch.arange(block_size + 1)
        self.test_set = (f"the {split} split ({self.tokens.numel():,} characters, {len(self):,} "
                         f"windows of {block_size})")

    def __len__(self) -> int:
        return (self.tokens.numel() - self.block_size - 1) // self.stride + 1

    def get_batch(
        self, indices: Sequence[int] | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(x [B, T], y [B, T])`` int64 for window indices (negative allowed).

        Raises:
            IndexError: if an index is out of range.
        """
        idx = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        n = len(self)
        if idx.numel() and (int(idx.min()) < -n or int(idx.max()) >= n):
            raise IndexError(f"window index out of range for {n} windows")
        starts = torch.where(idx < 0, idx + n, idx) * self.stride
        chunk = self.tokens[starts[:, None] + self._offsets]
        return chunk[:, :-1], chunk[:, 1:]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(x [T], y [T])`` int64 for window ``index``."""
        x, y = self.get_batch([index])
        return x[0], y[0]

    def __repr__(self) -> str:
        return (
            f"ShakespeareChar(split={self.split!r}, tokens={self.tokens.numel()}, "
            f"block_size={self.block_size}, stride={self.stride}, windows={len(self)})"
        )


def split_text(
    text: str, block_size: int, train_stride: int = 1, val_stride: int | None = None
) -> tuple[ShakespeareChar, ShakespeareChar]:
    """``(train, val)`` from any text: vocabulary from all of it, train = first 90% of tokens."""
    vocab = CharVocab(text)
    tokens = vocab.encode(text)
    n = int(TRAIN_FRACTION * len(tokens))
    val_stride = block_size if val_stride is None else val_stride
    return (
        ShakespeareChar(tokens[:n], vocab, block_size, train_stride, "train"),
        ShakespeareChar(tokens[n:], vocab, block_size, val_stride, "val"),
    )


def load_shakespeare(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    block_size: int = 128,
    train_stride: int = 1,
    val_stride: int | None = None,
    download: bool = True,
) -> tuple[ShakespeareChar, ShakespeareChar]:
    """Return ``(train, val)`` Tiny Shakespeare windows (``val_stride`` defaults to ``block_size``).

    Raises:
        DatasetNotFoundError: ``input.txt`` missing and not downloadable.
        ChecksumError: the local ``input.txt`` is corrupted.
    """
    return split_text(read_text(data_dir, download=download), block_size, train_stride,
                      val_stride)


def read_text(data_dir: str | os.PathLike[str] | None = None, *,
              download: bool = True) -> str:
    """The text of ``input.txt``, found in ``<data_dir>/tinyshakespeare`` (downloaded when
    missing and allowed) and verified by its SHA-256."""
    folder = resolve_data_dir(data_dir) / _SUBDIR
    (path,) = ensure_files(folder, [FILE], mirrors_for(_SUBDIR, MIRRORS), dataset=_SUBDIR,
                           download=download)
    return Path(path).read_text(encoding="utf-8")
