"""Ctrl-C (SIGINT) and SIGTERM handled for the length of a ``with`` block, in the main thread.

:class:`StopSignals` is the base: a subclass says what a signal does. :class:`InterruptOnSignal`
is the command line's outermost one: a signal that arrives while no training loop handles it
(set-up, data loading, between runs) raises :class:`Stopped`, so that SIGTERM ends the process as
Ctrl-C does (``finally`` blocks run, one message) instead of killing it silently.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["STOP_SIGNALS", "InterruptOnSignal", "StopSignals", "Stopped"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """While the block runs (only in the main thread, where Python delivers signals, and only if
    ``enabled``), SIGINT and SIGTERM call :meth:`handle`; the previous handlers are restored on
    exit."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if self.enabled:
            for sig in STOP_SIGNALS:
                self._old[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.handle(signal.Signals(signum))

    def handle(self, sig: signal.Signals) -> None:
        """What a signal does (raise to abort the block)."""
        raise NotImplementedError


class Stopped(KeyboardInterrupt):
    """A stop signal raised by :class:`InterruptOnSignal`; ``signal`` says which."""

    def __init__(self, sig: signal.Signals) -> None:
        super().__init__(sig.name)
        self.signal = sig


class InterruptOnSignal(StopSignals):
    """While the block runs, SIGINT and SIGTERM raise :class:`Stopped` (a KeyboardInterrupt) at
    once, wherever the main thread is. A training loop inside the block installs its own
    handlers (stop after the current step, with a checkpoint) and restores these when it ends."""

    def handle(self, sig: signal.Signals) -> None:
        raise Stopped(sig)
