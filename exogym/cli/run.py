"""``exogym run``: train one strategy on one task (:class:`exogym.Trainer`), or continue a
recorded run (``--resume``).

Its options are the run settings' declarations (:mod:`exogym.run.options`: flag, converter,
help), plus what is not a setting of ``fit``: the task and its data, the strategy and its
``--set`` / ``--lr``, the sinks. Under ``torchrun`` the command runs as one rank of a
multi-process job (:meth:`exogym.Trainer.fit` joins torchrun's group).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exogym.cli import ft
from exogym.cli.common import (
    add_data_options,
    add_settings,
    add_task_option,
    converter,
    default_out,
    get_task,
    setting_values,
)
from exogym.cli.presets import PRESETS
from exogym.run.output.sinks import make_sink
from exogym.utils.config import ConfigError

if TYPE_CHECKING:
    from torch import nn
    from torch.utils.data import Dataset

    from exogym.run.output.result import FitResult
    from exogym.strategy import StackedStrategy
    from exogym.tasks import Task

__all__ = ["add_arguments", "add_parser", "command"]

# The settings this command places itself: the nodes, the engine and the device go to
# Trainer.fit or fit_processes as each takes them (_fit_run); --resume is another path.
_PLACED = ("num_nodes", "engine", "device", "resume")


def add_parser(sub: Any) -> None:
    add_arguments(sub.add_parser("run", help="train a task with a strategy on N simulated "
                                             "nodes"))


# ``exogym run --help`` in sections: each run setting with a flag, by its name, in one of them
# (tests/run/test_settings.py checks that every flag is placed once)
SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("task and data", ("batch_size", "partition")),
    ("strategy", ()),
    ("length and evaluation", ("max_steps", "num_epochs", "eval_interval", "eval_samples",
                               "log_interval", "seed")),
    ("nodes and population", ("num_nodes", "participation", "client_state", "concurrency",
                              "arrivals", "round_policy", "clients_in_memory", "client_store")),
    ("network and world", ("network", "world")),
    ("devices: what a step costs", ("compute", "hardware", "device_profiles", "step_time")),
    ("engine, memory and processes", ("engine", "micro_batch_size", "precision", "device",
                                      "resident", "offload")),
    ("real failures (torchft)", ()),
    ("checkpoints and resume", ("checkpoint_every", "checkpoint_interval", "keep_checkpoints",
                                "async_checkpoint", "resume")),
    ("output and logging", ("out_dir", "progress", "trace", "allow_nonfinite",
                            "allow_unsynced")),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``exogym run``'s options in :data:`SECTIONS`: every run setting with a flag, and the
    rest."""
    from exogym import strategy as strategies

    group = {title: p.add_argument_group(title) for title, _ in SECTIONS}
    data, strategy = group["task and data"], group["strategy"]
    add_task_option(data)
    for title, names in SECTIONS:
        add_settings(group[title], names)
    add_data_options(data)
    strategy.add_argument(
        "--preset", choices=sorted(PRESETS), metavar="NAME",
        help="a published configuration as the flags that reproduce it, placed where --preset "
             "stands (a flag after it overrides the preset's): "
             + "; ".join(f"{name}: {preset.help()}" for name, preset in sorted(PRESETS.items())))
    strategy.add_argument("--strategy", default="diloco",
                          help=f"strategy id ({', '.join(strategies.registry())}), or your own: "
                               "path/to/file.py:Class or package.module:Class")
    strategy.add_argument("--lr", type=converter("positive_number"),
                          help="inner learning rate (optim.lr)")
    strategy.add_argument("--set", dest="overrides", type=converter("key_value"),
                          action="append", default=[], metavar="KEY=VALUE",
                          help="a strategy hyperparameter, e.g. --set H=50 (see `exogym "
                               "strategies`)")
    ft.add_arguments(group["real failures (torchft)"])
    out = group["output and logging"]
    out.add_argument("--csv", action="store_true", help="also write metrics.csv in the run folder")
    out.add_argument("--tensorboard", action="store_true",
                     help="also write TensorBoard events to RUN_DIR/tensorboard "
                          '(pip install "exogym[tensorboard]")')
    out.add_argument("--wandb", metavar="[ENTITY/]PROJECT[:MODE]",
                     help="also log to Weights & Biases; MODE online, offline (upload later: "
                          'wandb sync RUN_DIR/wandb/offline-run-*) or disabled (pip install '
                          '"exogym[wandb]")')


def command(args: argparse.Namespace) -> int:
    """``exogym run``: train one strategy on one task and print the run's summary (rank 0 only
    under torchrun); ``--resume`` continues a recorded run instead (:func:`_resume_run`).

    Every option that can be checked is checked before the data loads (which may download):
    the task, the sinks, the strategy and its settings, the output folder, the network and
    world against ``--nodes``, the memory and the run's length against the strategy's period.
    """
    import torch

    from exogym import strategy as strategies
    from exogym.run.dist.ranks import torchrun_env
    from exogym.run.output.result import check_out_dir

    if args.resume is not None:
        return _resume_run(args)
    _check_typed(args)
    if args.ft or args.kill or args.min_replicas != 1 or args.commit_every != 1:
        plain = argparse.ArgumentParser()
        add_arguments(plain)
        ft.check_ft_args(args, plain.parse_args([]))
    task = get_task(args.task)
    sink_specs = _sink_specs(args)
    sinks = [make_sink(spec) for spec in sink_specs]  # fails before the data loads
    strategy = strategies.make(args.strategy, **_run_overrides(args, task.lr))
    out = args.out if args.out is not None else default_out(
        f"{args.task}-{args.strategy}-n{args.nodes}")
    ranks = torchrun_env()
    if args.ft:  # under torchrun the groups and their restarts share the folder
        if ranks is None:
            check_out_dir(out)
        return ft.run_ft(args, task, strategy, out)
    if ranks is None or ranks.rank == 0:
        check_out_dir(out)
    args.network.check_nodes(args.nodes)
    if args.world is not None:
        args.world.check_nodes(args.nodes)
    torch.manual_seed(args.seed)
    model = task.build_model()
    _check_run(args, strategy, model, under_torchrun=ranks is not None)

    train, test = task.load_data(args.data_dir, not args.no_download)
    fit_args = _run_fit_args(args, task, out, sinks, sink_specs, train)
    result = _fit_run(args, model, train, test, strategy, fit_args,
                      under_torchrun=ranks is not None)
    if ranks is None or ranks.rank == 0:
        print(result.summary())
    return 0


def _run_overrides(args: argparse.Namespace, task_lr: float) -> dict[str, str]:
    """The strategy's settings of ``exogym run``: ``--set`` items, and the inner learning rate
    (``optim.lr``) from ``--lr``, else the task's ``task_lr`` unless a ``--set`` gives one.

    Raises:
        ConfigError: ``--lr`` together with ``--set lr`` or ``--set optim.lr``.
    """
    overrides = dict(args.overrides)
    if args.lr is not None:
        if any(k in ("lr", "optim.lr") for k in overrides):
            raise ConfigError("give the inner learning rate once: --lr or --set optim.lr, not both")
        overrides["optim.lr"] = str(args.lr)
    if "lr" not in overrides and "optim.lr" not in overrides:
        overrides["optim.lr"] = str(task_lr)
    return overrides


def _check_run(args: argparse.Namespace, strategy: StackedStrategy, model: nn.Module, *,
               under_torchrun: bool) -> None:
    """Check, before the data loads, that the nodes' copies fit the device's memory (in one
    process, not under torchrun) and that the run is at least one period ``H`` of the strategy
    long (unless ``--allow-unsynced``).

    Raises:
        ConfigError: a run shorter than ``H``; the memory check's error when the copies do not
            fit.
    """
    from exogym.run.nodes.paging import in_memory_nodes
    from exogym.sim.engine import check_memory, resolve_device
    from exogym.sim.participation import parse_participation

    if args.engine != "process" and not under_torchrun:
        device = resolve_device(args.device)
        nodes = in_memory_nodes(args.nodes, args.resident, args.offload, device)
        if args.participation is not None and args.clients_in_memory != "all":
            nodes = min(nodes, parse_participation(args.participation).per_round(args.nodes))
        if args.concurrency is not None:
            nodes = min(nodes, args.concurrency)
            # (the trainer checks again with every client when the run must hold all of them)
        check_memory(model, nodes, device, strategy.optim.states_per_parameter)
    period = strategy.sync_period
    if period is not None and args.steps is not None and args.steps < period \
            and not args.allow_unsynced:
        raise ConfigError(
            f"{strategy.id}: --steps {args.steps} is shorter than H={period}: the nodes would "
            "never (fully) synchronise and the global model would stay the initial one; train "
            "longer, lower H (--set H=...), or pass --allow-unsynced if that is intended")


def _check_typed(args: argparse.Namespace) -> None:
    """Options typed that another option makes meaningless are refused by name, whatever
    their value (a value equal to the default included)."""
    typed = getattr(args, "typed", frozenset())
    if "client_store" in typed and args.client_state != "keep":
        raise ConfigError(f"--client-store {args.client_store} keeps the state of clients that "
                          f"keep it: give --client-state keep (got {args.client_state})")


def _run_fit_args(args: argparse.Namespace, task: Task, out: Path, sinks: list[Any],
                  sink_specs: list[str], train: Dataset) -> dict[str, Any]:
    """The keyword arguments of :meth:`exogym.Trainer.fit` (and of
    :func:`exogym.run.launch.fit_processes`) that ``exogym run``'s options give: every setting
    with a flag, the task's defaults filled in, but those the command places (``_PLACED``);
    the run's length as ``max_steps`` (default 500) or ``num_epochs``."""
    from exogym.run.options import settings

    fit_args = setting_values(args, [name for name, s in settings().items()
                                     if s.flag and name not in _PLACED])
    fit_args.update(
        batch_size=args.batch_size or task.batch_size,
        eval_interval=args.eval_interval or task.eval_interval,
        out_dir=out, sinks=sinks,
        run_info={**task.run_info(train), "sinks": sink_specs,
                  "launcher": "process" if args.engine == "process" else None})
    if args.epochs:
        del fit_args["max_steps"]
    else:
        del fit_args["num_epochs"]
        fit_args["max_steps"] = args.steps or 500
    return fit_args


def _fit_run(args: argparse.Namespace, model: nn.Module, train: Dataset, test: Dataset,
             strategy: StackedStrategy, fit_args: dict[str, Any], *,
             under_torchrun: bool) -> FitResult:
    """Train: ``--engine process`` spawns one process per node (gloo on the CPU, nccl with
    one GPU per process), any other engine runs in this process, as one rank of torchrun's job
    when under torchrun (:meth:`exogym.Trainer.fit` joins its process group).

    Raises:
        ConfigError: ``--engine process`` under torchrun, or with a device other than auto,
            cpu or cuda.
    """
    import torch

    from exogym.run.trainer import Trainer

    if args.engine == "process":
        from exogym.run.launch import fit_processes

        if under_torchrun:
            raise ConfigError("--engine process spawns its own processes; under torchrun use "
                              "--engine auto, loop or vmap (torchrun already made the processes)")
        if args.device not in ("auto", "cpu", "cuda"):
            raise ConfigError("--engine process runs on cpu (gloo) or cuda (nccl, one GPU per "
                              f"process), got --device {args.device}")
        cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        return fit_processes(model, train, test, strategy=strategy, num_nodes=args.nodes,
                             backend="nccl" if cuda else "gloo", engine="loop", **fit_args)
    return Trainer(model, train, test).fit(
        strategy=strategy, num_nodes=args.nodes, engine=args.engine, device=args.device,
        **fit_args)


def _sink_specs(args: argparse.Namespace) -> list[str]:
    specs = ["csv"] * args.csv + ["tensorboard"] * args.tensorboard
    if args.wandb is not None:
        specs.append(f"wandb:{args.wandb}")
    return specs


# -- exogym run --resume RUN_DIR ----------------------------------------------------------------
# Options of this command, not settings, that --resume may be given with: where the data is.
_RESUME_OWN = ("data_dir", "no_download", "command")


def _resume_flags() -> tuple[list[str], list[str]]:
    """The settings whose flags ``--resume`` takes: those a resumed run may change (given, they
    replace the recorded value) and those it takes as given (not recorded)."""
    from exogym.run.options import settings

    declared = {name: s for name, s in settings().items() if s.flag and name != "resume"}
    return ([name for name, s in declared.items() if s.resume == "may change"],
            [name for name, s in declared.items() if s.resume == "as given"])


def _check_resume_options(args: argparse.Namespace) -> argparse.Namespace:
    """The options given with ``--resume`` are ones it takes (the run goes on as recorded);
    returns the command's defaults."""
    from exogym.run.options import settings

    p = argparse.ArgumentParser()
    add_arguments(p)
    defaults = p.parse_args([])
    changeable, as_given = _resume_flags()
    allowed = {str(settings()[name].dest) for name in [*changeable, *as_given, "resume"]}
    allowed.update(_RESUME_OWN)
    flag = {a.dest: a.option_strings[-1] for a in p._actions if a.option_strings}
    typed = _typed_options(args, defaults)
    changed = sorted(flag.get(k, k) for k in typed if k not in allowed)
    if changed:
        flags = [str(settings()[name].flag) for name in [*changeable, *as_given]]
        raise ConfigError("--resume continues the run as it was recorded; drop "
                          f"{', '.join(changed)} (allowed with --resume: {', '.join(flags)}, "
                          "--data-dir and --no-download; --steps extends the run)")
    return defaults


def _typed_options(args: argparse.Namespace, defaults: argparse.Namespace) -> set[str]:
    """The options typed on the command line, whatever their value (``args.typed``, from the
    command line's parse); a namespace built by hand: those that differ from the defaults."""
    typed = getattr(args, "typed", None)
    if typed is not None:
        return set(typed) & set(vars(defaults))
    return {k for k, v in vars(args).items() if v != getattr(defaults, k, None)}


def _resume_run(args: argparse.Namespace) -> int:
    """``exogym run --resume RUN_DIR``: rebuild the recorded run (task, data, sinks) and
    continue it from its newest usable checkpoint."""
    import torch

    from exogym.run.dist.ranks import torchrun_env
    from exogym.run.options import settings
    from exogym.run.output.result import read_json
    from exogym.run.trainer import Trainer

    defaults = _check_resume_options(args)
    config = read_json(args.resume / "config.json",
                       "--resume takes a run folder written by `exogym run`")
    task_id = config.get("task")
    if not task_id:
        raise ConfigError(f"{args.resume / 'config.json'} records no task; resume a Python-API "
                          "run from Python: Trainer(model, data).fit(resume=RUN_DIR)")
    task = get_task(config.get("task_source") or task_id)
    sinks = [make_sink(spec) for spec in config.get("sinks", [])]
    train, test = task.load_data(args.data_dir, not args.no_download)
    torch.manual_seed(int(config["seed"]))
    model = task.build_model()
    changeable, as_given = _resume_flags()
    fit_args: dict[str, Any] = dict(resume=args.resume, sinks=sinks,
                                    **setting_values(args, as_given))
    # the recorded values go on (checkpoints, pages), unless an option typed here changes one
    typed = _typed_options(args, defaults)
    fit_args.update({k: v for k, v in setting_values(args, changeable).items()
                     if str(settings()[k].dest) in typed})
    if config.get("launcher") == "process":
        from exogym.run.launch import fit_processes

        processes = int(config["processes"])
        backend = "nccl" if str(config["device"]).startswith("cuda") else "gloo"
        result = fit_processes(model, train, test, strategy=None,
                               num_nodes=int(config["num_nodes"]),
                               nodes_per_process=int(config["num_nodes"]) // processes,
                               backend=backend, **fit_args)
    else:
        result = Trainer(model, train, test).fit(**fit_args)
    ranks = torchrun_env()
    if ranks is None or ranks.rank == 0:
        print(result.summary())
    return 0
