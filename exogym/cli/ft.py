"""``exogym run --engine process --ft``: a real run that survives real failures
(:mod:`exogym.run.ft.launch`): one torchft replica per node, a Lighthouse in this process, dead
workers restarted and healed from a live peer; ``--kill`` plans SIGKILLs (the chaos harness)."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from exogym.utils.config import ConfigError

# the settings --ft takes: the rest are the simulator's (a network, a world, participation...)
# or not yet wired into the replicas' loop (sinks)
_TAKEN = {"num_nodes", "max_steps", "batch_size", "seed", "out_dir", "checkpoint_every",
          "engine", "progress", "eval_interval", "eval_samples"}
_KILL = re.compile(r"^(\d+)@(\d+)(?::([a-z]+))?(?:\+(never|\d+(?:\.\d+)?)s?)?$")


def parse_kill(text: str) -> Any:
    """``REPLICA@STEP[:POINT][+DELAY|+never]``, e.g. ``1@40``, ``2@90:collective+5``,
    ``0@30+never``: a :class:`exogym.run.ft.launch.Kill`."""
    from exogym.run.ft.launch import Kill

    m = _KILL.match(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(
            f"expected REPLICA@STEP[:POINT][+SECONDS|+never] (e.g. 1@40, 2@90:collective+5, "
            f"0@30+never), got {text!r}")
    replica, step, at, delay = m.groups()
    restart = None if delay == "never" else float(delay or 0.0)
    try:
        kill = Kill(int(replica), int(step), at or "step", restart)
        kill.point()
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return kill


def add_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--ft", action="store_true",
                   help="with --engine process: each process a torchft replica; a dead one is "
                        "restarted and heals from a live peer (pip install 'exogym[ft]')")
    p.add_argument("--min-replicas", type=int, default=1, metavar="K",
                   help="with --ft: a step commits only with at least K replicas in its quorum "
                        "(fewer: it waits for restarts; default 1)")
    p.add_argument("--commit-every", type=int, default=1, metavar="K",
                   help="with --ft: K steps that communicate per quorum and commit (a failure "
                        "redoes up to K of them; default 1)")
    p.add_argument("--kill", type=parse_kill, action="append", default=[],
                   metavar="REPLICA@STEP[:POINT][+SECONDS|+never]",
                   help="with --ft: SIGKILL a replica at a step (POINT: step, collective, heal, "
                        "serve, checkpoint) and restart it after SECONDS (default 0) or never")


def check_ft_args(args: argparse.Namespace, plain: argparse.Namespace) -> None:
    """``--ft`` needs ``--engine process`` and none of the settings it does not take (those
    whose value differs from ``plain``'s, the command line given no option)."""
    from exogym.cli.common import setting_values
    from exogym.run.options import settings

    if args.kill and not args.ft:
        raise ConfigError("--kill plans deaths of torchft replicas: it needs --ft")
    if args.min_replicas != 1 and not args.ft:
        raise ConfigError("--min-replicas is torchft's quorum size: it needs --ft")
    if args.commit_every != 1 and not args.ft:
        raise ConfigError("--commit-every sizes --ft's transactions: it needs --ft")
    if args.commit_every < 1:
        raise ConfigError(f"--commit-every must be >= 1, got {args.commit_every}")
    if not 1 <= args.min_replicas <= args.nodes:
        raise ConfigError(f"--min-replicas must be in [1, --nodes={args.nodes}], got "
                          f"{args.min_replicas}")
    for kill in args.kill:  # before the data loads and anything starts
        why = kill.never_fires(args.nodes, args.steps, args.checkpoint_every, args.commit_every)
        if why is not None:
            raise ConfigError(f"--kill {kill} can never fire: {why}; given --nodes "
                              f"{args.nodes} --steps {args.steps}")
    if not args.ft:
        return
    from exogym.run.dist.ranks import torchrun_env

    if torchrun_env() is not None:
        if args.engine == "process":
            raise ConfigError("under torchrun, --ft makes each torchrun process a replica: "
                              "leave out --engine process (torchrun already made them)")
    elif args.engine != "process":
        raise ConfigError(f"--ft runs one torchft replica per process: it needs --engine "
                          f"process (or a torchrun launch), got --engine {args.engine}")
    names = [n for n, s in settings().items() if s.flag]
    defaults = setting_values(plain, names)
    given = setting_values(args, names)
    other = sorted(settings()[n].flag or n for n, v in given.items()
                   if n not in _TAKEN and v != defaults[n])
    if other:
        raise ConfigError(f"--ft does not take {', '.join(other)}: it takes --nodes, --steps, "
                          "--batch-size, --seed, --out, --checkpoint-every, --eval-interval, "
                          "--eval-samples and --kill (a real run has no simulated network or "
                          "world)")


def run_ft(args: argparse.Namespace, task: Any, strategy: Any, out: Path) -> int:
    """Train with ``--ft`` and print what survived: steps each replica took part in, restarts
    (and the seconds each took to be back in training), the final model's evaluation."""
    import torch

    from exogym.cli.common import setting_values
    from exogym.run.dist.ranks import torchrun_env
    from exogym.run.ft.launch import fit_ft, fit_ft_torchrun
    from exogym.run.ft.manager import check_ft_strategy

    check_ft_strategy(strategy)
    torch.manual_seed(args.seed)
    model = task.build_model()
    train, test = task.load_data(args.data_dir, not args.no_download)
    common = {"replicas": args.nodes, "max_steps": args.steps, "out_dir": out,
              "batch_size": args.batch_size or task.batch_size, "seed": args.seed,
              "kills": args.kill, "checkpoint_every": args.checkpoint_every,
              "min_replicas": args.min_replicas, "commit_every": args.commit_every,
              "eval_dataset": test, "eval_interval": args.eval_interval or task.eval_interval,
              "eval_samples": setting_values(args, ["eval_samples"])["eval_samples"]}
    if torchrun_env() is None:
        result = fit_ft(model, train, strategy, threads=1, **common)
    else:  # this process is one replica; the one that is replica 0 reports
        found = fit_ft_torchrun(model, train, strategy, **common)
        first = os.environ.get("REPLICA_GROUP_ID", "0") == "0" and torchrun_env().rank == 0
        if found is None or not first:
            return 0
        result = found
    if not result.global_states:
        raise ConfigError(f"no replica finished: see {out}/events.jsonl")
    print(f"{strategy.id} --ft on {args.nodes} replicas, {args.steps} steps, "
          f"{result.wall_s:.1f} s: {out}")
    print("  steps taken part in: " + ", ".join(
        f"replica {r}: {n}" for r, n in sorted(result.trained.items())))
    for r in result.restarts:
        back = "never healed" if r.get("back_s") is None else f"back in {r['back_s']:.2f} s"
        print(f"  replica {r['replica']} died at step {r['died_at_step']}, restarted: {back}")
    summary = result.summary
    if summary.get("samples_per_s"):
        print(f"  throughput {summary['samples_per_s']:,.0f} samples/s, per node sent "
              f"{max(summary['bytes_sent_per_node']) / 1e6:,.2f} MB (max over nodes)")
    print("  final " + ", ".join(f"{k} {v:.4f}" for k, v in summary.get("final", {}).items()))
    return 0
