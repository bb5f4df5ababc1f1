"""``exogym compare``: several strategies on one task, from the same seeds, into one results folder.

>>> comparison = compare("mnist", ["ddp", "diloco", "diloco-h10"], num_nodes=4, max_steps=500,
...                      network="home-100mbps", overrides={"diloco-h10.H": 10},
...                      out_dir="runs/cmp")
>>> comparison.row("diloco").metrics["eval_loss"].mean

Every run is exactly what ``exogym run --task TASK --strategy ID --seed S`` trains: the model is
built after ``torch.manual_seed(seed)``, the inner learning rate is the task's unless a setting
gives one, and :meth:`exogym.Trainer.fit` writes the run's own folder (``metrics.jsonl``,
``config.json``, ``summary.json``) under ``OUT/runs/LABEL-seedS``. ``repeats=K`` trains every
strategy with seeds ``seed, seed + 1, ..., seed + K - 1`` (the seed of data order, model
initialisation and dropout; a strategy's own ``seed`` field, SPARTA's index stream for one, stays as
configured, as in ``exogym run``). The data partition (``partition="dirichlet:0.1"``), gradient
accumulation (``micro_batch_size``) and ``precision`` are those of :meth:`exogym.Trainer.fit`,
the same for every run.

Strategies are listed by label: a registry id (``diloco``), or an id and a name
(``diloco-h10``) so that one method can appear with several settings. Settings are
``KEY=VALUE`` items (:mod:`exogym.utils.config`): ``LABEL.KEY`` sets one strategy's hyperparameter
(``diloco-h10.H=10``), a bare ``KEY`` every strategy's (``optim.lr=2e-3``, ``max_grad_norm=1``);
a label's own setting wins over a bare one, and either over the task's learning rate. A
misspelled key, a bad value, a bare key that a strategy lacks and a label that is not compared
are errors (:mod:`exogym.lab.labels` resolves them).

The folder then holds ``results.md`` (one row per label: final evaluation, steps and simulated
time to reach a target loss, bytes sent per node, simulated time on the network, throughput and
wall time; with repeats, mean ± sample standard deviation), ``results.json`` (the same numbers,
exact, with every run's; both rendered by :mod:`exogym.lab.report`, whose result types are
re-exported here), and three plots (:mod:`exogym.lab.plots`; if matplotlib cannot be imported,
everything else is still written and ``plot_note`` says why). An existing folder is an error.
The command line is in :mod:`exogym.cli`.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from exogym.lab.labels import label_of_spec, resolve_strategies
from exogym.lab.outcome import RUN_METRICS, RunOutcome, Stat
from exogym.lab.plots import PLOT_FILES
from exogym.lab.progress import RunProgress
from exogym.lab.report import Comparison, ComparisonRow, format_json, format_markdown
from exogym.run.options import check_compute
from exogym.run.output.result import check_out_dir
from exogym.sim.devices import parse_hardware
from exogym.sim.engine import PRECISIONS, Precision
from exogym.sim.network import Network, parse_duration, parse_network
from exogym.sim.partition import Partition, parse_partition
from exogym.sim.world import World, parse_world
from exogym.strategy import StackedStrategy
from exogym.tasks.registry import get_task
from exogym.utils.config import ConfigError, config_fields

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from exogym.run.output.result import FitResult
    from exogym.tasks.registry import Task

__all__ = [
    "PLOT_FILES",
    "Comparison",
    "ComparisonRow",
    "RunOutcome",
    "Stat",
    "compare",
    "default_eval_interval",
    "resolve_strategies",
]


# -- running ---------------------------------------------------------------------------------------
def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def default_eval_interval(task_interval: int, max_steps: int) -> int:
    """The task's evaluation interval, or finer: at least about 10 evaluations per run (as
    :meth:`exogym.Trainer.fit` by default), so that the curves and the steps to target have some
    resolution."""
    return max(min(task_interval, max_steps // 10), 1)


def compare(
    task: str, strategies: Sequence[str], *, num_nodes: int, max_steps: int,
    out_dir: str | Path, network: Network | str = "datacenter", repeats: int = 1, seed: int = 0,
    target_loss: float | None = None, batch_size: int | None = None,
    partition: Partition | str = "iid", micro_batch_size: int | None = None,
    precision: Precision = "fp32", eval_interval: int | None = None,
    eval_samples: int | None = 2000,
    overrides: Mapping[str, Any] | Iterable[tuple[str, Any]] = (),
    step_time: float | str | None = None, compute: str = "profile",
    hardware: str | None = None, device: str = "auto",
    data_dir: str | Path | None = None, download: bool = True, progress: bool = False,
    allow_unsynced: bool = False, allow_nonfinite: bool = False,
    world: World | str | None = None, trace: bool = False,
) -> Comparison:
    """Train every strategy on ``task`` with the same seeds and write the comparison.

    Args:
        task: a task id (``exogym tasks``), e.g. ``"mnist"``.
        strategies: labels, ``ID`` or ``ID-NAME`` (``["ddp", "diloco", "diloco-h10"]``).
        num_nodes: N, the nodes of every run.
        max_steps: the training steps of every run.
        out_dir: the results folder; it must not exist.
        network: the simulated network of every run's clock (a profile, a spec or a
            :class:`Network`).
        repeats: K; every strategy is trained with seeds ``seed .. seed + K - 1``.
        seed: the first seed.
        target_loss: the eval loss of "steps to target"; default the worst (highest) last
            evaluation among the runs that improved on the initial model (step 0), which each of
            them reaches; a run that never got below its initial loss is marked "no
            improvement" instead.
        batch_size: per node; default the task's.
        partition: the split of every run's training set (``"iid"``, ``"dirichlet:ALPHA"`` or
            ``"contiguous"``), as :meth:`exogym.Trainer.fit`.
        micro_batch_size: gradient accumulation over micro-batches of this many rows (None: the
            whole batch at once).
        precision: ``"fp32"`` or ``"bf16"`` (forward passes under bfloat16 autocast).
        device: the device every run trains on.
        eval_interval: steps between evaluations (the resolution of steps to target); default
            :func:`default_eval_interval`.
        eval_samples: evaluations during training (the curves, steps to target) use a fixed
            subset of this many samples, the final metrics the whole set (None: the whole set
            every time), as :meth:`exogym.Trainer.fit`.
        overrides: strategy settings, ``{"diloco.H": 50, "optim.lr": "2e-3"}`` or pairs
            (:func:`resolve_strategies`).
        step_time: one node's compute per step (seconds or ``"1.5s"``); or
        compute: ``"profile"`` or ``"measured"``, with
        hardware: the simulated device of every node, as :meth:`exogym.Trainer.fit`.
        data_dir: where the task's data is.
        download: whether it may be downloaded.
        progress: print a line and show a progress bar per run.
        allow_unsynced: allow runs shorter than a strategy's ``H`` (otherwise an error before
            anything is trained).
        allow_nonfinite: a run whose loss turns NaN or infinite stops the comparison with
            :class:`exogym.run.output.result.NonFiniteLossError` (the finished runs' folders stay);
            True trains every run to the end regardless.
        world: the world every run trains in (:mod:`exogym.sim.world`; None: perfect): the same
            failures, speeds and losses for every strategy (the world is seeded).
        trace: every run also writes its timeline as a Chrome trace (``trace.json``, as
            :meth:`exogym.Trainer.fit`'s ``trace``), linked from ``results.md``.

    Returns:
        The :class:`Comparison`; the plots are skipped, with ``plot_note`` saying why and a
        warning, when matplotlib is missing.

    Raises:
        ConfigError: a bad task, label or setting (before anything is trained).
        ValueError: a bad argument.
        FileExistsError: ``out_dir`` exists.
    """
    plan = _plan(task, strategies, num_nodes=num_nodes, max_steps=max_steps, out_dir=out_dir,
                 network=network, repeats=repeats, seed=seed, target_loss=target_loss,
                 batch_size=batch_size, partition=partition, micro_batch_size=micro_batch_size,
                 precision=precision, eval_interval=eval_interval, eval_samples=eval_samples,
                 overrides=overrides, step_time=step_time, compute=compute, hardware=hardware,
                 device=device, progress=progress,
                 allow_unsynced=allow_unsynced, allow_nonfinite=allow_nonfinite, world=world,
                 trace=trace)
    train, test = plan.spec.load_data(data_dir, download)
    outcomes, built, last = _train_all(plan, train, test)
    return _write(_comparison(plan, outcomes, built, target_loss, last))


# -- the steps of compare: check, train, aggregate, write ------------------------------------------
@dataclass(frozen=True)
class _Plan:
    """A comparison's arguments, checked and parsed (:func:`_plan`): what every run trains with.

    ``labels`` are the strategies' labels (a user-code spec replaced by its ``ID[-NAME]``),
    ``overrides`` the settings as given (every run rebuilds its strategy from them), ``seeds``
    ``seed .. seed + repeats - 1``, ``batch`` and ``interval`` the per-node batch size and the
    evaluation interval after their defaults, ``out`` the results folder (checked not to exist).
    """

    spec: Task
    labels: tuple[str, ...]
    overrides: Mapping[str, Any] | Iterable[tuple[str, Any]]
    seeds: tuple[int, ...]
    num_nodes: int
    max_steps: int
    batch: int
    partition: Partition
    micro_batch_size: int | None
    precision: Precision
    interval: int
    eval_samples: int | None
    network: Network
    step_time: float | None
    compute: str
    hardware: str | None
    world: World
    out: Path
    device: str
    progress: bool
    allow_unsynced: bool
    allow_nonfinite: bool
    trace: bool = False


def _plan(
    task: str, given: Sequence[str], *, num_nodes: int, max_steps: int, out_dir: str | Path,
    network: Network | str, repeats: int, seed: int, target_loss: float | None,
    batch_size: int | None, partition: Partition | str, micro_batch_size: int | None,
    precision: Precision, eval_interval: int | None, eval_samples: int | None,
    overrides: Mapping[str, Any] | Iterable[tuple[str, Any]], step_time: float | str | None,
    compute: str, hardware: str | None,
    device: str, progress: bool, allow_unsynced: bool, allow_nonfinite: bool,
    world: World | str | None, trace: bool = False,
) -> _Plan:
    """Check every argument of :func:`compare` and build every strategy once, before any data
    loads or anything trains; the errors are :func:`compare`'s, in this order."""
    if isinstance(given, str):
        raise ConfigError(f"strategies must be a list of labels, got the string {given!r} "
                          f"(e.g. {given.split(',')!r})")
    labels = [label_of_spec(label) for label in given]
    spec = get_task(task)
    _check_int("num_nodes", num_nodes, 1)
    _check_int("max_steps", max_steps, 1)
    _check_int("repeats", repeats, 1)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    batch = _check_int("batch_size", spec.batch_size if batch_size is None else batch_size, 1)
    part = parse_partition(partition)
    if micro_batch_size is not None:
        _check_int("micro_batch_size", micro_batch_size, 1)
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    interval = _check_int("eval_interval", default_eval_interval(spec.eval_interval, max_steps)
                          if eval_interval is None else eval_interval, 1)
    if target_loss is not None and (isinstance(target_loss, bool) or not isinstance(
            target_loss, (int, float)) or not math.isfinite(target_loss)):
        raise ValueError(f"target_loss must be a finite number or None, got {target_loss!r}")
    net = parse_network(network)
    if step_time is not None:
        step_time = parse_duration(step_time) if isinstance(step_time, str) else step_time
        if isinstance(step_time, bool) or not isinstance(step_time, (int, float)) or not (
                math.isfinite(step_time) and step_time > 0):
            raise ValueError(f"step_time must be > 0 seconds, got {step_time!r}")
    if eval_samples is not None:
        _check_int("eval_samples (or None)", eval_samples, 1)
    check_compute(compute, hardware, step_time=step_time)
    if hardware is not None:
        parse_hardware(hardware).check_nodes(num_nodes)
    net.check_nodes(num_nodes)
    the_world = parse_world(world)
    the_world.check_nodes(num_nodes)
    # once: a generator would be used up by the check and every run would train without it
    overrides = dict(overrides) if isinstance(overrides, Mapping) else list(overrides)
    checked = resolve_strategies(labels, overrides, lr=spec.lr)  # every setting, before training
    _check_synced(checked, max_steps, allow_unsynced)
    return _Plan(
        spec=spec, labels=tuple(labels), overrides=overrides,
        seeds=tuple(range(seed, seed + repeats)), num_nodes=num_nodes, max_steps=max_steps,
        batch=batch, partition=part, micro_batch_size=micro_batch_size, precision=precision,
        interval=interval, eval_samples=eval_samples, network=net, step_time=step_time,
        compute=compute, hardware=hardware, world=the_world, out=check_out_dir(out_dir),
        device=device, progress=progress,
        allow_unsynced=allow_unsynced, allow_nonfinite=allow_nonfinite, trace=trace)


def _check_synced(built: Mapping[str, StackedStrategy], max_steps: int,
                  allow_unsynced: bool) -> None:
    """Raise ConfigError for a strategy whose period ``H`` is longer than the run, unless
    ``allow_unsynced``: its global model would stay the initial one."""
    for label, strategy in built.items():
        period = strategy.sync_period
        if period is not None and max_steps < period and not allow_unsynced:
            raise ConfigError(
                f"{label}: {max_steps} steps but H={period}: its nodes would never (fully) "
                "synchronise and its global model would stay the initial one; train longer, "
                f"lower H (--set {label}.H=...), or pass allow_unsynced (--allow-unsynced)")


def _train_all(plan: _Plan, train: Dataset, test: Dataset,
               ) -> tuple[dict[str, list[RunOutcome]], dict[str, StackedStrategy], FitResult]:
    """Make the results folder, then train every label with every seed, seed by seed (every
    label with the first seed, then the next), each run into ``OUT/runs/LABEL-seedS``; the
    strategies are built again for every seed, so that no state is shared between runs.

    Returns:
        The outcomes per label (in seed order), the strategy of each label's last run (its
        hyperparameters are every run's), and the last run's result (its evaluation sets are
        every run's). A run's warnings are warned again, naming the label and seed, to the
        caller of :func:`compare`.
    """
    plan.out.mkdir(parents=True, exist_ok=True)
    outcomes: dict[str, list[RunOutcome]] = {label: [] for label in plan.labels}
    built: dict[str, StackedStrategy] = {}
    meter = RunProgress(len(plan.seeds) * len(plan.labels)) if plan.progress else None
    result: FitResult | None = None
    for s in plan.seeds:
        fresh = resolve_strategies(plan.labels, plan.overrides, lr=plan.spec.lr)
        for label in plan.labels:
            strategy = built[label] = fresh[label]
            run_dir = plan.out / "runs" / f"{label}-seed{s}"
            if meter is not None:
                meter.begin(f"{label} seed {s}", run_dir)
            result, said = _train_one(plan, strategy, s, run_dir, train, test)
            if meter is not None:
                meter.end()
            for text in said:  # repeated for every run it applies to, naming the label
                # stacklevel 3: the caller of compare, which calls this function
                warnings.warn(f"{label} (seed {s}): {text}", UserWarning, stacklevel=3)
            outcomes[label].append(RunOutcome.from_fit(label, result, said))
    assert result is not None  # plan has at least one label and one seed
    return outcomes, built, result


def _train_one(plan: _Plan, strategy: StackedStrategy, seed: int, run_dir: Path, train: Dataset,
               test: Dataset) -> tuple[FitResult, tuple[str, ...]]:
    """One run, exactly as ``exogym run`` trains it (the model built after
    ``torch.manual_seed(seed)``), into ``run_dir``; its result and the distinct texts of the
    warnings it raised, in order."""
    from exogym.run.trainer import Trainer

    torch.manual_seed(seed)
    model = plan.spec.build_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every run's own warnings, not once per place
        result = Trainer(model, train, test).fit(
            strategy=strategy, num_nodes=plan.num_nodes, max_steps=plan.max_steps,
            batch_size=plan.batch, partition=plan.partition,
            micro_batch_size=plan.micro_batch_size, precision=plan.precision,
            eval_interval=plan.interval, eval_samples=plan.eval_samples, eval_at_start=True,
            device=plan.device, seed=seed, out_dir=run_dir, progress=plan.progress,
            network=plan.network, step_time=plan.step_time, compute=plan.compute,
            hardware=plan.hardware, world=plan.world,
            run_info=plan.spec.run_info(train), allow_unsynced=plan.allow_unsynced,
            allow_nonfinite=plan.allow_nonfinite, trace=plan.trace)
    return result, tuple(dict.fromkeys(str(w.message) for w in caught))


def _target(outcomes: Mapping[str, list[RunOutcome]],
            target_loss: float | None) -> tuple[float | None, str]:
    """The target loss and its source: ``given``, or ``default``: the worst (highest) finite
    last evaluation among the runs that improved on their initial model (None if none did)."""
    if target_loss is not None:
        return float(target_loss), "given"
    lasts = [o.curve[-1].eval_loss for runs in outcomes.values() for o in runs
             if o.improved and math.isfinite(o.curve[-1].eval_loss)]
    return (max(lasts) if lasts else None), "default"


def _comparison(plan: _Plan, outcomes: Mapping[str, list[RunOutcome]],
                built: Mapping[str, StackedStrategy], target_loss: float | None,
                last: FitResult) -> Comparison:
    """The :class:`Comparison` of the runs' ``outcomes`` (the target loss, :func:`_target`; a
    row per label, :func:`_aggregate` with the label's strategy in ``built``), without plots
    yet; the evaluation sets are those of ``last`` (every run evaluates on the same sets)."""
    target, source = _target(outcomes, target_loss)
    rows = tuple(_aggregate(label, built[label], outcomes[label], target) for label in plan.labels)
    out, net = plan.out, plan.network
    return Comparison(
        task=plan.spec.id, num_nodes=plan.num_nodes, max_steps=plan.max_steps,
        batch_size=plan.batch, eval_interval=plan.interval,
        micro_batch_size=plan.micro_batch_size, partition=plan.partition.spec,
        precision=plan.precision, network=net.spec(),
        network_text=f"{net.name} ({net.describe()})", seeds=plan.seeds, target_loss=target,
        target_source=source, rows=rows, out_dir=out, results_md=out / "results.md",
        results_json=out / "results.json", plots=(), plot_note=None,
        eval_during_training=last.eval_during_training, eval_set=last.eval_set,
        world=None if plan.world.perfect else plan.world.spec())


def _write(comparison: Comparison) -> Comparison:
    """Draw the plots (skipped with a ``plot_note`` and a warning to the caller of
    :func:`compare` when matplotlib is missing), then write ``results.md`` and
    ``results.json``; the comparison with its plots."""
    plot_note: str | None = None
    plots: tuple[Path, ...] = ()
    try:
        from exogym.lab.plots import plot_comparison

        plots = plot_comparison(comparison, comparison.out_dir)
    except ImportError as err:
        plot_note = f"plots not drawn: {err}"
        warnings.warn(plot_note, stacklevel=3)  # the caller of compare, which calls this
    comparison = replace(comparison, plots=plots, plot_note=plot_note)
    comparison.results_md.write_text(format_markdown(comparison), encoding="utf-8")
    comparison.results_json.write_text(format_json(comparison), encoding="utf-8")
    return comparison


def _aggregate(label: str, strategy: StackedStrategy, runs: list[RunOutcome],
               target: float | None) -> ComparisonRow:
    keys = [k for k in runs[0].final if all(k in o.final for o in runs)]
    metrics = {k: Stat(tuple(o.final[k] for o in runs)) for k in keys}
    for k in RUN_METRICS:
        metrics[k] = Stat(tuple(float(getattr(o, k)) for o in runs))
    hits = [h for h in (o.reach(target) for o in runs) if h is not None]
    steps = [p.step for p in runs[0].curve]
    if any([p.step for p in o.curve] != steps for o in runs):
        raise RuntimeError("runs of one strategy evaluated at different steps")
    by_step = list(zip(*(o.curve for o in runs), strict=True))  # per step, one point per run
    defaults = {k: d for k, (_t, d, _h) in config_fields(type(strategy)).items()}
    params = strategy.hyperparameters()
    changed = {k: v for k, v in params.items() if k in defaults and v != defaults[k]}
    return ComparisonRow(
        label=label, strategy=strategy.id, hyperparameters=params, changed=changed,
        runs=tuple(runs), metrics=metrics,
        steps_to_target=Stat(tuple(float(h.step) for h in hits)) if hits else None,
        sim_time_to_target_s=Stat(tuple(h.sim_time_s for h in hits)) if hits else None,
        reached=len(hits), curve_steps=tuple(steps),
        loss_mean=tuple(statistics.fmean(p.eval_loss for p in pts) for pts in by_step),
        loss_min=tuple(min(p.eval_loss for p in pts) for pts in by_step),
        loss_max=tuple(max(p.eval_loss for p in pts) for pts in by_step),
        bytes_mean=tuple(statistics.fmean(p.bytes_sent for p in pts) for pts in by_step),
        sim_time_mean=tuple(statistics.fmean(p.sim_time_s for p in pts) for pts in by_step),
    )
