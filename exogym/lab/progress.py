"""Progress over the many runs of a comparison, a sweep or the claims suite: one line per run
trained, ``[3/10] diloco seed 0 -> OUT/runs/diloco-seed0  (1.2 min spent, about 2.9 min
left)``, beside each run's own bar. The time left is the mean of the runs trained so far times
the runs left (runs read back from an earlier session count as done and take no time)."""

from __future__ import annotations

import time
from pathlib import Path

from exogym.sim.network import format_duration

__all__ = ["RunProgress"]


class RunProgress:
    """``total`` runs: :meth:`skip` one read back, :meth:`begin` / :meth:`end` one trained."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.trained = total, 0, 0
        self.start = time.monotonic()

    def skip(self) -> None:
        self.done += 1

    def begin(self, what: str, run_dir: Path) -> None:
        spent = time.monotonic() - self.start
        left = ("" if not self.trained else
                f", about {format_duration(spent / self.trained * (self.total - self.done))} "
                "left")
        print(f"[{self.done + 1}/{self.total}] {what} -> {run_dir}  ({format_duration(spent)} "
              f"spent{left})", flush=True)

    def end(self) -> None:
        self.done += 1
        self.trained += 1
