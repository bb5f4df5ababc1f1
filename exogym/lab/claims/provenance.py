"""What produced a claims run: the code (its commit, and whether the tree had uncommitted
changes), the versions, the machine, and when; ``OUT/provenance.json`` holds one record per
session that trained into the folder (a run continued later is another session).

A verdict is only as good as the code that computed it: "rules written before the runs" can
be checked from a results folder only when the folder names its commit. A tree with
uncommitted changes to tracked files is refused unless the run is told it may
(``allow_dirty``, or ``EXOGYM_ALLOW_DIRTY=1``: the test suite sets it, whatever state the
checkout is in), and the record says it was told. Untracked files (a run folder under the
checkout) do not count.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["PROVENANCE_FILE", "DirtyTreeError", "checked_source", "close_session", "open_session",
           "source_state"]

PROVENANCE_FILE = "provenance.json"


class DirtyTreeError(ValueError):
    """The code has uncommitted changes and the run was not told it may use them."""


def source_state(root: str | Path | None = None) -> dict[str, Any]:
    """The checkout exogym runs from (``root``: its folder; default, this package's):
    ``commit`` (None outside a git checkout, e.g. an installed wheel: the version names the
    code then), ``dirty`` (tracked files changed since the commit) and ``changed`` (their
    paths, at most 20)."""
    where = Path(root) if root is not None else Path(__file__).resolve().parents[3]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=where, capture_output=True, text=True,
                                  timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "changed": []}
    status = git("status", "--porcelain", "--untracked-files=no") or ""
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    return {"commit": commit.strip(), "dirty": bool(changed), "changed": changed[:20]}


def _machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"system": platform.platform(), "cpu": cpu, "cores": os.cpu_count()}


def _versions() -> dict[str, str]:
    import torch

    from exogym import __version__

    return {"exogym": __version__, "torch": str(torch.__version__),
            "python": sys.version.split()[0], "numpy": _version_of("numpy")}


def _version_of(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def checked_source(*, allow_dirty: bool = False,
                   root: str | Path | None = None) -> dict[str, Any]:
    """:func:`source_state`, a dirty tree refused unless ``allow_dirty`` (before anything is
    written)."""
    source = source_state(root)
    allow_dirty = allow_dirty or os.environ.get("EXOGYM_ALLOW_DIRTY") == "1"
    if source["dirty"] and not allow_dirty:
        raise DirtyTreeError(
            f"the code has uncommitted changes ({', '.join(source['changed'][:5])}): a claims "
            "result must name the code that produced it; commit them, or allow it "
            "(--allow-dirty; the record says so)")
    return {**source, "allowed_dirty": allow_dirty}


def open_session(out: Path, source: dict[str, Any]) -> dict[str, Any]:
    """Append this session's record to ``out/provenance.json`` (``source``:
    :func:`checked_source`'s; started now, not yet ended) and return it."""
    session = {"started": _now(), "ended": None, **source, "versions": _versions(),
               "machine": _machine(), "argv": sys.argv}
    sessions = _read(out)
    sessions.append(session)
    _write(out, sessions)
    return session


def close_session(out: Path, session: dict[str, Any]) -> None:
    """This session ended now: its record gets the time."""
    sessions = _read(out)
    for s in reversed(sessions):
        if s["started"] == session["started"]:
            s["ended"] = _now()
            break
    _write(out, sessions)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _read(out: Path) -> list[dict[str, Any]]:
    path = out / PROVENANCE_FILE
    if not path.exists():
        return []
    try:
        sessions = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}): it is the record of what produced "
                         "this folder's runs; give another --out") from None
    if not isinstance(sessions, list):
        raise ValueError(f"{path} is not a list of sessions: give another --out")
    return sessions


def _write(out: Path, sessions: list[dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (PROVENANCE_FILE + ".tmp")
    tmp.write_text(json.dumps(sessions, indent=1) + "\n", encoding="utf-8")
    tmp.replace(out / PROVENANCE_FILE)
