"""What a strategy comparison (:mod:`exogym.lab.compare`) measured, and how it is shown.

The result types: :class:`ComparisonRow` (one strategy, aggregated over its runs) and
:class:`Comparison` (the whole comparison), built of :class:`Stat`, :class:`CurvePoint` and
:class:`RunOutcome` (:mod:`exogym.lab.outcome`, re-exported here). And their renderings:
:func:`format_table` (the markdown table that ``exogym compare`` prints), :func:`format_markdown`
(``results.md``) and :func:`format_json` (``results.json``: the same numbers, exact, with every
run's).

Nothing here trains or reads files (it only looks for each run's timeline files, to link them:
:func:`exogym.run.output.trace.timeline_links`), and nothing here imports the runner: it imports
only the lab's shared types and number formats (:mod:`exogym.lab.outcome`,
:mod:`exogym.lab.formats`). :func:`exogym.lab.compare.compare` builds a :class:`Comparison` and
writes these texts, :mod:`exogym.lab.plots` draws its curves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exogym.lab.formats import format_bytes, format_metric
from exogym.lab.outcome import RUN_METRICS, CurvePoint, RunOutcome, Stat
from exogym.run.output.result import _dumps as _dumps_json
from exogym.run.output.result import world_line
from exogym.run.output.trace import timeline_links
from exogym.sim.network import format_duration

__all__ = [
    "RUN_METRICS",
    "Comparison",
    "ComparisonRow",
    "CurvePoint",
    "RunOutcome",
    "Stat",
    "format_json",
    "format_markdown",
    "format_metric",
    "format_table",
]


# -- results -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ComparisonRow:
    """One strategy (label) of a comparison, aggregated over its runs.

    Attributes:
        label: as listed; ``strategy`` the registry id.
        hyperparameters: the strategy's settings (every field, as in ``summary.json``).
        changed: the settings that differ from the strategy's defaults.
        runs: one per seed.
        metrics: ``eval_*`` final metrics and :data:`RUN_METRICS`, each a :class:`Stat`.
        steps_to_target: the steps to the target, over the runs that reached it (None when
            none did); ``reached`` how many did.
        sim_time_to_target_s: the simulated time to the target, over the same runs.
        curve_steps: the evaluation steps (the same in every run); ``loss_mean``, ``loss_min``,
            ``loss_max``, ``bytes_mean`` and ``sim_time_mean`` the curve over the runs there.
    """

    label: str
    strategy: str
    hyperparameters: dict[str, Any]
    changed: dict[str, Any]
    runs: tuple[RunOutcome, ...]
    metrics: dict[str, Stat]
    steps_to_target: Stat | None
    sim_time_to_target_s: Stat | None
    reached: int
    curve_steps: tuple[int, ...]
    loss_mean: tuple[float, ...]
    loss_min: tuple[float, ...]
    loss_max: tuple[float, ...]
    bytes_mean: tuple[float, ...]
    sim_time_mean: tuple[float, ...]


@dataclass(frozen=True)
class Comparison:
    """What :func:`exogym.lab.compare.compare` ran and wrote.

    Attributes:
        task: the task's canonical id.
        num_nodes: ``N`` of every run.
        max_steps: the steps of every run.
        batch_size: the batch size per node of every run.
        eval_interval: the steps between two evaluations of every run.
        micro_batch_size: how every run accumulated gradients (as :meth:`exogym.Trainer.fit`).
        partition: how every run split the data (the spec string, e.g. ``"dirichlet:0.1"``).
        precision: the precision every run trained in (as :meth:`exogym.Trainer.fit`).
        network: the simulated network (its spec string); ``network_text`` its description.
        seeds: the seeds every strategy was trained with.
        target_loss: the loss of "steps to target" (None: no run improved on the initial
            model); ``target_source`` ``"given"`` or ``"default"`` (the worst last evaluation
            of the runs that improved on their initial model).
        eval_during_training: what the curves were evaluated on (a fixed subset, or the whole
            set); ``eval_set`` what the final metrics were evaluated on (the whole set).
        rows: one per label, in the order given.
        out_dir: the results folder; ``results_md``, ``results_json`` and ``plots`` inside it.
        plot_note: why the plots were not drawn (None when they were).
    """

    task: str
    num_nodes: int
    max_steps: int
    batch_size: int
    eval_interval: int
    micro_batch_size: int | None
    partition: str
    precision: str
    network: str
    network_text: str
    seeds: tuple[int, ...]
    target_loss: float | None
    target_source: str
    rows: tuple[ComparisonRow, ...]
    out_dir: Path
    results_md: Path
    results_json: Path
    plots: tuple[Path, ...]
    plot_note: str | None
    eval_during_training: str | None = None
    eval_set: str | None = None
    world: str | None = None

    def row(self, label: str) -> ComparisonRow:
        """The row of ``label``."""
        for r in self.rows:
            if r.label == label:
                return r
        raise KeyError(f"no strategy {label!r} in this comparison; "
                       f"labels: {', '.join(r.label for r in self.rows)}")


# -- rendering -----------------------------------------------------------------------------------
def _to_json(c: Comparison) -> dict[str, Any]:
    rows = []
    for r in c.rows:
        rows.append({
            "label": r.label, "strategy": r.strategy, "hyperparameters": r.hyperparameters,
            "changed": r.changed,
            "metrics": {k: s.to_dict() for k, s in r.metrics.items()},
            "steps_to_target": r.steps_to_target.to_dict() if r.steps_to_target else None,
            "sim_time_to_target_s": (r.sim_time_to_target_s.to_dict()
                                     if r.sim_time_to_target_s else None),
            "reached": r.reached,
            "curve": {"step": r.curve_steps, "eval_loss_mean": r.loss_mean,
                      "eval_loss_min": r.loss_min, "eval_loss_max": r.loss_max,
                      "bytes_sent_mean": r.bytes_mean, "sim_time_s_mean": r.sim_time_mean},
            "runs": [o.to_dict(c.target_loss) for o in r.runs],
        })
    return {
        "task": c.task, "num_nodes": c.num_nodes, "max_steps": c.max_steps,
        "batch_size_per_node": c.batch_size, "micro_batch_size": c.micro_batch_size,
        "partition": c.partition, "precision": c.precision, "eval_interval": c.eval_interval,
        "network": c.network, "seeds": c.seeds, "target_loss": c.target_loss,
        "target_source": c.target_source, "spread": "sample standard deviation (n - 1)",
        "eval_during_training": c.eval_during_training, "eval_set": c.eval_set,
        "world": c.world,
        "rows": rows, "plots": [p.name for p in c.plots], "plot_note": c.plot_note,
    }


def format_json(c: Comparison) -> str:
    """The ``results.json`` text: indented by 2, lists of plain values (curves) on one line,
    non-finite numbers as strings (``"nan"``; JSON has none), as ``summary.json``."""
    return _dumps_json(_to_json(c)) + "\n"


def _fmt_time(seconds: float) -> str:
    """:func:`exogym.sim.network.format_duration`, with 3 significant digits below a second too."""
    if 1e-3 <= seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return format_duration(seconds)


def _fmt_count(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"


_FORMATS: dict[str, Any] = {
    "bytes_sent_per_node": format_bytes, "sim_time_s": _fmt_time,
    "utilization": format_metric("utilization"), "samples_per_s": lambda v: f"{v:,.0f}",
    "wall_time_s": _fmt_time,
}


def _cell(stat: Stat | None, fmt: Any) -> str:
    if stat is None:
        return "not reached"
    if stat.std is None or stat.min == stat.max:
        return fmt(stat.mean)
    return f"{fmt(stat.mean)} ± {fmt(stat.std)}"


def format_table(c: Comparison) -> list[str]:
    """The results table (markdown), one row per label."""
    evals = [k for k in c.rows[0].metrics if k.startswith("eval_")]
    evals = [k for k in evals if all(k in r.metrics for r in c.rows)]
    target = f"{c.target_loss:.4f}" if c.target_loss is not None else "-"
    head = ["strategy", *(k.replace("_", " ") for k in evals),
            f"steps to loss ≤ {target}", "sim time to target", "sent per node", "sim time",
            "utilization", "samples/s", "wall time"]
    if c.world is not None:
        head.append("world (first seed)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    runs = len(c.seeds)
    for r in c.rows:
        reached = "" if r.reached in (0, runs) else f" ({r.reached}/{runs} runs)"
        to_target = ([_cell(r.steps_to_target, _fmt_count) + reached,
                      _cell(r.sim_time_to_target_s, _fmt_time) + reached]
                     if c.target_loss is not None else ["-", "-"])
        stuck = sum(not o.improved for o in r.runs)
        if stuck:  # a run that never got below its initial loss: say so, not "reached"
            note = "no improvement" + ("" if stuck == runs else f" ({stuck}/{runs} runs)")
            to_target = [f"{cell}; {note}" if cell not in ("-", "not reached") else note
                         for cell in to_target]
        cells = [f"`{r.label}`", *(_cell(r.metrics[k], format_metric(k)) for k in evals),
                 *to_target,
                 *(_cell(r.metrics[k], _FORMATS[k]) for k in RUN_METRICS)]
        if c.world is not None:
            w = r.runs[0].world
            cells.append(world_line(w) if w is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _run_link(run_dir: Path, root: Path) -> str:
    """A run's folder as a link, with its timeline's files where it has them (a world's
    picture, a trace: open it in https://ui.perfetto.dev)."""
    link = f"[{run_dir.name}]({run_dir.relative_to(root).as_posix()}/)"
    files = timeline_links(run_dir, root)
    return f"{link} ({files})" if files else link


def compute_sources(c: Comparison) -> str:
    """How the runs' steps were priced: ``"profile: NVIDIA GeForce RTX 4090"``, ``"measured"``."""
    return ", ".join(sorted({o.compute_source + (f": {o.hardware}" if o.hardware else "")
                             for r in c.rows for o in r.runs}))


def format_markdown(c: Comparison) -> str:
    """The ``results.md`` text."""
    runs = len(c.seeds)
    seeds = f"seed {c.seeds[0]}" if runs == 1 else f"seeds {c.seeds[0]}..{c.seeds[-1]}"
    steps_c = sorted({o.step_time_s for r in c.rows for o in r.runs})
    compute = (format_duration(steps_c[0]) if len(steps_c) == 1 else
               f"{format_duration(steps_c[0])} to {format_duration(steps_c[-1])}")
    sources = compute_sources(c)
    micro = "" if c.micro_batch_size is None else f" (micro-batches of {c.micro_batch_size})"
    if c.target_loss is None:
        target = ("none: no run improved on the initial model's eval loss" if c.target_source
                  != "given" else "none")
    elif c.target_source == "given":
        target = f"{c.target_loss:.4f} (given)"
    else:
        target = (f"{c.target_loss:.4f} (default: the worst last evaluation among the runs "
                  "that improved on the initial model, so each of them reaches it; a run that "
                  "never got below its initial loss is marked 'no improvement')")
    during = c.eval_during_training or c.eval_set or "the task's evaluation set"
    final_set = c.eval_set or "the task's evaluation set"
    lines = [
        f"# exogym compare: {c.task}",
        "",
        f"{c.num_nodes} nodes x {c.max_steps} steps, batch {c.batch_size} per node{micro}, "
        f"partition {c.partition}, precision {c.precision}, network {c.network_text}, "
        f"{seeds} ({runs} run{'s' if runs > 1 else ''} per strategy, the "
        "same seeds for every strategy)"
        + (f", world {c.world}." if c.world is not None else "."),
        "",
        *format_table(c),
        "",
        f"- Evaluation: the global model; final columns after the last step on {final_set}; "
        f"the curves (step 0 = the initial model) and steps to target on {during}.",
        f"- Target loss {target}. Steps to target: the first evaluation with eval loss ≤ the "
        f"target; resolution {c.eval_interval} steps (the evaluation interval). Sim time to "
        "target: the simulated clock at that evaluation.",
        f"- Sent per node: bytes, max over nodes. Sim time: the simulated clock on {c.network} "
        f"(compute {compute} per step per node, {sources}: the same on every machine unless "
        "measured; `exogym recost RUN_DIR --step-time T` re-costs a run with another); "
        "utilization = compute / total.",
        "- Samples/s (training steps only) and wall time (the whole run, evaluations included) "
        "were measured on this machine and vary with its load.",
    ]
    if runs > 1:
        lines.append(f"- Each cell is the mean ± the sample standard deviation (n - 1) over the "
                     f"{runs} seeds; a single value: identical in every run. Where some runs "
                     "missed the target, the mean is over those that reached it (k/K runs). "
                     "Plots: mean curve, shaded from the lowest to the highest run.")
    warned = [(r.label, w) for r in c.rows for w in dict.fromkeys(
        w for o in r.runs for w in o.warnings)]
    if warned:
        lines += ["", "## Warnings", ""] + [f"- `{label}`: {w}" for label, w in warned]
    lines += ["", "## Strategies", ""]
    for r in c.rows:
        changed = ", ".join(f"{k}={v}" for k, v in r.changed.items()) or "defaults"
        lines.append(f"- `{r.label}`: {r.strategy}, {changed}")
    lines += ["", "## Runs", ""]
    for r in c.rows:
        dirs = ", ".join(_run_link(o.out_dir, c.out_dir) for o in r.runs)
        lines.append(f"- `{r.label}`: {dirs}")
    lines += ["", "## Plots", ""]
    if c.plot_note:
        lines.append(c.plot_note)
    for p in c.plots:
        lines.append(f"![{p.stem.replace('_', ' ')}]({p.name})")
    return "\n".join(lines) + "\n"
