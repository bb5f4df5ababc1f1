"""What a sweep (:mod:`exogym.lab.sweep`) measured, and how it is shown.

The result types: :class:`SweepPoint` (one combination of the grid, aggregated over its runs)
and :class:`SweepResult` (the whole sweep). Their renderings: :func:`format_markdown`
(``results.md``) and :func:`format_json` (``results.json``), and :func:`score_table` (the score
per value of one or two axes, which :func:`exogym.lab.plots.plot_sweep` draws).

Nothing here trains or reads files (it only looks for each run's timeline files, to link them:
:func:`exogym.run.output.trace.timeline_links`), and nothing here imports the runner: it imports
only the lab's shared types and number formats (:mod:`exogym.lab.outcome`,
:mod:`exogym.lab.formats`).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exogym.lab.formats import format_metric
from exogym.lab.outcome import RunOutcome, Stat
from exogym.run.output.trace import timeline_links

__all__ = ["SweepPoint", "SweepResult", "format_json", "format_markdown", "score_table"]


@dataclass(frozen=True)
class SweepPoint:
    """One combination of the grid and its runs.

    Attributes:
        index: its position in the grid (the ``pNNN`` of its run folders).
        settings: ``{axis: value}`` as given (strings).
        runs: one per seed.
        metrics: ``eval_*`` final metrics, ``bytes_sent_per_node`` and ``sim_time_s`` over the
            runs (``score`` is ``metrics["eval_loss"].mean``).
    """

    index: int
    settings: dict[str, str]
    runs: tuple[RunOutcome, ...]
    metrics: dict[str, Stat]

    @property
    def score(self) -> float:
        return self.metrics["eval_loss"].mean

    @property
    def name(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.settings.items())


@dataclass(frozen=True)
class SweepResult:
    """What :func:`exogym.lab.sweep.sweep` ran and wrote: ``points`` in grid order, the ``best``
    (lowest score; None when every point diverged), the results folder and its files."""

    task: str
    strategy: str
    axes: dict[str, list[str]]
    seeds: tuple[int, ...]
    points: tuple[SweepPoint, ...]
    best: SweepPoint | None
    out_dir: Path
    trained: int
    reused: int
    plot: Path | None


def _cell(stat: Stat, key: str) -> str:
    """A final metric's mean (± std over repeats), shown as ``exogym compare`` shows it."""
    fmt = format_metric(key)
    if stat.n == 1:
        return fmt(stat.mean)
    return f"{fmt(stat.mean)} ± {fmt(stat.std)}"


def format_markdown(result: SweepResult) -> str:
    """``results.md``: one row per point, the best in bold, then what each column is."""
    evals = [k for k in result.points[0].metrics if k.startswith("eval_")]
    head = ["point", *result.axes, *(k.replace("_", " ") for k in evals), "sent per node",
            "sim time"]
    lines = [f"# exogym sweep: {result.strategy} on {result.task}", "",
             f"{len(result.points)} points x {len(result.seeds)} seed(s) "
             f"({', '.join(map(str, result.seeds))}); score = mean final eval loss; best: "
             + (f"p{result.best.index:03d} ({result.best.name})" if result.best else "none"),
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in result.points:
        cells = [f"p{p.index:03d}", *p.settings.values(),
                 *(_cell(p.metrics[k], k) for k in evals),
                 f"{p.metrics['bytes_sent_per_node'].mean / 1e6:,.2f} MB",
                 f"{p.metrics['sim_time_s'].mean:,.1f} s"]
        if p is result.best:
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Values are mean ± sample standard deviation over the seeds; evaluation on the "
              "whole test set after the last step; each run's folder is runs/pNNN-seedS."]
    timelines = [(p, r, links) for p in result.points for r in p.runs
                 if (links := timeline_links(r.out_dir, result.out_dir))]
    if timelines:
        lines += ["", "## Timelines", "",
                  "Each run's timeline (a trace opens in https://ui.perfetto.dev):", ""]
        lines += [f"- p{p.index:03d} seed {r.seed}: {links}" for p, r, links in timelines]
    return "\n".join(lines) + "\n"


def format_json(result: SweepResult) -> str:
    def stat(s: Stat) -> dict[str, Any]:
        return {"mean": _finite(s.mean), "std": _finite(s.std) if s.n > 1 else None,
                "values": [_finite(v) for v in s.values]}

    return json.dumps({
        "task": result.task, "strategy": result.strategy, "axes": result.axes,
        "seeds": list(result.seeds),
        "best": None if result.best is None else f"p{result.best.index:03d}",
        "points": [{"name": f"p{p.index:03d}", "settings": p.settings,
                    "score": _finite(p.score),
                    "metrics": {k: stat(v) for k, v in p.metrics.items()},
                    "runs": [str(r.out_dir) for r in p.runs]} for p in result.points],
    }, indent=2) + "\n"


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def score_table(result: SweepResult, a: str, b: str | None) -> dict[tuple[str, ...], float]:
    """The score per value of axis ``a`` (and ``b``), averaged over the other axes' values."""
    groups: dict[tuple[str, ...], list[float]] = {}
    for p in result.points:
        key = (p.settings[a],) if b is None else (p.settings[a], p.settings[b])
        groups.setdefault(key, []).append(p.score)
    return {k: statistics.fmean(v) for k, v in groups.items()}
