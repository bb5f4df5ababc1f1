"""What a run leaves behind: its metrics rows, its world's events, the run folder, the sinks,
the progress bar and its timeline (``trace.json``, ``timeline.png``: :mod:`exogym.run.output.trace`)
(docs/design.md, "The parts of a run"; checkpoints are :mod:`exogym.run.output.checkpoint`).

One :class:`Recorder` per run. Rank 0 alone writes (the run folder, the sinks, the bar); every
rank keeps the rows and events, so that every rank returns the same result and a checkpoint of
any rank holds them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from exogym.run.output.progress import progress_bar
from exogym.run.output.result import MetricsWriter
from exogym.run.output.sinks import MultiSink
from exogym.run.output.trace import PICTURE_FILE, REAL_TRACE_FILE, TRACE_FILE, write_trace

__all__ = ["Recorder"]

class Recorder:
    """Rows and events of a run, and where they go.

    Args:
        out_dir: the run folder (rank 0 writes it), or None.
        config: the run's ``config.json`` content.
        sink: more places for the rows (used on rank 0 only).
        lead: whether this process writes (rank 0).
        progress: show a progress bar (rank 0 only).
        total_steps: the bar's length.
        trace: write the run's trace (``trace.json``) beside its picture.
    """

    def __init__(self, out_dir: str | Path | None, config: dict[str, Any], sink: MultiSink, *,
                 lead: bool, progress: bool, total_steps: int, trace: bool = False) -> None:
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.config, self.lead, self.trace = config, lead, trace
        self.sink = sink if lead else MultiSink(())
        self.history: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.writer: MetricsWriter | None = None
        self._progress, self._total = progress, total_steps
        self._bar: Any = None
        self._closed = True  # until open()

    def open(self, step: int, *, resumed: bool) -> None:
        """Create the run folder and start the sinks; ``resumed``: continue them from the rows
        and events so far (``metrics.jsonl`` cut back to them, nothing duplicated or lost)."""
        if self.lead and self.out_dir is not None:
            if resumed:
                self.writer = MetricsWriter.resume(self.out_dir, self.config, self.history,
                                                   self.events)
            else:
                self.writer = MetricsWriter(self.out_dir, self.config)
        run_dir = self.writer.dir if self.writer is not None else None
        self._closed = False
        try:
            if resumed:
                self.sink.resume(self.config, run_dir, self.history)
            else:
                self.sink.start(self.config, run_dir)
        except BaseException:
            if self.writer is not None:
                self.writer.close()
            raise
        self._bar = progress_bar(self._total, step, self._progress and self.lead)

    def row(self, row: dict[str, Any]) -> None:
        """A metrics row: kept, written to ``metrics.jsonl`` and given to the sinks."""
        self.history.append(row)
        if self.writer is not None:
            self.writer.write(row)
        self.sink.log(row)

    def event(self, event: dict[str, Any]) -> None:
        """A world event: kept and written to ``events.jsonl``."""
        self.events.append(event)
        if self.writer is not None:
            self.writer.write_event(event)

    @property
    def model_writer(self) -> Callable[[dict[str, torch.Tensor]], None] | None:
        """Where an evaluated model is written (``model.pt``: :meth:`save_model`), or None when
        this process writes no run folder."""
        return self.save_model if self.writer is not None else None

    def save_model(self, state: dict[str, torch.Tensor]) -> None:
        """The global model as ``model.pt`` (when the run has a folder)."""
        if self.writer is not None:
            self.writer.save_model(state)

    def timeline(self, trace: dict[str, Any] | None, real: dict[str, Any] | None) -> None:
        """The run's timeline in its folder (:mod:`exogym.run.output.trace`): ``trace.json`` if the
        run was asked for it, ``timeline.png`` (:mod:`exogym.run.output.trace_plot`) whenever its
        clock recorded one, and a real process run's ``trace_real.json``."""
        if self.writer is None:
            return
        if trace is not None:
            if self.trace:
                write_trace(trace, self.writer.dir / TRACE_FILE)
            try:
                from exogym.run.output.trace_plot import plot_trace

                plot_trace(trace, self.writer.dir / PICTURE_FILE)
            except ImportError as err:  # matplotlib is a core dependency: a broken install
                warnings.warn(f"{PICTURE_FILE} not drawn: {err}", stacklevel=2)
        if real is not None:
            write_trace(real, self.writer.dir / REAL_TRACE_FILE)

    def advanced(self, row: dict[str, Any] | None = None) -> None:
        """One step more on the bar; ``row``: its losses beside it."""
        if self._bar is None:
            return
        if row is None:
            self._bar.update(1)
        else:
            self._bar.set_postfix({k: f"{v:.4g}" for k, v in row.items()
                                   if k in ("train_loss", "eval_loss", "eval_accuracy")})

    def close(self, summary: dict[str, Any] | None) -> None:
        """Close the metrics file (writing ``summary.json`` if given), the sinks (``None``: the
        run did not finish) and the progress bar. Safe to call twice."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._closed:
            return
        self._closed = True
        if self.writer is not None:
            self.writer.close(summary)
        self.sink.finish(summary)
