"""One progress line per run trained, with the time spent and the time left."""

from __future__ import annotations

from pathlib import Path

import pytest

from exogym.lab import progress
from exogym.lab.progress import RunProgress


def test_the_time_left_is_the_mean_run_times_the_runs_left(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """5 runs, the first read back: runs of 60 s each; after the first trained one (60 s
    spent, 3 left) 3 min are left."""
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    meter = RunProgress(5)
    meter.skip()
    meter.begin("ddp seed 0", Path("out/ddp-seed0"))
    now[0] += 60
    meter.end()
    meter.begin("diloco seed 0", Path("out/diloco-seed0"))
    assert capsys.readouterr().out.splitlines() == [
        "[2/5] ddp seed 0 -> out/ddp-seed0  (0 s spent)",
        "[3/5] diloco seed 0 -> out/diloco-seed0  (1 min spent, about 3 min left)"]
