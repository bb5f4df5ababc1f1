"""Ctrl-C (SIGINT) and SIGTERM handled for the length of a ``with`` block, in the main thread."""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["STOP_SIGNALS", "StopSignals"]

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
