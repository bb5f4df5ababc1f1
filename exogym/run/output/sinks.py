"""Where a run's metrics go besides ``metrics.jsonl``: CSV, TensorBoard, Weights & Biases.

A sink receives the rows the trainer writes to ``metrics.jsonl`` (:class:`exogym.run.output.result.
MetricsWriter` stays the default and is always on when there is an output folder):

>>> sinks = [CSVSink(), TensorBoardSink(), WandbSink("exogym", mode="offline")]
>>> trainer.fit(strategy="diloco", num_nodes=4, max_steps=500, out_dir="runs/a", sinks=sinks)

or from strings, as the command line takes them: ``make_sink("csv")``, ``make_sink(
"tensorboard")``, ``make_sink("wandb:PROJECT")``, ``make_sink("wandb:ENTITY/PROJECT:offline")``.

The contract (:class:`Sink`): ``start(config, run_dir)`` once, with the ``config.json`` content
and the run folder (None when the run has none); ``log(row)`` for every logged row, in step
order (``row["step"]`` plus metrics; evaluation rows add ``eval_*`` keys; a value may be None or
a string); ``finish(summary)`` once, with the ``summary.json`` content, or None when the run
failed: the sink flushes and closes and keeps what it had written. TensorBoard and W&B take the
numeric values of a row (:func:`numeric_metrics`) and skip the rest.

A run continued from a checkpoint calls ``resume(config, run_dir, rows)`` instead of ``start``,
where ``rows`` are the rows logged up to the checkpoint: the sink drops whatever it had written
after them (a crash may have happened later) and goes on, so that nothing is duplicated or lost.
``resume`` is optional: a sink without it is started afresh and receives the rows after the
checkpoint only.

TensorBoard and W&B are optional dependencies, imported when such a sink is created:
``pip install "exogym[tensorboard]"``, ``pip install "exogym[wandb]"``.
"""

from __future__ import annotations

import csv
import importlib
import json
import numbers
import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import IO, Any, Literal, Protocol, runtime_checkable

__all__ = [
    "SINK_FORMS",
    "CSVSink",
    "MultiSink",
    "Sink",
    "TensorBoardSink",
    "WandbMode",
    "WandbSink",
    "make_sink",
    "numeric_metrics",
]

WandbMode = Literal["online", "offline", "disabled"]
WANDB_MODES: tuple[str, ...] = ("online", "offline", "disabled")
SINK_FORMS = ("csv", "tensorboard", "wandb:PROJECT", "wandb:ENTITY/PROJECT",
              "wandb:PROJECT:MODE (MODE: online, offline, disabled)")


@runtime_checkable
class Sink(Protocol):
    """Receives a run's metrics: ``start`` once, ``log`` per row, ``finish`` once."""

    def start(self, config: dict[str, Any], run_dir: Path | None) -> None:
        """The run begins: ``config`` is the ``config.json`` content, ``run_dir`` the run folder
        (it exists), or None when the run writes no folder."""
        ...

    def log(self, row: dict[str, Any]) -> None:
        """One logged row: ``row["step"]`` (steps done) and metrics, as in ``metrics.jsonl``.
        The row is the trainer's own (also in ``FitResult.history``): read it, never modify it."""
        ...

    def finish(self, summary: dict[str, Any] | None) -> None:
        """The run ended: ``summary`` is the ``summary.json`` content, or None when it failed
        (flush and close; what was written stays)."""
        ...


def numeric_metrics(row: dict[str, Any]) -> dict[str, int | float]:
    """The numeric values of a row without ``step`` (ints and floats, NaN and inf included;
    None, strings, booleans and containers are left out)."""
    return {k: v for k, v in row.items()
            if k != "step" and isinstance(v, numbers.Real) and not isinstance(v, bool)}


def _step(row: dict[str, Any]) -> int:
    step = row.get("step")
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise ValueError(f"a metrics row needs an integer 'step', got {step!r} in {row!r}")
    return int(step)


def _require(module: str, extra: str, what: str) -> ModuleType:
    """Import an optional dependency, or raise ImportError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{what} needs the {module.split('.')[0]!r} package: pip install \"exogym[{extra}]\""
        ) from e


def _not_started(sink: object) -> RuntimeError:
    return RuntimeError(f"{type(sink).__name__}: start() was not called (or finish() was)")


# -- CSV -----------------------------------------------------------------------------------------
class CSVSink:
    """``metrics.csv``: one row per logged step, flushed row by row.

    The columns are the keys in the order they first appear (``step``, ``epoch``,
    ``train_loss``, ...). Rows need not have the same keys: a key missing from a row is an empty
    cell, and when a row brings a new key (the first evaluation row adds ``eval_loss``, ...) the
    whole file is rewritten with the wider header into a temporary file that then replaces
    ``metrics.csv`` (an atomic rename), so the file on disk is always complete and rectangular:
    a crash keeps every row logged before it. Cells: None is empty, numbers are written exactly
    (``repr``, NaN as ``nan``), lists and mappings as JSON.

    Args:
        path: the CSV file; default ``metrics.csv`` in the run folder. An existing file is never
            overwritten: that is an error, as for ``metrics.jsonl``.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        if path is not None and not isinstance(path, (str, Path)):
            raise ValueError(f"path must be a file path or None, got {path!r}")
        self.path: Path | None = Path(path) if path is not None else None
        self._file: IO[str] | None = None
        self._target: Path | None = None
        self._columns: list[str] = []
        self._rows: list[dict[str, str]] = []

    def start(self, config: dict[str, Any], run_dir: Path | None) -> None:
        if self.path is not None:
            target = self.path
        elif run_dir is not None:
            target = Path(run_dir) / "metrics.csv"
        else:
            raise ValueError("CSVSink has nowhere to write: the run has no folder (give fit an "
                             "out_dir) and CSVSink(path=...) is None")
        if target.exists():
            raise FileExistsError(
                f"{target} already exists; choose another output folder (--out) or move it away")
        target.parent.mkdir(parents=True, exist_ok=True)
        self._target, self._columns, self._rows = target, [], []
        self._file = target.open("w", encoding="utf-8", newline="")

    def resume(self, config: dict[str, Any], run_dir: Path | None,
               rows: Sequence[dict[str, Any]]) -> None:
        """Continue a run: ``metrics.csv`` becomes exactly ``rows`` (rewritten atomically: rows
        written after the checkpoint are dropped), then new rows are appended."""
        target = self.path if self.path is not None else (
            Path(run_dir) / "metrics.csv" if run_dir is not None else None)
        if target is None:
            raise ValueError("CSVSink has nowhere to write: the run has no folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        self._target, self._columns, self._rows = target, [], []
        for row in rows:
            cells = {str(k): _cell(v) for k, v in row.items()}
            self._columns += [k for k in cells if k not in self._columns]
            self._rows.append(cells)
        tmp = target.with_name(f".{target.name}.tmp")
        with tmp.open("w", encoding="utf-8", newline="") as f:
            if self._columns:
                writer = csv.writer(f)
                writer.writerow(self._columns)
                writer.writerows([r.get(k, "") for k in self._columns] for r in self._rows)
        os.replace(tmp, target)
        self._file = target.open("a", encoding="utf-8", newline="")

    def log(self, row: dict[str, Any]) -> None:
        if self._file is None or self._target is None:
            raise _not_started(self)
        cells = {str(k): _cell(v) for k, v in row.items()}
        new = [k for k in cells if k not in self._columns]
        self._rows.append(cells)
        if new and len(self._rows) > 1:
            self._columns += new
            self._rewrite()
            return
        if new:  # the first row: the header
            self._columns = new
            csv.writer(self._file).writerow(self._columns)
        csv.writer(self._file).writerow([cells.get(k, "") for k in self._columns])
        self._file.flush()

    def finish(self, summary: dict[str, Any] | None) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _rewrite(self) -> None:
        """Every row under the current header, through a temporary file and an atomic rename."""
        assert self._file is not None and self._target is not None
        tmp = self._target.with_name(f".{self._target.name}.tmp")
        with tmp.open("w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(self._columns)
            writer.writerows([r.get(k, "") for k in self._columns] for r in self._rows)
        self._file.close()
        os.replace(tmp, self._target)
        self._file = self._target.open("a", encoding="utf-8", newline="")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=str)
    return str(value)  # str(float) is its shortest exact repr; nan, inf, -inf


# -- TensorBoard ---------------------------------------------------------------------------------
class TensorBoardSink:
    """TensorBoard event files through ``torch.utils.tensorboard.SummaryWriter``.

    Every numeric value of a row becomes a scalar under its own name (``train_loss``,
    ``eval_accuracy``, ``bytes_sent``, ...) at ``global_step = row["step"]``; the events are
    flushed row by row. At the start the config goes in as text (tag ``config``); at a successful
    finish the config's scalars (nested keys joined by ``.``: ``hyperparameters.H``) and the
    final evaluation metrics are written as hparams, so TensorBoard's HParams tab compares runs.
    ``tensorboard --logdir runs`` shows every run under ``runs/``.

    Args:
        log_dir: the event folder; default ``tensorboard`` in the run folder.
    """

    def __init__(self, log_dir: str | Path | None = None) -> None:
        if log_dir is not None and not isinstance(log_dir, (str, Path)):
            raise ValueError(f"log_dir must be a folder path or None, got {log_dir!r}")
        self.log_dir: Path | None = Path(log_dir) if log_dir is not None else None
        _require_tensorboard()
        self._writer: Any = None
        self._config: dict[str, Any] = {}

    def start(self, config: dict[str, Any], run_dir: Path | None) -> None:
        if self.log_dir is not None:
            log_dir = self.log_dir
        elif run_dir is not None:
            log_dir = Path(run_dir) / "tensorboard"
        else:
            raise ValueError("TensorBoardSink has nowhere to write: the run has no folder (give "
                             "fit an out_dir) and TensorBoardSink(log_dir=...) is None")
        tb = _require_tensorboard()
        self._writer = tb.SummaryWriter(log_dir=str(log_dir))
        self._config = config
        text = json.dumps(config, indent=2, default=str)
        # Four spaces: a Markdown code block, shown verbatim by TensorBoard's text tab.
        self._writer.add_text("config", "\n".join("    " + line for line in text.splitlines()),
                              global_step=0)
        self._writer.flush()

    def resume(self, config: dict[str, Any], run_dir: Path | None,
               rows: Sequence[dict[str, Any]]) -> None:
        """Continue a run: TensorBoard drops the events at steps after the last of ``rows``
        (``SummaryWriter(purge_step=...)``), so none is shown twice."""
        log_dir = self.log_dir if self.log_dir is not None else (
            Path(run_dir) / "tensorboard" if run_dir is not None else None)
        if log_dir is None:
            raise ValueError("TensorBoardSink has nowhere to write: the run has no folder")
        tb = _require_tensorboard()
        last = max((_step(r) for r in rows), default=0)
        self._writer = tb.SummaryWriter(log_dir=str(log_dir), purge_step=last + 1)
        self._config = config

    def log(self, row: dict[str, Any]) -> None:
        if self._writer is None:
            raise _not_started(self)
        step = _step(row)
        for key, value in numeric_metrics(row).items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def finish(self, summary: dict[str, Any] | None) -> None:
        if self._writer is None:
            return
        try:
            if summary is not None:
                final = summary.get("final") or {}
                metrics = numeric_metrics(final) if isinstance(final, dict) else {}
                self._write_hparams(_flat_scalars(self._config), metrics)
        finally:
            self._writer.close()
            self._writer = None

    def _write_hparams(self, hparams: dict[str, Any], metrics: dict[str, int | float]) -> None:
        """The HParams plugin's three summaries, in this run's own event file (the writer's
        ``add_hparams`` would put them in a new sub-folder, a second run). The metric values are
        not written again: the plugin reads them from this run's scalars of the same names."""
        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        for summary in hparams_summaries(hparams, metrics):  # experiment, session start, end
            self._writer.file_writer.add_summary(summary)


def _require_tensorboard() -> ModuleType:
    # ``tensorboard`` first: ``torch.utils.tensorboard`` may already be imported (cached).
    _require("tensorboard", "tensorboard", "TensorBoardSink")
    return _require("torch.utils.tensorboard", "tensorboard", "TensorBoardSink")


def _flat_scalars(obj: dict[str, Any], prefix: str = "") -> dict[str, int | float | str | bool]:
    """Nested mappings flattened to ``a.b`` keys; lists as JSON text; None left out."""
    out: dict[str, int | float | str | bool] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat_scalars(value, name + "."))
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(value, default=str)
        elif isinstance(value, (bool, str, numbers.Real)):
            out[name] = value  # type: ignore[assignment]
        elif value is not None:
            out[name] = str(value)
    return out


# -- Weights & Biases ----------------------------------------------------------------------------
class WandbSink:
    """A Weights & Biases run: ``wandb.init(project, config=config.json, dir=run folder)``.

    Every row's numeric values are logged with ``step=row["step"]``; at a successful finish the
    summary's top-level scalars (``samples_per_s``, ``sim_time_s``, ``utilization``, ...) and
    its ``final`` metrics go into the run summary (nested parts such as the clock trace stay in
    ``summary.json``) and the run finishes with exit code 0; a failed run finishes with exit
    code 1. The run is created with ``reinit="create_new"``: it is its own run even if the
    program has another W&B run active, and ``finish`` ends only it.

    Args:
        project: the W&B project.
        mode: ``"online"``, ``"offline"`` (written under the run folder's ``wandb/``, upload later
            with ``wandb sync``), ``"disabled"``; None: W&B's default (``WANDB_MODE``, else
            online).
        entity: the W&B user or team; None: the default entity of the login.
        name: the run's display name; None: the run folder's name (W&B picks one when the run
            has no folder).
    """

    def __init__(
        self,
        project: str,
        *,
        mode: WandbMode | None = None,
        entity: str | None = None,
        name: str | None = None,
    ) -> None:
        if not isinstance(project, str) or not project or "/" in project:
            raise ValueError(f"project must be a non-empty name without '/', got {project!r}")
        if mode is not None and mode not in WANDB_MODES:
            raise ValueError(f"mode must be one of {WANDB_MODES} or None, got {mode!r}")
        for arg, value in (("entity", entity), ("name", name)):
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{arg} must be a non-empty string or None, got {value!r}")
        self.project, self.mode, self.entity, self.name = project, mode, entity, name
        _require("wandb", "wandb", "WandbSink")
        self._run: Any = None

    def start(self, config: dict[str, Any], run_dir: Path | None) -> None:
        wandb = _require("wandb", "wandb", "WandbSink")
        name = self.name if self.name is not None or run_dir is None else Path(run_dir).name
        self._run = wandb.init(
            project=self.project, entity=self.entity, name=name, config=config,
            dir=str(run_dir) if run_dir is not None else None, mode=self.mode,
            reinit="create_new",
        )
        if run_dir is not None:  # so that a resumed run continues this W&B run
            (Path(run_dir) / "wandb-run-id").write_text(self._run.id + "\n", encoding="utf-8")

    def resume(self, config: dict[str, Any], run_dir: Path | None,
               rows: Sequence[dict[str, Any]]) -> None:
        """Continue a run: the same W&B run (its id is kept in ``RUN/wandb-run-id``), with
        ``resume="allow"``. W&B keeps the steps it already has; the rows a crash left after the
        checkpoint were logged there once and are not logged again (W&B drops steps that are
        not above its last)."""
        wandb = _require("wandb", "wandb", "WandbSink")
        saved = Path(run_dir) / "wandb-run-id" if run_dir is not None else None
        run_id = saved.read_text(encoding="utf-8").strip() if saved and saved.is_file() else None
        name = self.name if self.name is not None or run_dir is None else Path(run_dir).name
        self._run = wandb.init(
            project=self.project, entity=self.entity, name=name, config=config,
            dir=str(run_dir) if run_dir is not None else None, mode=self.mode,
            reinit="create_new", id=run_id, resume="allow" if run_id else None,
        )

    def log(self, row: dict[str, Any]) -> None:
        if self._run is None:
            raise _not_started(self)
        self._run.log(numeric_metrics(row), step=_step(row))

    def finish(self, summary: dict[str, Any] | None) -> None:
        if self._run is None:
            return
        run, self._run = self._run, None
        try:
            if summary is not None:
                run.summary.update(_summary_scalars(summary))
        finally:
            run.finish(exit_code=0 if summary is not None else 1)


def _summary_scalars(summary: dict[str, Any]) -> dict[str, int | float | str | bool]:
    """The top-level numbers and strings of ``summary.json`` and its ``final`` metrics."""
    out: dict[str, int | float | str | bool] = {
        k: v for k, v in summary.items() if isinstance(v, (numbers.Real, str))}
    final = summary.get("final")
    if isinstance(final, dict):
        out.update(numeric_metrics(final))
    return out


# -- several sinks, and sinks from strings -------------------------------------------------------
class MultiSink:
    """Several sinks as one, called in order. ``start`` failing in one finishes (as failed) those
    already started; ``finish`` reaches every sink even if one raises (the first error is raised
    after all)."""

    def __init__(self, sinks: Sequence[Sink]) -> None:
        if not isinstance(sinks, (list, tuple)):
            raise TypeError(f"sinks must be a list or tuple of sinks ([CSVSink()]), got "
                            f"{type(sinks).__name__}")
        for i, sink in enumerate(sinks):
            if not isinstance(sink, Sink):
                raise TypeError(f"sinks[{i}] must have start, log and finish "
                                f"(exogym.run.output.sinks.Sink), got {type(sink).__name__}")
        self.sinks: tuple[Sink, ...] = tuple(sinks)

    def start(self, config: dict[str, Any], run_dir: Path | None) -> None:
        for i, sink in enumerate(self.sinks):
            try:
                sink.start(config, run_dir)
            except BaseException:
                MultiSink(self.sinks[:i]).finish(None)
                raise

    def resume(self, config: dict[str, Any], run_dir: Path | None,
               rows: Sequence[dict[str, Any]]) -> None:
        """Continue every sink (``resume`` where it has one, else ``start``)."""
        for i, sink in enumerate(self.sinks):
            try:
                resume = getattr(sink, "resume", None)
                if callable(resume):
                    resume(config, run_dir, rows)
                else:
                    sink.start(config, run_dir)
            except BaseException:
                MultiSink(self.sinks[:i]).finish(None)
                raise

    def log(self, row: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.log(row)

    def finish(self, summary: dict[str, Any] | None) -> None:
        error: BaseException | None = None
        for sink in self.sinks:
            try:
                sink.finish(summary)
            except BaseException as e:
                error = error or e
        if error is not None:
            raise error


def make_sink(spec: str) -> Sink:
    """A sink from a string: ``csv``, ``tensorboard``, ``wandb:PROJECT``,
    ``wandb:ENTITY/PROJECT``, each W&B form optionally ending in ``:MODE`` (``online``,
    ``offline``, ``disabled``): ``wandb:exogym:offline``."""
    forms = ", ".join(SINK_FORMS)
    if not isinstance(spec, str):
        raise ValueError(f"sink must be a string, one of {forms}; got {spec!r}")
    if spec == "csv":
        return CSVSink()
    if spec == "tensorboard":
        return TensorBoardSink()
    kind, _, rest = spec.partition(":")
    if kind != "wandb":
        raise ValueError(f"unknown sink {spec!r}: use one of {forms}")
    path, colon, mode = rest.partition(":")
    entity, _, project = path.rpartition("/")
    if not project or (path.count("/") > 1) or ("/" in path and not entity):
        raise ValueError(f"bad W&B sink {spec!r}: use wandb:PROJECT or wandb:ENTITY/PROJECT, "
                         "optionally ending in :MODE")
    if colon and mode not in WANDB_MODES:
        raise ValueError(f"bad W&B mode {mode!r} in {spec!r}: MODE is one of "
                         f"{', '.join(WANDB_MODES)}")
    return WandbSink(project, mode=mode or None, entity=entity or None)  # type: ignore[arg-type]
