"""Checkpoints of a run: written atomically, optionally in the background, the last few kept.

Layout, in the run folder::

    checkpoints/step-00001200/rank-0.pt     # Run.state_dict() of process 0 (all N nodes when
    checkpoints/step-00001200/rank-1.pt     #   simulated; its own nodes in a multi-process run)
    checkpoints/step-00001200/manifest.json # step, processes, sha256 of every rank file

A checkpoint is written into a hidden ``.step-00001200.tmp`` folder and renamed when complete
(after every rank's file, and the manifest, are on disk and fsync'ed), so a crash, a SIGKILL or a
full disk at any moment leaves either the whole new checkpoint or none of it; the previous one is
untouched. After a successful write the oldest beyond ``keep`` are deleted.

Asynchronous writing (one process, the default): :meth:`Checkpointer.save` copies the state to
host memory while the caller waits (cheap next to a step), then serialises and writes it in a
background thread while training goes on, as prime's INTELLECT-1 did ("save to RAM first, then to
disk in the background"). A second checkpoint waits for the first to finish; an error in the
background is raised at the next :meth:`Checkpointer.save` or :meth:`Checkpointer.wait`. In a
multi-process run every rank writes its own file synchronously and rank 0 commits the folder
after a barrier.

Reading (:func:`load_checkpoint`): the newest complete checkpoint whose files match the manifest
is loaded; a corrupted or truncated one is reported (a warning naming the file and what is wrong)
and the one before it is used; if none can be read, :class:`CheckpointError` names every file
tried.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch
import torch.distributed as dist

from exogym.sim.compute import thread_done

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "checkpoint_steps",
    "load_checkpoint",
    "read_part",
    "to_host",
]

FOLDER = "checkpoints"

Parts = Callable[[Path, Callable[[Path, Any], str]], dict[str, str]]
"""More files of a checkpoint: ``parts(folder, write)`` writes each with ``write(path, state)``
(which returns its sha256) and returns ``{file name: sha256}``."""
_NAME = re.compile(r"^step-(\d{8,})$")


class CheckpointError(RuntimeError):
    """No usable checkpoint (missing, corrupted, truncated, or of another run)."""


class _LayoutError(CheckpointError):
    """The checkpoints are of another process layout: no older one would fit either."""


def to_host(obj: Any) -> Any:
    """A deep copy with every tensor copied to host memory (the snapshot a background write
    serialises while training changes the originals)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_host(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_host(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_host(v) for v in obj)
    return obj


class _HashingFile:
    """A binary file that hashes what is written to it (sha256), so no second read is needed."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.sha = f, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def _write_file(path: Path, state: Any) -> str:
    """``torch.save`` to ``path``, flushed to disk; the file's sha256."""
    with path.open("wb") as raw:
        f = _HashingFile(raw)
        torch.save(state, f)  # type: ignore[arg-type]  # a file-like object with write()
        raw.flush()
        os.fsync(raw.fileno())
    return f.sha.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_steps(run_dir: str | Path) -> list[int]:
    """The steps of the complete checkpoints of a run folder, newest first."""
    folder = Path(run_dir) / FOLDER
    if not folder.is_dir():
        return []
    steps = [int(m.group(1)) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return sorted(steps, reverse=True)


def _step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / FOLDER / f"step-{step:08d}"


class Checkpointer:
    """Writes a run's checkpoints (see the module docstring).

    Args:
        run_dir: the run folder; checkpoints go to ``run_dir/checkpoints``.
        keep: complete checkpoints kept (>= 1); older ones are deleted after a write.
        asynchronous: write in a background thread (one process only).
        rank: this process (multi-process runs write one file per rank, synchronously).
        world_size: the number of processes.
    """

    def __init__(self, run_dir: str | Path, *, keep: int = 2, asynchronous: bool = True,
                 rank: int = 0, world_size: int = 1) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an integer >= 1, got {keep!r}")
        self.run_dir = Path(run_dir)
        self.keep, self.rank, self.world_size = keep, rank, world_size
        self.asynchronous = asynchronous and world_size == 1
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last_step: int | None = None
        self.written: list[int] = []  # steps written by this checkpointer, in order

    def save(self, state: dict[str, Any], step: int, *, block: bool = False,
             parts: Parts | None = None) -> Path:
        """Write ``state`` (a :meth:`Run.state_dict`) as the checkpoint of ``step``; its folder.

        The host copy is taken before returning; with ``asynchronous`` (and not ``block``) the
        write goes on in the background. A multi-process run calls this on every rank.
        ``parts``: more files of the checkpoint (a paged run's groups, one file each), written
        by ``parts(folder, write_part)`` into the checkpoint's folder before it is committed,
        in the calling thread (the write is then synchronous) and listed in the manifest.
        """
        self.wait()  # one write at a time; raises the previous one's error
        snapshot = to_host(state)
        target = _step_dir(self.run_dir, step)
        self.last_step = step
        if self.asynchronous and not block and parts is None:
            self._thread = threading.Thread(target=self._write_guarded, args=(snapshot, step),
                                            name=f"exogym-checkpoint-{step}", daemon=True)
            self._thread.start()
        else:
            self._write_guarded(snapshot, step, parts)
            self.wait()
        return target

    def wait(self) -> None:
        """Block until the background write (if any) is done; raise its error, if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(str(error)) from error

    def _write_guarded(self, snapshot: Any, step: int, parts: Parts | None = None) -> None:
        try:
            self._write(snapshot, step, parts)
        except BaseException as err:  # reported by wait() (at once when writing synchronously)
            self._error = RuntimeError(
                f"writing the checkpoint of step {step} under {self.run_dir / FOLDER} failed "
                f"({type(err).__name__}: {err}); the previous checkpoints are intact")
            self._error.__cause__ = err
        finally:
            if threading.current_thread().name.startswith("exogym-checkpoint-"):
                thread_done()  # the step it ends during does not price its work

    def _write(self, snapshot: Any, step: int, parts: Parts | None = None) -> None:
        folder = self.run_dir / FOLDER
        tmp = folder / f".step-{step:08d}.tmp"
        final = _step_dir(self.run_dir, step)
        if self.rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
            for stale in folder.glob(".step-*.tmp"):  # an earlier write that never finished
                shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir()
        self._barrier()
        digest = _write_file(tmp / f"rank-{self.rank}.pt", snapshot)
        digests = self._gather(digest)
        extra = {} if parts is None else parts(tmp, _write_file)
        if self.rank == 0:
            manifest = {"step": step, "processes": self.world_size,
                        "sha256": {f"rank-{r}.pt": d for r, d in enumerate(digests)} | extra}
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n",
                                               encoding="utf-8")
            _fsync_dir(tmp)
            if final.exists():  # the same step again (a resumed run writing its start again)
                shutil.rmtree(final)
            tmp.rename(final)
            _fsync_dir(folder)
            self._prune(step)
        self._barrier()
        self.written.append(step)

    def _prune(self, newest: int) -> None:
        for step in checkpoint_steps(self.run_dir)[self.keep:]:
            if step != newest:
                shutil.rmtree(_step_dir(self.run_dir, step), ignore_errors=True)

    def _barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def _gather(self, digest: str) -> list[str]:
        if self.world_size == 1:
            return [digest]
        box: list[Any] = [None] * self.world_size
        dist.all_gather_object(box, digest)
        return [str(d) for d in box]


def read_part(step_dir: Path, name: str, map_location: torch.device | str = "cpu") -> Any:
    """A part of a checkpoint (see :meth:`Checkpointer.save`), checked against the manifest.

    Raises:
        CheckpointError: the part is missing, not in the manifest, or corrupted.
    """
    path = _verified(step_dir, name, _manifest(step_dir))
    return torch.load(path, map_location=map_location, weights_only=True)


def _manifest(step_dir: Path) -> dict[str, Any]:
    path = step_dir / "manifest.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path} cannot be read ({err})") from None


def _verified(step_dir: Path, name: str, manifest: dict[str, Any]) -> Path:
    """``step_dir / name`` after checking its sha256 (read in chunks) against the manifest's."""
    path = step_dir / name
    want = manifest.get("sha256", {}).get(name)
    if want is None or not path.is_file():
        raise CheckpointError(f"{path} is missing from the checkpoint")
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    if h.hexdigest() != want:
        raise CheckpointError(f"{path} is corrupted or truncated (sha256 {h.hexdigest()[:12]}..."
                              f", the manifest says {str(want)[:12]}...)")
    return path


def _check_files(step_dir: Path, rank: int, world_size: int) -> Path:
    """The rank's file of a checkpoint folder after checking it against the manifest."""
    manifest = _manifest(step_dir)
    if manifest.get("processes") != world_size:
        raise _LayoutError(
            f"{step_dir} was written by {manifest.get('processes')} process(es); this run has "
            f"{world_size}: resume with the same number of processes (and nodes)")
    return _verified(step_dir, f"rank-{rank}.pt", manifest)


def load_checkpoint(
    run_dir: str | Path, *, rank: int = 0, world_size: int = 1,
    map_location: torch.device | str = "cpu",
) -> tuple[dict[str, Any], Path]:
    """The newest usable checkpoint of a run folder for this rank: ``(state, folder)``.

    A checkpoint that cannot be used (corrupted, truncated, unreadable) is reported with a
    warning naming its file and the reason, and the previous one is tried.

    Raises:
        CheckpointError: the folder has no checkpoint, or none of them can be used (the message
            lists each one and why).
    """
    run_dir = Path(run_dir)
    steps = checkpoint_steps(run_dir)
    if not steps:
        raise CheckpointError(
            f"{run_dir / FOLDER} holds no checkpoint: the run was started without checkpoints "
            "(--checkpoint-every K, or fit(checkpoint_every=K)) or stopped before the first one")
    problems = []
    for step in steps:
        step_dir = _step_dir(run_dir, step)
        try:
            path = _check_files(step_dir, rank, world_size)
            try:
                state = torch.load(path, map_location=map_location, weights_only=True)
            except Exception as err:
                first = str(err).splitlines()[0] if str(err) else ""
                raise CheckpointError(f"{path} cannot be loaded ({type(err).__name__}: "
                                      f"{first})") from None
        except _LayoutError:
            raise
        except CheckpointError as err:
            problems.append(str(err))
            warnings.warn(f"checkpoint of step {step} skipped: {err}", RuntimeWarning,
                          stacklevel=2)
            continue
        return state, step_dir
    raise CheckpointError("no usable checkpoint in " + str(run_dir / FOLDER) + ":\n  "
                          + "\n  ".join(problems))
