"""Where the clients of a population keep their own state between their rounds.

``client_state="keep"`` (:mod:`exogym.run.nodes.population`): a client's own state (its rows of the
inner optimizer's state, the strategy's per-node tensors, error-feedback residuals, and its step
count: :meth:`exogym.strategy.base.StackedStrategy.client_state`) is stored once the client has
trained, and read back into its seat when it is drawn again. A client that never trained has no
record.

A record is the client's rows as raw bytes, concatenated in the strategy's order (no pickle),
with its step count last. Records live in host memory up to a budget (``memory``, bytes), the
most recently written kept there; beyond the budget the oldest go to disk, appended to segment
files in ``folder`` (``segment-SSSSSS.bin``), where an index gives each client's segment,
offset and length. Segments are append-only: a record written is never changed (a client written
again gets a new record), so a checkpoint is the index alone: :meth:`ClientStore.state_dict`
first appends the records still only in memory, and a run resumed from an older checkpoint reads
the records its index names, which are still there. The space on disk is every record written
(old ones are not reclaimed): ``clients trained x rounds each x record size`` at most.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from exogym.strategy.base import StackedStrategy

__all__ = ["ClientStore", "parse_client_store"]

_SEGMENT_BYTES = 1 << 28  # a new segment file past 256 MB
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_client_store(spec: str) -> tuple[int, Path | None]:
    """``"SIZE"`` or ``"SIZE:DIR"`` (``"512MB"``, ``"2GB:/scratch/clients"``): the host memory
    budget in bytes and the folder for the records beyond it (None: the run folder's
    ``client-store``, or a temporary folder for a run without one)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"client_store must be 'SIZE' or 'SIZE:DIR' (e.g. '512MB', "
                         f"'2GB:/scratch/clients'), got {spec!r}")
    size, _, folder = spec.strip().partition(":")
    text = size.strip().lower()
    unit = next((u for u in sorted(_UNITS, key=len, reverse=True) if text.endswith(u)), None)
    try:
        value = float(text[: -len(unit)]) * _UNITS[unit] if unit else float("nan")
    except ValueError:
        value = float("nan")
    if not value >= 0:
        raise ValueError(f"client_store {spec!r}: SIZE must be a number of bytes with a unit "
                         f"(B, KB, MB, GB, TB; e.g. '512MB', '0B' for disk only), got {size!r}")
    return int(value), (Path(folder) if folder else None)


def _typed(chunk: Tensor, dtype: torch.dtype) -> Tensor:
    """Raw bytes as ``dtype`` (copied first where they do not start at a multiple of its
    size: a record packs tensors of several dtypes)."""
    size = torch.empty((), dtype=dtype).element_size()
    return (chunk if chunk.storage_offset() % size == 0 else chunk.clone()).view(dtype)


class ClientStore:
    """Clients' own state, in host memory up to ``memory`` bytes and on disk beyond it (the
    module docstring).

    Args:
        memory: the host memory budget, bytes.
        folder: where segment files go; None: a temporary folder, removed by :meth:`close`.
    """

    def __init__(self, memory: int, folder: Path | None) -> None:
        self.memory = memory
        self._temporary = folder is None
        self.folder = Path(tempfile.mkdtemp(prefix="exogym-clients-")) if folder is None \
            else Path(folder)
        self.host: OrderedDict[int, Tensor] = OrderedDict()  # client -> record, oldest first
        self.host_bytes = 0
        self.index: dict[int, tuple[int, int, int]] = {}  # client -> (segment, offset, length)
        self.on_disk: set[int] = set()  # host records also on disk as they are (clean)
        self.stats = {"writes": 0, "reads": 0, "bytes_written": 0, "bytes_read": 0,
                      "disk_bytes": 0}
        self._segment = self._next_segment()
        self._file: Any = None

    # -- records ---------------------------------------------------------------------------
    def save(self, client: int, strategy: StackedStrategy, row: int) -> None:
        """Store ``client``'s own state from local row ``row`` of ``strategy``."""
        parts = [t[row].detach().contiguous().reshape(-1).view(torch.uint8).cpu()
                 for t in strategy.client_state()]
        steps = strategy.node_steps
        count = int(steps[row]) if steps is not None else 0
        parts.append(torch.tensor([count], dtype=torch.int64).view(torch.uint8))
        record = torch.cat(parts)
        old = self.host.pop(client, None)
        if old is not None:
            self.host_bytes -= old.numel()
        self.on_disk.discard(client)
        self.host[client] = record
        self.host_bytes += record.numel()
        self.stats["writes"] += 1
        self.stats["bytes_written"] += record.numel()
        while self.host_bytes > self.memory and self.host:
            oldest, rec = self.host.popitem(last=False)
            self.host_bytes -= rec.numel()
            if oldest not in self.on_disk:
                self._append(oldest, rec)
            self.on_disk.discard(oldest)

    def load(self, client: int, strategy: StackedStrategy, row: int) -> bool:
        """Put ``client``'s stored state into local row ``row`` of ``strategy``; False if the
        client has none (it never trained)."""
        record = self.host.get(client)
        if record is None:
            if client not in self.index:
                return False
            record = self._read(client)
        self.stats["reads"] += 1
        self.stats["bytes_read"] += record.numel()
        tensors = strategy.client_state()
        need = sum(t[row].numel() * t.element_size() for t in tensors) + 8
        if need != record.numel():
            raise RuntimeError(f"client {client}'s stored state is {record.numel()} bytes, its "
                               f"seat's state {need}: the strategy's per-node state changed "
                               "shape between rounds")
        at = 0
        with torch.no_grad():
            for t in tensors:
                n = t[row].numel() * t.element_size()
                t[row].copy_(_typed(record[at: at + n], t.dtype).view(t[row].shape))
                at += n
        if strategy.node_steps is None:
            strategy.restart_row(row)  # creates the per-node counts
        assert strategy.node_steps is not None
        strategy.node_steps[row] = int(_typed(record[at:], torch.int64)[0])
        return True

    def __contains__(self, client: int) -> bool:
        return client in self.host or client in self.index

    def __len__(self) -> int:
        return len(set(self.host) | set(self.index))

    # -- disk ------------------------------------------------------------------------------
    def _new_segment(self) -> Any:
        """A segment file of this store's own, created exclusively: a number no other writer
        holds (two runs given one folder never share a file, so neither reads the other's
        records)."""
        while True:
            self._segment = max(self._segment, self._next_segment())
            try:
                return open(self._path(self._segment), "xb")
            except FileExistsError:
                self._segment += 1

    def _next_segment(self) -> int:
        if not self.folder.is_dir():
            return 0
        existing = [int(p.stem.removeprefix("segment-")) for p in self.folder.glob("segment-*.bin")
                    if p.stem.removeprefix("segment-").isdigit()]
        return max(existing, default=-1) + 1

    def _path(self, segment: int) -> Path:
        return self.folder / f"segment-{segment:06d}.bin"

    def _append(self, client: int, record: Tensor) -> None:
        if self._file is None or self._file.tell() + record.numel() > _SEGMENT_BYTES:
            if self._file is not None:
                self._file.close()
            self.folder.mkdir(parents=True, exist_ok=True)  # when first needed: a run
            # folder must be empty when the run starts
            self._file = self._new_segment()
        offset = self._file.tell()
        self._file.write(record.numpy().tobytes())
        self.index[client] = (self._segment, offset, record.numel())
        self.stats["disk_bytes"] += record.numel()

    def _read(self, client: int) -> Tensor:
        segment, offset, length = self.index[client]
        if self._file is not None and segment == self._segment:
            self._file.flush()
        out = torch.empty(length, dtype=torch.uint8)
        with open(self._path(segment), "rb") as f:
            f.seek(offset)
            if f.readinto(out.numpy()) != length:
                raise RuntimeError(f"client {client}'s record in {self._path(segment)} is cut "
                                   "short (the store's folder was changed)")
        return out

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The index, after the records only in memory are appended to disk (they stay in
        memory too): a checkpoint copies no record."""
        for client, record in self.host.items():
            if client not in self.on_disk:
                self._append(client, record)
                self.on_disk.add(client)
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
        rows = [[c, s, o, n] for c, (s, o, n) in sorted(self.index.items())]
        return {"folder": str(self.folder), "index": torch.tensor(rows, dtype=torch.int64
                                                                  ).reshape(-1, 4),
                "stats": dict(self.stats)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.host.clear()
        self.host_bytes = 0
        self.on_disk.clear()
        self.index = {int(c): (int(s), int(o), int(n)) for c, s, o, n in
                      state["index"].tolist()}
        self.stats = {k: int(v) for k, v in state["stats"].items()}
        ends: dict[int, tuple[int, int]] = {}  # segment -> (its last record's end, client)
        for client, (segment, offset, length) in self.index.items():
            ends[segment] = max(ends.get(segment, (0, client)), (offset + length, client))
        for segment, (end, client) in ends.items():
            path = self._path(segment)
            if not path.exists() or path.stat().st_size < end:
                raise ValueError(f"client {client}'s stored state is not in {path} any more "
                                 f"(the checkpoint's store was {state['folder']!r}; a run folder "
                                 "moved with its client-store is fine, a changed store is not)")

    def report(self) -> dict[str, Any]:
        return {"clients": len(self), "host_bytes": self.host_bytes, **self.stats,
                "folder": None if self._temporary else str(self.folder)}

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._temporary:
            shutil.rmtree(self.folder, ignore_errors=True)
