"""A run's progress: tqdm's bar on a terminal or in a notebook, whole lines far apart where
stderr is a log file or a pipe (nohup, slurm, CI: :class:`LogLines`)."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from tqdm.auto import tqdm

from exogym.sim.network import format_duration

__all__ = ["LOG_INTERVAL_S", "LogLines", "progress_bar"]

LOG_INTERVAL_S = 30.0
"""Where stderr is no terminal, the seconds between two progress lines (:class:`LogLines`)."""

def progress_bar(total: int, initial: int, shown: bool) -> Any:
    """tqdm's bar on a terminal or in a notebook; elsewhere (stderr a log file or a pipe:
    nohup, slurm, CI) :class:`LogLines`, whole lines far apart; None when not ``shown``."""
    if not shown:
        return None
    notebook = any(c.__module__ == "tqdm.notebook" for c in tqdm.__mro__)
    if not notebook and not _is_terminal(sys.stderr):
        return LogLines(total, initial)
    return tqdm(total=total, initial=initial, dynamic_ncols=True, unit="step")


def _is_terminal(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except ValueError:  # closed
        return False


class LogLines:
    """A run's progress where stderr is no terminal: a line when it starts, one at most every
    ``interval_s`` seconds and one when it ends, each a whole line (``step 200/500 (40%), 28.1
    step/s, 7.12 s spent, about 10.7 s left, train_loss 0.0593``). tqdm's bar there writes its
    line again, after a carriage return, up to ten times a second and at every logged row:
    about 200 KB in the log of a 500-step run.

    It has the face of tqdm's bar that :class:`Recorder` uses: ``update``, ``set_postfix``
    (shown with the next line) and ``close``."""

    def __init__(self, total: int, initial: int = 0, interval_s: float = LOG_INTERVAL_S,
                 file: TextIO | None = None) -> None:
        self.total, self.n, self.initial, self.interval_s = total, initial, initial, interval_s
        self.file, self.closed = file, False
        self.postfix: dict[str, Any] = {}
        self.start = self.last = time.monotonic()
        self._write(f"training: {total - initial} steps"
                    + (f" from step {initial}" if initial else "")
                    + f" (a line every {format_duration(interval_s)})")

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.interval_s and self.n < self.total:
            self.last = now
            self._write(self._status(now))

    def set_postfix(self, values: dict[str, Any]) -> None:
        self.postfix = dict(values)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._write(self._status(time.monotonic(), done=True))

    def _status(self, now: float, done: bool = False) -> str:
        spent = now - self.start
        steps = self.n - self.initial
        parts = [f"step {self.n}/{self.total} ({self.n / max(self.total, 1):.0%})"]
        if steps and spent > 0:
            parts.append(f"{steps / spent:.3g} step/s")
        parts.append(f"{format_duration(spent)} " + ("in all" if done else "spent"))
        if not done and steps and self.n < self.total:
            parts.append(f"about {format_duration(spent / steps * (self.total - self.n))} "
                         "left")
        line = ", ".join(parts)
        if self.postfix:
            line += ", " + ", ".join(f"{k} {v}" for k, v in self.postfix.items())
        return line

    def _write(self, line: str) -> None:
        print(line, file=self.file if self.file is not None else sys.stderr, flush=True)
