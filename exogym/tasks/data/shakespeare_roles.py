"""Tiny Shakespeare split by speaking role: one federated client per role, as LEAF's Shakespeare.

LEAF (Caldas et al. 2018, "LEAF: A Benchmark for Federated Settings", arXiv:1812.01097) makes
each (play, character) of the complete works a client. Checked against TalwalkarLab/leaf at commit
09ec454a5675e32e1f0546b456b77857fdece018: ``data/shakespeare/preprocess/preprocess_shakespeare.py``
(the parser: a speaker's lines keyed by play and upper-cased character name, unparsed lines
discarded), ``data/shakespeare/preprocess/shake_utils.py`` (next-character samples over each
client's text), ``data/utils/split_data.py`` (the default ``--by_sample`` split: the first
``int(0.9 * n)`` of a user's ``n`` samples train, for Shakespeare in text order, the test samples
starting 79 samples later so that no test input overlaps a training one; users with fewer than 2
samples dropped) and ``data/utils/remove_users.py`` (``-k``: users with fewer samples dropped).
This module is our own reading of those rules for Tiny Shakespeare (no LEAF code).

**Speeches.** The file is read as lines (split at ``"\\n"``). A *blank* line is empty or
whitespace only; runs of blank lines separate speeches. The first non-blank line of the file and
every non-blank line that follows a blank line is a *speaker line*: the whole line is a name and
a colon, the name matching ``[A-Z]([A-Za-z ,&-]*[A-Za-z])?`` (an upper-case letter first, a letter
last; letters, spaces, ``,``, ``&`` and ``-`` between: ``First Citizen``, ``LADY  CAPULET``,
``Senators, &C``, ``ALL SERVING-MEN``). The speech is the lines after it up to the next blank line,
kept as written. A line of the form ``Name:`` that does not follow a blank line is speech text
(Tiny Shakespeare has 1,009 such verse lines, e.g. ``Come:``, ``Hear me speak:``); a non-blank
line that follows a blank line and is not a speaker line is an error (``ValueError`` naming its
line number), never skipped.
Tiny Shakespeare has 7,222 speeches, all of them parsed; 125 have a speaker line and no text (a cut
stage direction, e.g. ``TITUS:`` then a blank line) and add nothing to their role.

**Roles.** A role is the speaker name with runs of spaces made one and upper-cased, as LEAF
upper-cases names ("Some character names are written with multiple casings"): ``Nurse`` and
``NURSE`` are one role, so are ``LADY  CAPULET`` and ``LADY CAPULET`` (309 names as written, 7
merges, 302 roles).
LEAF keys a client by play *and* character; Tiny Shakespeare is excerpts of plays run together
with no titles or act headings, so no line says where a play starts, and the same name in two
plays (``First Citizen`` of Coriolanus and of Romeo and Juliet, ``Servant``) is one client here:
the name is the only key the file has. A role's *text* is its speeches in file order, each speech
its lines each ending in ``"\\n"``, consecutive speeches separated by one blank line (``"\\n"``):
the file's layout without the speaker lines, which are not part of any role's text (as in LEAF,
whose clients hold only the lines spoken).

**Train / validation, per role** (LEAF's sample-based split, ``--tf 0.9``): a role's text of
``L`` characters is cut at ``floor(9 L / 10)``; the characters before the cut are its training
text, the rest its validation text, so a validation window never reads a training character (LEAF
skips 79 samples for the same reason). The vocabulary is :class:`CharVocab` of the whole file (65
characters, the same ids as :mod:`exogym.tasks.data.shakespeare`).

**Samples** are next-character windows within one role's text, never across two roles: a role's
split of ``L`` tokens with block size ``T`` and stride ``s`` has ``(L - T - 1) // s + 1`` windows
when ``L >= T + 1``, else none; window ``k`` yields ``x = t[k*s : k*s + T]``, ``y = t[k*s + 1 :
k*s + T + 1]``. Training uses stride 1, validation stride ``T`` (as the whole-file task).

**Dropped roles.** A role with fewer than ``min_windows`` training windows is no client: it is
left out of both splits and its name is kept in ``dropped_roles`` (LEAF drops small users the same
way). With ``T = 64`` and ``min_windows = 32`` (the task's batch size), 243 roles are clients and
59 are dropped (10 of them have no text at all).

**Clients** are numbered ``0..R-1`` by the first appearance of the role in the file;
``clients[i]`` is the client of sample ``i`` (``exogym.sim.partition``'s ``"natural"`` partition
gives node ``c`` the samples of client ``c``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from exogym.tasks.data.shakespeare import CharVocab, read_text

__all__ = [
    "NAME_PATTERN",
    "ShakespeareRoles",
    "Speech",
    "load_shakespeare_roles",
    "parse_speeches",
    "role_texts",
    "split_roles",
]

NAME_PATTERN = r"[A-Z](?:[A-Za-z ,&-]*[A-Za-z])?"
"""A speaker's name as written (the line is the name and a colon)."""

_SPEAKER = re.compile(f"({NAME_PATTERN}):")


@dataclass(frozen=True)
class Speech:
    """One speech.

    Attributes:
        role: the speaker's name, spaces collapsed and upper-cased (``"LADY CAPULET"``).
        speaker: the name as written (``"LADY  CAPULET"``).
        lines: the speech's lines as written, without line ends (empty: a speaker line alone).
        line: the speaker line's number in the file, counted from 1.
    """

    role: str
    speaker: str
    lines: tuple[str, ...]
    line: int


def parse_speeches(text: str) -> list[Speech]:
    """The speeches of ``text`` in file order (the rule is in the module docstring).

    Raises:
        ValueError: a non-blank line that opens the file or follows a blank line is not a speaker
            line ``Name:`` (the message gives its line number and text).
    """
    speeches: list[Speech] = []
    current: tuple[str, int, list[str]] | None = None  # (speaker, line number, lines so far)
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            if current is not None:
                speeches.append(_speech(*current))
                current = None
            continue
        if current is not None:
            current[2].append(line)
            continue
        match = _SPEAKER.fullmatch(line)
        if match is None:
            raise ValueError(
                f"line {number}: {line!r} starts a speech (it opens the text or follows a blank "
                f"line) but is not a speaker line: the whole line must be a name matching "
                f"{NAME_PATTERN} followed by ':', e.g. 'First Citizen:'"
            )
        current = (match.group(1), number, [])
    if current is not None:
        speeches.append(_speech(*current))
    return speeches


def _speech(speaker: str, line: int, lines: list[str]) -> Speech:
    return Speech(role=" ".join(speaker.split()).upper(), speaker=speaker, lines=tuple(lines),
                  line=line)


def role_texts(speeches: Sequence[Speech]) -> dict[str, str]:
    """Each role's text, roles in order of first appearance (a role whose speeches are all empty
    maps to ``""``): its non-empty speeches in order, each line ending in ``"\\n"``, one blank line
    between two speeches."""
    parts: dict[str, list[str]] = {}
    for speech in speeches:
        pieces = parts.setdefault(speech.role, [])
        if speech.lines:
            pieces.append("".join(f"{line}\n" for line in speech.lines))
    return {role: "\n".join(pieces) for role, pieces in parts.items()}


def _window_count(length: int, block_size: int, stride: int) -> int:
    """Windows of ``block_size + 1`` tokens, ``stride`` apart, in ``length`` tokens."""
    return (length - block_size - 1) // stride + 1 if length > block_size else 0


class ShakespeareRoles(Dataset):
    """One split of the roles' texts as ``(x, y)`` windows, each inside one role.

    Attributes:
        tokens: int64, the split's text of every client, client 0's first.
        starts: int64 ``[len(self)]``, the token where each window starts.
        clients: int64 ``[len(self)]``, the client id (``0..R-1``) of each window, non-decreasing.
        client_names: the ``R`` roles that are clients, in id order.
        dropped_roles: the roles with too few training windows, in order of first appearance.
        vocab: the whole file's :class:`CharVocab`.
        block_size: ``T``; stride: ``s``; split: ``"train"`` or ``"val"``.
        test_set: what this split is, for a run's records.

    :meth:`get_batch` returns ``(x [B, T], y [B, T])`` by tensor indexing; a client may have no
    window in a split (a validation text shorter than ``T + 1``).
    """

    def __init__(
        self,
        role_tokens: Sequence[torch.Tensor],
        client_names: Sequence[str],
        vocab: CharVocab,
        block_size: int,
        stride: int,
        split: str,
        dropped_roles: Sequence[str] = (),
    ) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size={block_size!r} is invalid; expected an int >= 1")
        if not isinstance(stride, int) or stride < 1:
            raise ValueError(f"stride={stride!r} is invalid; expected an int >= 1")
        if len(role_tokens) != len(client_names):
            raise ValueError(f"{len(role_tokens)} token tensors for {len(client_names)} clients")
        lengths = [int(t.numel()) for t in role_tokens]
        counts = [_window_count(n, block_size, stride) for n in lengths]
        if sum(counts) == 0:
            raise ValueError(f"{split} split has no window of {block_size + 1} tokens in any role")
        firsts = torch.tensor([0, *lengths[:-1]], dtype=torch.int64).cumsum(0)  # role offsets
        self.tokens = torch.cat([t.to(torch.int64) for t in role_tokens])
        self.starts = torch.cat([first + torch.arange(count) * stride
                                 for first, count in zip(firsts.tolist(), counts, strict=True)])
        self.clients = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
        self.client_names = list(client_names)
        self.dropped_roles = tuple(dropped_roles)
        self.vocab, self.block_size, self.stride, self.split = vocab, block_size, stride, split
        self._offsets = torch.arange(block_size + 1)
        self.test_set = (f"the {split} split of {len(counts)} roles ({self.tokens.numel():,} "
                         f"characters, {len(self):,} windows of {block_size})")

    def __len__(self) -> int:
        return self.starts.numel()

    def get_batch(
        self, indices: Sequence[int] | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x [B, T], y [B, T])`` int64 for window indices (negative allowed).

        Raises:
            IndexError: an index outside ``[-len, len)``.
        """
        idx = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        n = len(self)
        if idx.numel() and (int(idx.min()) < -n or int(idx.max()) >= n):
            raise IndexError(f"window index out of range for {n} windows")
        chunk = self.tokens[self.starts[idx][:, None] + self._offsets]  # (B, T + 1)
        return chunk[:, :-1], chunk[:, 1:]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x [T], y [T])`` int64 for window ``index``."""
        x, y = self.get_batch([index])
        return x[0], y[0]

    def __repr__(self) -> str:
        return (f"ShakespeareRoles(split={self.split!r}, clients={len(self.client_names)}, "
                f"windows={len(self)}, block_size={self.block_size}, stride={self.stride})")


def split_roles(
    text: str,
    block_size: int,
    *,
    min_windows: int,
    train_stride: int = 1,
    val_stride: int | None = None,
) -> tuple[ShakespeareRoles, ShakespeareRoles]:
    """``(train, val)`` of ``text`` by role: each role's first 90% of characters train, the rest
    validation; roles with fewer than ``min_windows`` training windows dropped (both splits).

    Raises:
        ValueError: ``min_windows < 1``; the text does not parse (:func:`parse_speeches`); no role
            has ``min_windows`` training windows; no kept role's validation text holds a window.
    """
    if isinstance(min_windows, bool) or not isinstance(min_windows, int) or min_windows < 1:
        raise ValueError(f"min_windows={min_windows!r} is invalid; expected an int >= 1")
    vocab = CharVocab(text)
    train_parts: list[torch.Tensor] = []
    val_parts: list[torch.Tensor] = []
    names: list[str] = []
    dropped: list[str] = []
    for role, role_text in role_texts(parse_speeches(text)).items():
        cut = 9 * len(role_text) // 10
        if _window_count(cut, block_size, train_stride) < min_windows:
            dropped.append(role)
            continue
        tokens = vocab.encode(role_text)
        names.append(role)
        train_parts.append(tokens[:cut])
        val_parts.append(tokens[cut:])
    if not names:
        raise ValueError(
            f"no role has {min_windows} training windows of block_size {block_size} (all "
            f"{len(dropped)} dropped); use a smaller min_windows or block_size"
        )
    val_stride = block_size if val_stride is None else val_stride
    return (
        ShakespeareRoles(train_parts, names, vocab, block_size, train_stride, "train", dropped),
        ShakespeareRoles(val_parts, names, vocab, block_size, val_stride, "val", dropped),
    )


def load_shakespeare_roles(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    block_size: int = 64,
    min_windows: int = 32,
    download: bool = True,
) -> tuple[ShakespeareRoles, ShakespeareRoles]:
    """``(train, val)`` of Tiny Shakespeare by role (:func:`split_roles` of ``input.txt``, found
    and verified as by :func:`exogym.tasks.data.shakespeare.load_shakespeare`).

    Raises:
        DatasetNotFoundError: ``input.txt`` missing and not downloadable.
        ChecksumError: the local ``input.txt`` is corrupted.
    """
    return split_roles(read_text(data_dir, download=download), block_size,
                       min_windows=min_windows)
