"""The ``exogym`` command line: ``run``, ``strategies``, ``tasks``.

A thin layer over :class:`exogym.Trainer`, the task registry and the strategy registry: every
strategy hyperparameter is reachable with ``--set KEY=VALUE`` and checked against the strategy's
fields, so a typo is an error, never a silently ignored option.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from exogym import strategy as strategies
from exogym.config import ConfigError, config_fields
from exogym.data.download import ChecksumError, DatasetNotFoundError
from exogym.engine import ENGINES
from exogym.tasks import TASKS, get_task

__all__ = ["main"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return value


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="exogym", description="Simulate distributed training on one machine."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="train a task with a strategy on N simulated nodes")
    run.add_argument("--task", default="mnist", help=f"task id ({', '.join(TASKS)})")
    run.add_argument("--strategy", default="diloco",
                     help=f"strategy id ({', '.join(strategies.registry())})")
    run.add_argument("--nodes", type=_positive_int, default=4, help="simulated nodes N")
    length = run.add_mutually_exclusive_group()
    length.add_argument("--steps", type=_positive_int, help="training steps (default 500)")
    length.add_argument("--epochs", type=_positive_float, help="passes over each node's shard")
    run.add_argument("--batch-size", type=_positive_int, help="batch size per node")
    run.add_argument("--lr", type=_positive_float, help="inner learning rate (optim.lr)")
    run.add_argument("--set", dest="overrides", type=_key_value, action="append", default=[],
                     metavar="KEY=VALUE",
                     help="a strategy hyperparameter, e.g. --set H=50 (see `exogym strategies`)")
    run.add_argument("--engine", choices=ENGINES, default="auto",
                     help="loop over nodes, vmap, or auto (vmap on CUDA, loop elsewhere)")
    run.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--eval-interval", type=_positive_int,
                     help="steps between evaluations of the global model")
    run.add_argument("--log-interval", type=_positive_int, default=10,
                     help="steps between metrics rows")
    run.add_argument("--out", type=Path,
                     help="run folder (default: runs/TASK-STRATEGY-nN-TIME)")
    run.add_argument("--data-dir", type=Path,
                     help="data folder (default: $EXOGYM_DATA_DIR, else ~/.cache/exogym/data)")
    run.add_argument("--no-download", action="store_true",
                     help="fail instead of downloading missing data")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")

    sub.add_parser("strategies", help="list strategies with their hyperparameters and defaults")
    sub.add_parser("tasks", help="list benchmark tasks")
    return parser


def cmd_run(args: argparse.Namespace) -> int:
    from exogym.trainer import Trainer

    task = get_task(args.task)
    overrides = dict(args.overrides)
    if args.lr is not None:
        if any(k in ("lr", "optim.lr") for k in overrides):
            raise ConfigError("give the inner learning rate once: --lr or --set optim.lr, not both")
        overrides["optim.lr"] = str(args.lr)
    if "lr" not in overrides and "optim.lr" not in overrides:
        overrides["optim.lr"] = str(task.lr)
    strategy = strategies.make(args.strategy, **overrides)

    train, test = task.load_data(args.data_dir, not args.no_download)
    torch.manual_seed(args.seed)
    model = task.build_model()
    out = args.out or _default_out(args.task, args.strategy, args.nodes)
    steps = {"num_epochs": args.epochs} if args.epochs else {"max_steps": args.steps or 500}
    result = Trainer(model, train, test).fit(
        strategy=strategy,
        num_nodes=args.nodes,
        batch_size=args.batch_size or task.batch_size,
        eval_interval=args.eval_interval or task.eval_interval,
        log_interval=args.log_interval,
        engine=args.engine,
        device=args.device,
        seed=args.seed,
        out_dir=out,
        progress=not args.no_progress,
        **steps,
    )
    print(result.summary())
    return 0


def _default_out(task: str, strategy: str, nodes: int) -> Path:
    base = Path("runs") / f"{task}-{strategy}-n{nodes}-{time.strftime('%Y%m%d-%H%M%S')}"
    out, k = base, 1
    while out.exists():
        k += 1
        out = base.with_name(f"{base.name}-{k}")
    return out


def cmd_strategies() -> int:
    for sid in strategies.registry():
        cls = strategies.get(sid)
        doc = (sys.modules[cls.__module__].__doc__ or "").strip().splitlines()[0]
        print(f"{sid}  ({cls.__name__}): {doc}")
        spec = strategies.describe(sid)
        common = config_fields(strategies.Strategy)
        own = [k for k in spec if k not in common] + [k for k in spec if k in common]
        width = max(len(k) for k in spec)
        for key in own:
            _tp, default, help_text = spec[key]
            print(f"    {key:<{width}}  = {default!r:<14} {help_text.replace('``', '')}")
        print()
    return 0


def cmd_tasks() -> int:
    for task in TASKS.values():
        print(f"{task.id}: {task.description} (batch {task.batch_size}/node, lr {task.lr})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.command == "run":
            return cmd_run(args)
        if args.command == "strategies":
            return cmd_strategies()
        return cmd_tasks()
    except (ConfigError, DatasetNotFoundError, ChecksumError, FileExistsError, ValueError) as err:
        print(f"exogym: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `exogym strategies | head`
        sys.stdout = None  # type: ignore[assignment]
        return 0
    except KeyboardInterrupt:
        print("exogym: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
