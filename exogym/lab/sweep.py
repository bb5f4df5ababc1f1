"""``exogym sweep``: one strategy over a grid of settings, with repeats, resumable.

>>> result = sweep("mnist", "diloco", {"H": ["10", "50"], "outer_lr": ["0.3", "0.7"]},
...                num_nodes=4, max_steps=500, repeats=2, out_dir="runs/sweep")
>>> result.best.settings
{'H': '50', 'outer_lr': '0.7'}

An axis is a strategy hyperparameter (any key of ``exogym strategies ID``; values parsed as
``--set`` parses them), or one of the run's own axes: ``nodes`` (N) and ``network`` (profile
names). The points are every combination, in the order the axes and values are given; each point
is trained with seeds ``seed, ..., seed + repeats - 1`` exactly as ``exogym run`` trains it, into
``OUT/runs/pNNN-seedS`` (``OUT/sweep.json`` says which settings ``pNNN`` holds).

The score of a point is the mean over its repeats of the final evaluation loss (the whole test
set); the best point has the lowest. ``OUT/results.md`` / ``results.json`` hold every point's
mean ± sample standard deviation of the final metrics, bytes sent per node and simulated time,
and the best; ``OUT/sweep.png`` a line plot (one axis) or one heatmap per pair of axes (the
score averaged over the other axes).

A sweep is resumable: run the same command again with the same ``--out`` and the finished runs
(those with a ``summary.json``) are read, not retrained; an unfinished run's folder is cleared
and the run trained again from its start. A folder holding another sweep (a different task,
strategy, grid or setting) is an error listing what differs.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import shutil
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from exogym import strategy as strategies
from exogym.lab.compare import default_eval_interval
from exogym.lab.outcome import CurvePoint, RunOutcome, Stat
from exogym.lab.progress import RunProgress
from exogym.lab.sweep_report import (
    SweepPoint,
    SweepResult,
    format_json,
    format_markdown,
    score_table,
)
from exogym.run.output.result import check_out_dir, read_json
from exogym.sim.network import Network, parse_network
from exogym.tasks.registry import get_task
from exogym.utils.config import ConfigError, config_fields

if TYPE_CHECKING:
    from exogym.tasks.registry import Task

__all__ = ["RUN_AXES", "SweepPoint", "SweepResult", "format_json", "format_markdown", "parse_grid",
           "score_table", "sweep"]

RUN_AXES = ("nodes", "network")
"""Axes that are settings of the run, not of the strategy."""

FORMAT = "exogym-sweep-v1"


def parse_grid(items: Sequence[str]) -> dict[str, list[str]]:
    """``["H=10,50", "outer_lr=0.3,0.7"]`` -> ``{"H": ["10", "50"], "outer_lr": [...]}``.

    Raises:
        ConfigError: an item that is not ``KEY=V1,V2,...``, an empty value, an axis given twice,
            a value repeated within an axis.
    """
    grid: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        parts = [v.strip() for v in values.split(",")]
        if not sep or not key or not all(parts):
            raise ConfigError(f"bad grid axis {item!r}: give KEY=V1,V2,... (e.g. H=10,50,100)")
        if key in grid:
            raise ConfigError(f"grid axis {key!r} is given twice; give all its values once")
        if len(set(parts)) != len(parts):
            raise ConfigError(f"grid axis {key!r} repeats a value: {values}")
        grid[key] = parts
    if not grid:
        raise ConfigError("a sweep needs at least one axis (--grid KEY=V1,V2,...)")
    return grid


def _outcome(label: str, run_dir: Path) -> RunOutcome:
    """A finished run's outcome read back from its folder."""
    summary = read_json(run_dir / "summary.json", "a run folder written by exogym")
    rows = [json.loads(line) for line in
            (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if line]
    curve = tuple(CurvePoint(step=r["step"], eval_loss=float(r["eval_loss"]),
                             bytes_sent=r["bytes_sent"], sim_time_s=r["sim_time_s"])
                  for r in rows if "eval_loss" in r)
    return RunOutcome(
        label=label, strategy=summary["strategy"], seed=summary["seed"], out_dir=run_dir,
        final={k: float(v) for k, v in summary["final"].items()},
        bytes_sent_per_node=max(summary["bytes_sent_per_node"]),
        sim_time_s=float(summary["sim_time_s"]), utilization=float(summary["utilization"]),
        step_time_s=float(summary["step_time_s"]), compute_source=summary["compute_source"],
        samples_per_s=float(summary["samples_per_s"]),
        wall_time_s=float(summary["wall_time_s"]), curve=curve, world=summary.get("world"))


def sweep(
    task: str,
    strategy: str,
    grid: Mapping[str, Sequence[str]],
    *,
    out_dir: str | Path,
    num_nodes: int = 4,
    max_steps: int = 500,
    repeats: int = 1,
    seed: int = 0,
    network: Network | str = "datacenter",
    overrides: Mapping[str, Any] | None = None,
    step_time: float | None = None,
    eval_samples: int | None = 2000,
    data_dir: str | Path | None = None,
    download: bool = True,
    progress: bool = False,
) -> SweepResult:
    """Train ``strategy`` at every point of ``grid`` (see the module docstring).

    Args:
        grid: ``{axis: [values]}``; axes are strategy keys or :data:`RUN_AXES`.
        overrides: fixed strategy settings for every point (``--set``).
        network: the runs' network, unless an axis sweeps it.
        num_nodes: the runs' N, unless an axis sweeps it.

    Raises:
        ConfigError: an unknown axis or setting, a bad value (checked for every point before
            anything trains), or ``out_dir`` holding another sweep.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    spec = get_task(task)
    axes, fixed = _check_axes(strategy, grid, overrides)
    base_net = parse_network(network)
    points = [dict(zip(axes, values, strict=True))
              for values in itertools.product(*axes.values())]
    plans = _plan_points(spec, strategy, points, fixed, num_nodes, base_net)
    out = Path(out_dir)
    _open_folder(out, {
        "format": FORMAT, "task": spec.id, "strategy": strategy, "axes": axes, "fixed": fixed,
        "num_nodes": num_nodes, "steps": max_steps, "repeats": repeats, "seed": seed,
        "network": base_net.spec(), "step_time": step_time, "eval_samples": eval_samples,
        "points": [{"name": f"p{i:03d}", "settings": p} for i, p in enumerate(points)]})

    seeds = tuple(range(seed, seed + repeats))
    runs = _Runs(spec, strategy, out, max_steps=max_steps, step_time=step_time,
                 eval_samples=eval_samples, data_dir=data_dir, download=download,
                 progress=progress, total=len(points) * len(seeds))
    results = [_point(i, point, runs.of_point(i, point, plan, seeds))
               for i, (point, plan) in enumerate(zip(points, plans, strict=True))]
    finite = [p for p in results if math.isfinite(p.score)]
    best = min(finite, key=lambda p: p.score) if finite else None
    return _write(SweepResult(task=spec.id, strategy=strategy, axes=axes, seeds=seeds,
                              points=tuple(results), best=best, out_dir=out,
                              trained=runs.trained, reused=runs.reused, plot=None))


# -- the steps of sweep: check, open the folder, train or read back, write -------------------------
def _check_axes(strategy: str, grid: Mapping[str, Sequence[str]],
                overrides: Mapping[str, Any] | None) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The grid's axes and the fixed settings, their values as strings.

    Raises:
        ConfigError: an unknown strategy, an axis that is neither a key of the strategy nor one
            of :data:`RUN_AXES` (with the closest key), a key both swept and fixed.
    """
    keys = config_fields(strategies.get(strategy))
    axes = {k: [str(v) for v in vs] for k, vs in grid.items()}
    for key in axes:
        if key not in RUN_AXES and key not in keys:
            close = difflib.get_close_matches(key, [*keys, *RUN_AXES], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"grid axis {key!r} is neither a key of {strategy} nor one of "
                              f"{', '.join(RUN_AXES)}{hint}; its keys: {', '.join(keys)}")
    fixed = {k: str(v) for k, v in (overrides or {}).items()}
    both = sorted(set(fixed) & set(axes))
    if both:
        raise ConfigError(f"{', '.join(both)} is both swept (--grid) and fixed (--set)")
    return axes, fixed


_PointPlan = tuple[dict[str, Any], int, Network]
"""What a point trains with: the strategy's settings, the number of nodes, the network."""


def _plan_points(spec: Task, strategy: str, points: Sequence[Mapping[str, str]],
                 fixed: Mapping[str, str], num_nodes: int, base_net: Network) -> list[_PointPlan]:
    """Every point's :data:`_PointPlan`, in grid order: its strategy built, its nodes and network
    checked, before anything trains; the strategy's learning rate is the task's unless a
    setting gives one.

    Raises:
        ConfigError: the first point that does not build, naming it (``pNNN``) and its values.
    """
    plans = []
    for i, point in enumerate(points):
        settings = {"optim.lr": spec.lr, **fixed,
                    **{k: v for k, v in point.items() if k not in RUN_AXES}}
        try:
            strategies.make(strategy, **settings)
            nodes = int(point.get("nodes", num_nodes))
            if nodes < 1:
                raise ValueError(f"nodes must be >= 1, got {nodes}")
            net = parse_network(point["network"]) if "network" in point else base_net
            net.check_nodes(nodes)
        except (ConfigError, ValueError) as err:
            raise ConfigError(f"grid point p{i:03d} ({_name(point)}): {err}") from None
        plans.append((settings, nodes, net))
    return plans


def _open_folder(out: Path, record: Mapping[str, Any]) -> None:
    """Continue the sweep in ``out`` if its ``sweep.json`` records the same sweep as ``record``,
    else start one: ``out`` must not exist (:func:`exogym.run.output.result.check_out_dir`), and is
    created holding ``sweep.json``.

    Raises:
        ConfigError: ``out`` holds another sweep (naming the fields that differ).
    """
    if (out / "sweep.json").is_file():
        saved = read_json(out / "sweep.json", "a sweep folder written by `exogym sweep`")
        diff = [k for k in sorted(set(saved) | set(record))
                if json.dumps(saved.get(k), default=str) != json.dumps(record.get(k), default=str)]
        if diff:
            raise ConfigError(f"{out} holds another sweep (different {', '.join(diff)}); "
                              "choose another --out, or give the same settings to continue it")
    else:
        check_out_dir(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "sweep.json").write_text(json.dumps(record, indent=2, default=str) + "\n",
                                        encoding="utf-8")


class _Runs:
    """The runs of a sweep's points: a finished run (its ``summary.json`` written) is read
    back, any other trained from its start, exactly as ``exogym run`` trains it. The task's
    data loads with the first run trained (a sweep read back whole loads none); ``trained``
    and ``reused`` count the runs."""

    def __init__(self, spec: Task, strategy: str, out: Path, *, max_steps: int,
                 step_time: float | None, eval_samples: int | None,
                 data_dir: str | Path | None, download: bool, progress: bool,
                 total: int) -> None:
        self.spec, self.strategy, self.out = spec, strategy, out
        self.meter = RunProgress(total) if progress else None
        self.max_steps, self.step_time, self.eval_samples = max_steps, step_time, eval_samples
        self.data_dir, self.download, self.progress = data_dir, download, progress
        self.interval = default_eval_interval(spec.eval_interval, max_steps)
        self.trained = self.reused = 0
        self._data: tuple[Any, Any] | None = None

    def of_point(self, index: int, point: Mapping[str, str], plan: _PointPlan,
                 seeds: Sequence[int]) -> list[RunOutcome]:
        """The runs of point ``index`` (labelled ``pNNN``), one per seed, in seed order, each
        in ``OUT/runs/pNNN-seedS``."""
        label = f"p{index:03d}"
        runs = []
        for s in seeds:
            run_dir = self.out / "runs" / f"{label}-seed{s}"
            if (run_dir / "summary.json").is_file():
                runs.append(_outcome(label, run_dir))
                self.reused += 1
                if self.meter is not None:
                    self.meter.skip()
                continue
            if run_dir.exists():  # interrupted: train it again from the start
                shutil.rmtree(run_dir)
            if self.meter is not None:
                self.meter.begin(f"{label} {_name(point)} seed {s}", run_dir)
            runs.append(self._train(label, plan, s, run_dir))
            self.trained += 1
            if self.meter is not None:
                self.meter.end()
        return runs

    def _train(self, label: str, plan: _PointPlan, seed: int, run_dir: Path) -> RunOutcome:
        from exogym.run.trainer import Trainer

        settings, nodes, net = plan
        if self._data is None:
            self._data = self.spec.load_data(self.data_dir, self.download)
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "not a multiple of H": in results.json
            result = Trainer(self.spec.build_model(), *self._data).fit(
                strategy=strategies.make(self.strategy, **settings), num_nodes=nodes,
                max_steps=self.max_steps, batch_size=self.spec.batch_size,
                eval_interval=self.interval, eval_samples=self.eval_samples,
                eval_at_start=True, seed=seed, out_dir=run_dir, progress=self.progress,
                network=net, step_time=self.step_time, run_info=self.spec.run_info(self._data[0]))
        return RunOutcome.from_fit(label, result)


def _write(result: SweepResult) -> SweepResult:
    """Write ``results.md``, ``results.json`` and ``sweep.png`` into the sweep's folder (the
    plot skipped, with a warning to the caller of :func:`sweep`, when matplotlib is missing);
    the result with its plot."""
    out = result.out_dir
    (out / "results.md").write_text(format_markdown(result), encoding="utf-8")
    (out / "results.json").write_text(format_json(result), encoding="utf-8")
    try:
        from exogym.lab.plots import plot_sweep

        plot = plot_sweep(result, out / "sweep.png")
    except ImportError as err:
        warnings.warn(f"sweep.png not drawn: {err}", stacklevel=3)  # sweep's caller
        plot = None
    return replace(result, plot=plot)


def _name(point: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items())


def _point(index: int, settings: dict[str, str], runs: list[RunOutcome]) -> SweepPoint:
    keys = [k for k in runs[0].final if all(k in r.final for r in runs)]
    metrics = {k: Stat(tuple(r.final[k] for r in runs)) for k in keys}
    metrics["bytes_sent_per_node"] = Stat(tuple(r.bytes_sent_per_node for r in runs))
    metrics["sim_time_s"] = Stat(tuple(r.sim_time_s for r in runs))
    return SweepPoint(index=index, settings=settings, runs=tuple(runs), metrics=metrics)
