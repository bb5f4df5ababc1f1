"""The loop of one run: train, log, checkpoint, stop cleanly on a signal (:func:`drive`).

:func:`drive` takes a built :class:`~exogym.run.loop.run.Run` to its end: each step, a metrics
row when one is due, a checkpoint when one is due (every ``checkpoint_every`` steps, every
``checkpoint_interval`` seconds, at the end; a paged run mid-round saves at the round's end),
and the result. The first SIGINT or SIGTERM stops the run cleanly after the current step, with
a checkpoint when it has a folder (:class:`RunInterrupted` says how to continue it); every rank
of a multi-process run acts at the same step. A worker process keeps a signal that arrives
before its loop starts (:func:`defer_stop_signals`).
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exogym.run.loop.run import Run
from exogym.run.output.checkpoint import Checkpointer
from exogym.run.output.result import FitResult
from exogym.sim.network import parse_duration
from exogym.utils.signals import STOP_SIGNALS, StopSignals

__all__ = ["Checkpointing", "RunInterrupted", "checkpointing", "defer_stop_signals", "drive"]


class RunInterrupted(KeyboardInterrupt):
    """The run was stopped (Ctrl-C, SIGTERM) and ended cleanly: metrics flushed, and a checkpoint
    written when the run has a folder. ``str(err)`` says how to continue it."""


@dataclass(frozen=True)
class Checkpointing:
    every: int | None
    interval_s: float | None
    keep: int
    asynchronous: bool

    @property
    def enabled(self) -> bool:
        return self.every is not None or self.interval_s is not None

    def to_dict(self) -> dict[str, Any]:
        return {"every": self.every, "interval_s": self.interval_s, "keep": self.keep,
                "asynchronous": self.asynchronous}


def checkpointing(v: Mapping[str, Any]) -> Checkpointing:
    """How a run of the settings ``v`` (:meth:`FitOptions.values`, or ``resumed``) writes
    checkpoints."""
    return Checkpointing(v["checkpoint_every"], _interval(v["checkpoint_interval"]),
                          v["keep_checkpoints"], v["async_checkpoint"])


def _interval(value: float | str | None) -> float | None:
    if value is None:
        return None
    seconds = parse_duration(value) if isinstance(value, str) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
            math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"checkpoint_interval must be > 0 seconds (or a string like '10min'), "
                         f"got {value!r}")
    return float(seconds)


_early_signals: list[int] = []  # signals a worker process got before its training loop started


def _note_early_signal(signum: int, frame: Any) -> None:
    _early_signals.append(signum)


def defer_stop_signals() -> None:
    """In a worker process, before anything else: a SIGINT or SIGTERM that arrives before its
    training loop starts (while it loads data or builds the model) is kept and honoured by the
    loop at its first logged step, with every other rank, instead of killing this worker while
    its peers wait for it in a collective."""
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, _note_early_signal)


class _StopRequest(StopSignals):
    """While a run trains (in the main thread): the first SIGINT or SIGTERM asks it to stop
    cleanly after the current step; a second one aborts at once (KeyboardInterrupt). A signal
    kept by :func:`defer_stop_signals` counts as the first."""

    def __init__(self, enabled: bool) -> None:
        super().__init__(enabled)
        self.requested = False

    def __enter__(self) -> _StopRequest:
        super().__enter__()
        if self.enabled and _early_signals:
            self.handle(signal.Signals(_early_signals[0]))
            _early_signals.clear()
        return self

    def handle(self, sig: signal.Signals) -> None:
        if self.requested:
            raise KeyboardInterrupt  # the second signal: abort now
        self.requested = True
        print(f"exogym: {sig.name}: stopping after this step (again to abort at once)",
              file=sys.stderr, flush=True)


def drive(run: Run, resumed_step: int | None, ck: Checkpointing,
           handle_signals: bool) -> FitResult:
    """The loop: train, log, checkpoint, stop on a signal; the result."""
    checkpointer = None
    if run.out_dir is not None:
        world = 1 if run.ranks is None else run.ranks.world_size
        checkpointer = Checkpointer(run.out_dir, keep=ck.keep, asynchronous=ck.asynchronous,
                                    rank=0 if run.ranks is None else run.ranks.rank,
                                    world_size=world)
    distributed = run.ranks is not None and run.ranks.world_size > 1
    last_save = time.monotonic()
    owed = halting = False  # a checkpoint, a stop, due at the end of a paged run's round
    try:
        # The handler is in place before the run folder's files appear: a Ctrl-C while the run
        # starts (sinks, initial evaluation) stops it cleanly too.
        with _StopRequest(handle_signals) as stop:
            run.open(resumed=resumed_step is not None)
            if resumed_step is None:
                run.evaluate_initial()
            while not run.done:
                run.train_step()
                if run.log_due:
                    run.log()
                due = ck.every is not None and run.step % ck.every == 0
                stopping = False
                if not distributed or run.log_due:  # ranks agree at logged steps only
                    late = (ck.interval_s is not None and run.lead
                            and time.monotonic() - last_save >= ck.interval_s)
                    stopping, late = run.agree(stop.requested, late)
                    due = due or late
                # a paged run mid-round has computed ahead: it saves and stops at the round's end
                owed = owed or due or stopping or (run.done and ck.enabled)
                halting = halting or stopping
                if checkpointer is not None and owed and run.between_rounds:
                    checkpointer.save(run.state_dict(), run.step, block=halting,
                                      parts=run.checkpoint_parts())
                    last_save, owed = time.monotonic(), False
                if halting and run.between_rounds:
                    raise RunInterrupted(_interrupted_message(run, checkpointer))
        result = run.finish()
        if checkpointer is not None:
            checkpointer.wait()
        return result
    except BaseException:
        run.close(None)
        if checkpointer is not None:
            with contextlib.suppress(BaseException):  # the first error is the one to report
                checkpointer.wait()
        raise


def _interrupted_message(run: Run, checkpointer: Checkpointer | None) -> str:
    where = f"interrupted after step {run.step} of {run.settings.total_steps}"
    if checkpointer is None:
        return f"{where}; the run has no folder, so nothing to resume from"
    return (f"{where}; checkpoint written to {run.out_dir}/checkpoints/step-{run.step:08d}; "
            f"continue with: exogym run --resume {run.out_dir}  (Python: "
            f"Trainer(...).fit(resume={str(run.out_dir)!r}))")
