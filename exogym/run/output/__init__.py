"""What a run writes: its folder, its rows, its result, its checkpoints and its timeline.

- :mod:`~exogym.run.output.result`: :class:`~exogym.run.output.result.FitResult` (what ``fit``
  returns, ``summary.json``), the metrics file written row by row, the run folder's checks;
- :mod:`~exogym.run.output.sinks`: where rows go besides ``metrics.jsonl`` (CSV, TensorBoard,
  W&B; one interface, :class:`~exogym.run.output.sinks.Sink`);
- :mod:`~exogym.run.output.record`: the run's recorder: every metrics row and world event to
  the file, the sinks and the progress bar, and the timeline files at the end;
- :mod:`~exogym.run.output.checkpoint`: checkpoints written atomically (in the background if
  asked), the last few kept, read back;
- :mod:`~exogym.run.output.trace`, :mod:`~exogym.run.output.trace_plot`: the run's timeline as
  a Chrome trace (``trace.json``) and its picture (``timeline.png``).

Imports: :mod:`exogym.sim` and :mod:`exogym.utils` only (nothing else of :mod:`exogym.run`):
the loop, the holders and the trainer write through it.
"""
