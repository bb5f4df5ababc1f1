"""The ``exogym`` command line: ``run``, ``compare``, ``sample``, ``strategies``, ``tasks``,
``networks``, ``recost``, ``trace``, ``estimate``.

A thin layer over :class:`exogym.Trainer`, the task registry and the strategy registry: every
strategy hyperparameter is reachable with ``--set KEY=VALUE`` and checked against the strategy's
fields, so a typo is an error, never a silently ignored option. ``run`` under ``torchrun`` runs
as one rank of a multi-process job (:meth:`exogym.Trainer.fit` joins torchrun's group);
``compare`` runs several strategies on one task (:mod:`exogym.lab.compare`); ``sample`` prints text
from a language-model run (:mod:`exogym.lab.sample`); ``recost`` replays a finished run's recorded
collectives on other networks (:mod:`exogym.sim.clock`); ``trace`` writes a finished run's timeline
as a Chrome trace (:mod:`exogym.run.trace`); ``estimate`` is the analytic calculator of
:mod:`exogym.lab.estimate`.

Importing this module imports no torch (only the standard library and torch-free exogym modules):
:func:`main` handles SIGINT / SIGTERM before anything heavy is imported, so a signal in the
seconds torch takes to import ends the command with a message and status 130 too. Everything else
is imported inside the function that needs it.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import math
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from exogym.run.sinks import make_sink
from exogym.utils.config import ConfigError, config_fields
from exogym.utils.signals import InterruptOnSignal, Stopped

if TYPE_CHECKING:
    from torch import nn
    from torch.utils.data import Dataset

    from exogym.run.result import FitResult
    from exogym.sim.network import Network
    from exogym.strategy import Strategy
    from exogym.tasks import Task

__all__ = ["main"]


def get_task(spec: str) -> Task:
    """:func:`exogym.tasks.registry.get_task` (imported on first use: it imports torch)."""
    from exogym.tasks.registry import get_task as get

    return get(spec)


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
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _positive_duration(text: str) -> float:
    from exogym.sim.network import parse_duration

    value = parse_duration(text)
    if not value > 0:
        raise ValueError(f"expected a duration > 0, e.g. 30ms, got {text!r}")
    return value


def _path(text: str) -> Path:
    """A path option; an empty one is an error (``Path("")`` would silently mean the current
    folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return Path(text)


def _eval_samples(text: str) -> int | None:
    if text.strip().lower() == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or 'all', got {text!r}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise ValueError(f"expected an integer >= 0, got {value}")
    return value


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def _offload(text: str) -> str:
    from exogym.run.paging import parse_offload

    parse_offload(text)
    return text


def _argtype(parse):  # type: ignore[no-untyped-def]
    """An argparse ``type`` from a parser that raises ValueError (its message is kept)."""
    def convert(text: str):  # type: ignore[no-untyped-def]
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    convert.__name__ = parse.__name__
    return convert


def _flops(text: str) -> float:
    """``"312T"``, ``"312TFLOPS"``, ``"3.12e14"`` -> FLOP/s (or FLOPs)."""
    from exogym.lab.estimate import parse_count

    raw = text.strip()
    for suffix in ("flop/s", "flops", "flop"):
        if raw.lower().endswith(suffix):
            raw = raw[: -len(suffix)]
            break
    return parse_count(raw)


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {text!r}")
    return value


def _labels(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise ValueError("expected a comma-separated list of strategies, e.g. "
                         f"ddp,diloco,diloco-h10, got {text!r}")
    return items


def _sweep(text: str) -> tuple[str, list[int]]:
    key, sep, values = text.partition("=")
    key = {"H": "H", "nodes": "num_nodes"}.get(key.strip(), "")
    try:
        numbers = [int(v) for v in values.split(",")]
    except ValueError:
        numbers = []
    if not sep or not key or not numbers or min(numbers) < 1:
        raise ValueError(f"expected H=1,10,100 or nodes=2,4,8 (integers >= 1), got {text!r}")
    return key, numbers


def _network(text: str) -> Network:
    """``--network``: :func:`exogym.sim.network.parse_network` (whose error names the closest
    profile to a misspelled one: ``home-100mb`` -> ``home-100mbps``)."""
    from exogym.sim.network import parse_network

    try:
        return parse_network(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (not the usage block): the message, the closest
    option or value where one is close (``--stpes`` -> ``--steps``), and where the help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\nsee `{self.prog} --help`\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as err:
            close = difflib.get_close_matches(str(value), [str(c) for c in action.choices or ()],
                                              n=1)
            if not close:
                raise
            raise argparse.ArgumentError(
                action, f"{err.message} (did you mean {close[0]!r}?)") from None

    def unrecognized(self, extra: Sequence[str]) -> NoReturn:
        """The error for options this parser does not have, naming the closest one of each."""
        options = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        wrong = [t.split("=", 1)[0] for t in extra if t.startswith("--")]
        close = [m[0] for m in (difflib.get_close_matches(w, options, n=1) for w in wrong) if m]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        self.error(f"unrecognized arguments: {' '.join(extra)}{hint}")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (it imports the strategy and task registries, and so torch)."""
    from exogym import strategy as strategies
    from exogym.lab.estimate import DTYPES, STRATEGIES, parse_count
    from exogym.sim.engine import ENGINES
    from exogym.sim.network import parse_duration

    parser = _Parser(
        prog="exogym", description="Simulate distributed training on one machine."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="train a task with a strategy on N simulated nodes")
    run.add_argument("--strategy", default="diloco",
                     help=f"strategy id ({', '.join(strategies.registry())}), or your own: "
                          "path/to/file.py:Class or package.module:Class")
    _add_training_options(run)
    run.add_argument("--participation", metavar="K|C", default=None,
                   help="partial participation: K nodes (an integer) or a fraction C in (0, 1] "
                        "take part in each round (the strategy's H steps), drawn among the nodes "
                        "that are up (fedavg, fedprox, fedopt's, diloco, muloco, sparta_diloco)")
    run.add_argument("--client-state", choices=("fresh", "keep"), default="fresh",
                   help="with --participation: a client's own state (inner optimizer state, "
                        "residuals) starts fresh each round it takes part in (default, as "
                        "Flower: nothing stored per client) or is kept (--client-store)")
    run.add_argument("--concurrency", type=_positive_int, metavar="C", default=None,
                     help="asynchronous strategies (fedbuff, async_local_sgd) over a population "
                          "of --nodes clients: at most C train at once; when the server receives "
                          "an update the next client is drawn among the available ones")
    run.add_argument("--clients-in-memory", choices=("auto", "round", "all"), default="auto",
                     help="with --participation: hold only the round's K clients (round: time "
                          "and memory set by K, a million clients start in seconds) or a row "
                          "per client (all: worlds whose participants fail inside a round); "
                          "auto: round where it applies")
    run.add_argument("--client-store", metavar="SIZE[:DIR]", default="512MB",
                     help="with --client-state keep: host memory for the clients' own state, "
                          "the rest on disk in the run folder's client-store (or DIR); "
                          "default 512MB")
    run.add_argument("--resident", type=_positive_int, metavar="K", default=None,
                     help="at most K nodes' state in memory at once: the nodes compute a group "
                          "of K at a time, the others paged out (--offload); the numbers of "
                          "the run with every node in memory, bit for bit (synchronous "
                          "strategies, loop or threads engine)")
    run.add_argument("--offload", type=_argtype(_offload), default="host",
                     metavar="host|disk[:DIR]",
                     help="with --resident: where the other groups' state lives: host memory "
                          "(default; on a GPU the device holds one group) or files on disk, in "
                          "a temporary folder or DIR (on a CPU, disk is what saves memory)")
    run.add_argument("--seed", type=_argtype(_seed), default=0, help="seed (an integer >= 0)")
    length = run.add_mutually_exclusive_group()
    length.add_argument("--steps", type=_positive_int, help="training steps (default 500)")
    length.add_argument("--epochs", type=_positive_float, help="passes over each node's shard")
    run.add_argument("--lr", type=_positive_float, help="inner learning rate (optim.lr)")
    run.add_argument("--set", dest="overrides", type=_key_value, action="append", default=[],
                     metavar="KEY=VALUE",
                     help="a strategy hyperparameter, e.g. --set H=50 (see `exogym strategies`)")
    run.add_argument("--engine", choices=(*ENGINES, "process"), default="auto",
                     help="loop over nodes, vmap, threads (nodes in CPU worker threads), or "
                          "auto (vmap on CUDA; threads on a multi-core CPU; else loop); "
                          "process: one local worker process per node over torch.distributed "
                          "(gloo on CPU, nccl on CUDA)")
    run.add_argument("--eval-interval", type=_positive_int,
                     help="steps between evaluations of the global model")
    run.add_argument("--log-interval", type=_positive_int, default=10,
                     help="steps between metrics rows")
    run.add_argument("--out", type=_path,
                     help="run folder (default: runs/TASK-STRATEGY-nN-TIME)")
    run.add_argument("--checkpoint-every", type=_positive_int, metavar="K",
                     help="write a checkpoint every K steps and at the end (RUN/checkpoints/); "
                          "Ctrl-C writes one anyway")
    run.add_argument("--checkpoint-interval", type=_argtype(_positive_duration), metavar="TIME",
                     help="and/or one every TIME of wall clock, e.g. 10min")
    run.add_argument("--keep-checkpoints", type=_positive_int, default=2, metavar="K",
                     help="complete checkpoints kept, the newest (default 2)")
    run.add_argument("--sync-checkpoints", action="store_true",
                     help="write checkpoints while training waits (default: copied to memory, "
                          "then written in the background)")
    run.add_argument("--resume", type=_path, metavar="RUN_DIR",
                     help="continue RUN_DIR from its newest usable checkpoint, exactly as if it "
                          "had never stopped (--steps may extend it)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--trace", action="store_true",
                     help="also write the run's timeline as a Chrome trace, RUN_DIR/trace.json "
                          "(open it in https://ui.perfetto.dev); with --engine process also "
                          "trace_real.json, the real processes on the wall clock")
    run.add_argument("--csv", action="store_true", help="also write metrics.csv in the run folder")
    run.add_argument("--tensorboard", action="store_true",
                     help="also write TensorBoard events to RUN_DIR/tensorboard "
                          '(pip install "exogym[tensorboard]")')
    run.add_argument("--wandb", metavar="[ENTITY/]PROJECT[:MODE]",
                     help="also log to Weights & Biases; MODE online, offline (upload later: "
                          'wandb sync RUN_DIR/wandb/offline-run-*) or disabled (pip install '
                          '"exogym[wandb]")')
    compute = run.add_mutually_exclusive_group()
    compute.add_argument("--step-time", type=_argtype(_positive_duration), metavar="TIME",
                         help="compute per step per node for the clock, e.g. 1.5s "
                              "(default: measured from the run's own training steps)")
    compute.add_argument("--flops-per-sample", type=_argtype(_flops), metavar="FLOPS",
                         help="training FLOPs per sample (with --device-flops), about "
                              "6 x params x tokens for a transformer")
    run.add_argument("--device-flops", type=_argtype(_flops), metavar="FLOP/S",
                     help="FLOP/s of the simulated device, e.g. 312T")

    cmp = sub.add_parser(
        "compare", help="train several strategies on one task from the same seeds, one table",
        description="Train each strategy on the task from the same seeds and write results.md "
                    "(final eval, steps to a target loss, bytes per node, simulated time), "
                    "results.json, three plots and every run's folder.")
    cmp.add_argument("--strategies", type=_argtype(_labels),
                     default=["ddp", "fedavg", "diloco", "sparta", "demo"],
                     metavar="LABEL,LABEL,...",
                     help="comma-separated labels: ID or ID-NAME to list a strategy twice, e.g. "
                          "ddp,diloco,diloco-h10; your own as path/file.py:Class[-NAME] or "
                          "module:Class[-NAME], labelled by its id (the class name) "
                          "(default ddp,fedavg,diloco,sparta,demo)")
    _add_training_options(cmp)
    cmp.add_argument("--trace", action="store_true",
                     help="every run also writes its timeline as a Chrome trace (trace.json), "
                          "linked from results.md")
    cmp.add_argument("--seed", type=_argtype(_seed), default=0,
                     help="the first seed, an integer >= 0 (default 0)")
    cmp.add_argument("--steps", type=_positive_int, default=500,
                     help="training steps of every run (default 500)")
    cmp.add_argument("--repeats", type=_positive_int, default=1,
                     help="seeds per strategy: SEED..SEED+K-1; the table shows mean ± sample "
                          "std (default 1)")
    cmp.add_argument("--target-loss", type=_argtype(_finite),
                     help="eval loss of 'steps to target' (default: the worst final eval loss "
                          "over all runs)")
    cmp.add_argument("--set", dest="overrides", type=_key_value, action="append", default=[],
                     metavar="[LABEL.]KEY=VALUE",
                     help="a strategy setting: diloco.H=50 for one label, optim.lr=2e-3 for "
                          "every strategy (keys: `exogym strategies`)")
    cmp.add_argument("--eval-interval", type=_positive_int,
                     help="steps between evaluations (default: the task's, at most steps/10)")
    cmp.add_argument("--step-time", type=_argtype(_positive_duration), metavar="TIME",
                     help="compute per step per node for the clock, e.g. 30ms (default: "
                          "measured from each run's own training steps)")
    cmp.add_argument("--out", type=_path,
                     help="results folder, must not exist (default runs/compare-TASK-TIME)")
    cmp.add_argument("--no-progress", action="store_true", help="no per-run lines and bars")

    swp = sub.add_parser(
        "sweep", help="one strategy over a grid of settings, with repeats; resumable",
        description="Train the strategy at every combination of the --grid axes (strategy "
                    "keys, nodes, network), REPEATS seeds each; write results.md / results.json "
                    "(mean ± std per point, the best), sweep.png and every run's folder. Run it "
                    "again with the same --out to continue: finished runs are not retrained.")
    swp.add_argument("--task", default="mnist",
                     help="task id or path/to/file.py:NAME (default mnist)")
    swp.add_argument("--strategy", default="diloco",
                     help="strategy id or path/to/file.py:Class (default diloco)")
    swp.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                     required=True,
                     help="an axis: a strategy key (H=10,50,100), nodes=2,4,8 or "
                          "network=datacenter,home-100mbps; repeat for more axes")
    swp.add_argument("--set", dest="overrides", type=_key_value, action="append", default=[],
                     metavar="KEY=VALUE", help="a fixed strategy setting for every point")
    swp.add_argument("--nodes", type=_positive_int, default=4, help="N, unless swept (default 4)")
    swp.add_argument("--steps", type=_positive_int, default=500,
                     help="training steps of every run (default 500)")
    swp.add_argument("--repeats", type=_positive_int, default=1,
                     help="seeds per point: SEED..SEED+K-1 (default 1)")
    swp.add_argument("--seed", type=_argtype(_seed), default=0, help="the first seed (default 0)")
    swp.add_argument("--network", type=_network, default="datacenter",
                     help="simulated network, unless swept (default datacenter)")
    swp.add_argument("--step-time", type=_argtype(_positive_duration), metavar="TIME",
                     help="compute per step per node for the clock (default: measured)")
    swp.add_argument("--eval-samples", type=_eval_samples, default=2000, metavar="K|all",
                     help="samples of each evaluation during training (default 2000)")
    swp.add_argument("--data-dir", type=_path,
                     help="data folder (default: $EXOGYM_DATA_DIR, else ~/.cache/exogym/data)")
    swp.add_argument("--no-download", action="store_true",
                     help="fail instead of downloading missing data")
    swp.add_argument("--out", type=_path,
                     help="results folder: new, or a sweep to continue (default "
                          "runs/sweep-STRATEGY-TIME)")
    swp.add_argument("--no-progress", action="store_true", help="no per-run lines and bars")

    bch = sub.add_parser(
        "bench", help="a fixed benchmark suite (gym-v0): every strategy scored the same way, "
                      "a leaderboard",
        description="Train the strategies on every track of the suite (task, nodes, network, "
                    "budget and the clock's compute per step all fixed by the suite id) and "
                    "write leaderboard.md / leaderboard.json and each track's comparison.")
    bch.add_argument("--suite", default="gym-v0", help="suite id (default gym-v0)")
    bch.add_argument("--strategies", type=_argtype(_labels), required=True,
                     metavar="LABEL,LABEL,...",
                     help="labels as in compare: ID, ID-NAME, path/file.py:Class[-NAME]")
    bch.add_argument("--tracks", type=_argtype(_labels), metavar="NAME,...",
                     help="only these tracks of the suite (default: all)")
    bch.add_argument("--set", dest="overrides", type=_key_value, action="append", default=[],
                     metavar="[LABEL.]KEY=VALUE", help="strategy settings, as in compare")
    bch.add_argument("--repeats", type=_positive_int, default=1, help="seeds (default 1)")
    bch.add_argument("--seed", type=_argtype(_seed), default=0, help="the first seed (default 0)")
    bch.add_argument("--data-dir", type=_path,
                     help="data folder (default: $EXOGYM_DATA_DIR, else ~/.cache/exogym/data)")
    bch.add_argument("--no-download", action="store_true",
                     help="fail instead of downloading missing data")
    bch.add_argument("--out", type=_path, help="results folder (default runs/bench-SUITE-TIME)")
    bch.add_argument("--no-progress", action="store_true", help="no per-run lines and bars")

    smp = sub.add_parser("sample", help="text generated by a trained language-model run")
    smp.add_argument("run_dir", type=_path, metavar="RUN_DIR",
                     help="a shakespeare-char-gpt-* run folder (it has model.pt)")
    smp.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    smp.add_argument("--tokens", type=_positive_int, default=500,
                     help="characters to generate (default 500)")
    smp.add_argument("--temperature", type=_positive_float, default=0.8,
                     help="sampling temperature (default 0.8)")
    smp.add_argument("--top-k", type=_positive_int, default=200,
                     help="sample among the K most likely characters (default 200)")
    smp.add_argument("--seed", type=int, default=0)
    smp.add_argument("--data-dir", type=_path,
                     help="data folder (default: $EXOGYM_DATA_DIR or ~/.cache/exogym/data)")
    smp.add_argument("--no-download", action="store_true",
                     help="fail instead of downloading missing data")

    strat = sub.add_parser("strategies",
                           help="list strategies with their hyperparameters and defaults")
    strat.add_argument("ids", nargs="*", metavar="ID",
                       help="show only these strategies (default: every registered one)")
    sub.add_parser("tasks", help="list benchmark tasks")
    sub.add_parser("networks", help="list the named network profiles")

    chk = sub.add_parser("check", help="conformance checks of a strategy (yours: FILE.py:Class), "
                                       "a pass/fail table; exit 1 on a failure")
    chk.add_argument("strategies", nargs="+", metavar="STRATEGY",
                     help="registry ids, path/to/file.py:Class or package.module:Class")
    chk.add_argument("--set", dest="overrides", type=_key_value, action="append", default=None,
                     metavar="KEY=VALUE",
                     help="a hyperparameter for the checks' 6-step runs (default: H=2 where the "
                          "strategy has an H, so that it synchronises)")
    chk.add_argument("--no-processes", action="store_true",
                     help="skip the check against 2 real processes (the slowest)")

    recost = sub.add_parser("recost", help="simulated time of a finished run on other networks")
    recost.add_argument("run_dir", type=_path, metavar="RUN_DIR", help="a run folder")
    recost.add_argument("--network", action="append", type=_network,
                        help="a network (repeatable; default: every profile)")
    recost.add_argument("--step-time", type=_argtype(_positive_duration), metavar="TIME",
                        help="re-cost with this compute per step instead of the recorded one")

    trc = sub.add_parser(
        "trace", help="a finished run's timeline as a Chrome trace (Perfetto, chrome://tracing)",
        description="Replay a finished run's simulated clock with span recording on and write "
                    "its timeline (every node's compute, collectives, waits, down time, the "
                    "world's events) as a Chrome trace; open it in https://ui.perfetto.dev.")
    trc.add_argument("run_dir", type=_path, metavar="RUN_DIR", help="a run folder")
    trc.add_argument("-o", "--output", type=_path, metavar="FILE",
                     help="where to write it (default RUN_DIR/trace.json)")

    est = sub.add_parser(
        "estimate", help="analytic training time, bytes and utilization (no training)",
        description="Defaults are the EXO Gym post's example: a 7B fp16 model, 1,000 one-minute "
                    "batches on 2 nodes, in a data centre and over 100 Mbit/s home internet, DDP "
                    "and DiLoCo H=500.")
    est.add_argument("--params", type=_argtype(parse_count), default=7e9,
                     help="model parameters, e.g. 7e9, 7B, 124M (default 7e9)")
    est.add_argument("--dtype", choices=list(DTYPES), default="fp16",
                     help="parameter dtype on the wire (default fp16)")
    est.add_argument("--codec", help="transport codec, e.g. int8, fp4, topk:0.01 (default none)")
    est.add_argument("--nodes", type=_positive_int, default=2, help="nodes N (default 2)")
    work = est.add_mutually_exclusive_group()
    work.add_argument("--batches", type=_positive_int, help="batches in all (default 1000)")
    work.add_argument("--steps", type=_positive_int, help="steps per node (batches = steps x N)")
    est.add_argument("--compute-time", type=_argtype(parse_duration), default=60.0,
                     metavar="TIME", help="compute per batch on one node (default 1min)")
    est.add_argument("--network", action="append", type=_network,
                     help="a network (repeatable; default: datacenter and home-100mbps)")
    est.add_argument("--strategy", action="append", choices=STRATEGIES,
                     help="repeatable (default: ddp and diloco)")
    est.add_argument("--H", type=_positive_int, default=500,
                     help="steps between syncs of diloco/fedavg (default 500)")
    est.add_argument("--sync-time", action="append", default=[], metavar="[NETWORK=]TIME",
                     help="give the send-once sync time instead of computing it, for every "
                          "network or one (e.g. home-100mbps=20min, the EXO Gym post's "
                          "rounding)")
    est.add_argument("--sweep", type=_argtype(_sweep), metavar="H=1,10,100 | nodes=2,4,8",
                     help="a table of training time against H or the number of nodes")
    est.add_argument("--plot", type=_path, metavar="FILE.png",
                     help="write a plot (PNG)")
    _add_calibrate_parser(sub)
    return parser


def _add_training_options(p: argparse.ArgumentParser) -> None:
    """The options of how every run trains, shared by ``run`` and ``compare``."""
    from exogym.sim.engine import PRECISIONS
    from exogym.sim.partition import parse_partition
    from exogym.sim.world import parse_world
    from exogym.tasks.registry import TASKS

    p.add_argument("--task", default="mnist",
                   help=f"task id ({', '.join(TASKS)}), or your own: path/to/file.py:NAME or "
                        "package.module:NAME, a Task or a function returning one")
    p.add_argument("--nodes", type=_positive_int, default=4, help="simulated nodes N (default 4)")
    p.add_argument("--batch-size", type=_positive_int,
                   help="batch size per node (default: the task's)")
    p.add_argument("--partition", type=_argtype(parse_partition), default="iid",
                   metavar="iid|dirichlet:ALPHA|contiguous",
                   help="how the training set is split among the nodes: iid (default), "
                        "dirichlet:ALPHA label skew (0.1: few classes per node), contiguous "
                        "blocks (text: each node its own span)")
    p.add_argument("--micro-batch-size", type=_positive_int, metavar="M",
                   help="split each node's batch into micro-batches of M rows and accumulate "
                        "their gradients (less activation memory, the same gradient for a "
                        "mean loss)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="bf16: forward passes under bfloat16 autocast (weights, gradients, "
                        "optimizer state and evaluation stay fp32)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    p.add_argument("--network", type=_network, default="datacenter",
                   help="simulated network: a profile (see `exogym networks`) or key=value "
                        "items, e.g. bw=1Gbps,latency=5ms (default datacenter)")
    p.add_argument("--world", type=_argtype(parse_world), default=None, metavar="SPEC",
                   help="the world the nodes train in: speed=1:1:0.5:0.25, mtbf=30min,"
                        "mttr=5min, fail=NODE@STEP|TIME, rejoin=NODE@..., drop=0.05, "
                        "min_nodes=K, seed=S, trace:FILE.json (default: perfect)")
    p.add_argument("--data-dir", type=_path,
                   help="data folder (default: $EXOGYM_DATA_DIR, else ~/.cache/exogym/data)")
    p.add_argument("--no-download", action="store_true",
                   help="fail instead of downloading missing data")
    p.add_argument("--eval-samples", type=_eval_samples, default=2000, metavar="K|all",
                   help="evaluations during training use a fixed random subset of K samples of "
                        "the evaluation set, the final one the whole set (default 2000; all: "
                        "the whole set every time)")
    p.add_argument("--allow-nonfinite", action="store_true",
                   help="train on when a loss turns NaN or infinite (default: stop with an "
                        "error naming the step and the nodes)")
    p.add_argument("--allow-unsynced", action="store_true",
                   help="allow a run shorter than a strategy's H (its global model is then never "
                        "fully updated; default: an error)")


def cmd_run(args: argparse.Namespace) -> int:
    """``exogym run``: train one strategy on one task and print the run's summary (rank 0 only
    under torchrun); ``--resume`` continues a recorded run instead (:func:`_resume_run`).

    Every option that can be checked is checked before the data loads (which may download):
    the task, the sinks, the strategy and its settings, the output folder, the network and
    world against ``--nodes``, the memory and the run's length against the strategy's period.
    """
    import torch

    from exogym import strategy as strategies
    from exogym.run.dist import torchrun_env
    from exogym.run.result import check_out_dir

    if args.resume is not None:
        return _resume_run(args)
    task = get_task(args.task)
    sink_specs = _sink_specs(args)
    sinks = [make_sink(spec) for spec in sink_specs]  # fails before the data loads
    strategy = strategies.make(args.strategy, **_run_overrides(args, task.lr))
    out = args.out if args.out is not None else _default_out(
        f"{args.task}-{args.strategy}-n{args.nodes}")
    ranks = torchrun_env()
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


def _check_run(args: argparse.Namespace, strategy: Strategy, model: nn.Module, *,
               under_torchrun: bool) -> None:
    """Check, before the data loads, that the nodes' copies fit the device's memory (in one
    process, not under torchrun) and that the run is at least one period ``H`` of the strategy
    long (unless ``--allow-unsynced``).

    Raises:
        ConfigError: a run shorter than ``H``; the memory check's error when the copies do not
            fit.
    """
    from exogym.run.paging import in_memory_nodes
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


def _run_fit_args(args: argparse.Namespace, task: Task, out: Path, sinks: list[Any],
                  sink_specs: list[str], train: Dataset) -> dict[str, Any]:
    """The keyword arguments of :meth:`exogym.Trainer.fit` (and of
    :func:`exogym.run.launch.fit_processes`) that ``exogym run``'s options give, the task's
    defaults filled in; the strategy, the nodes, the engine and the device are not among them.
    """
    return dict(
        batch_size=args.batch_size or task.batch_size,
        partition=args.partition,
        eval_interval=args.eval_interval or task.eval_interval,
        log_interval=args.log_interval,
        seed=args.seed,
        out_dir=out,
        progress=not args.no_progress,
        sinks=sinks,
        network=args.network,
        world=args.world,
        participation=args.participation,
        client_state=args.client_state,
        concurrency=args.concurrency,
        clients_in_memory=args.clients_in_memory,
        client_store=args.client_store,
        resident=args.resident,
        offload=args.offload,
        step_time=args.step_time,
        flops_per_sample=args.flops_per_sample,
        device_flops=args.device_flops,
        micro_batch_size=args.micro_batch_size,
        precision=args.precision,
        eval_samples=args.eval_samples,
        allow_nonfinite=args.allow_nonfinite,
        allow_unsynced=args.allow_unsynced,
        trace=args.trace,
        run_info={**task.run_info(train), "sinks": sink_specs,
                  "launcher": "process" if args.engine == "process" else None},
        **({"num_epochs": args.epochs} if args.epochs else {"max_steps": args.steps or 500}),
        **_checkpoint_args(args),
    )


def _fit_run(args: argparse.Namespace, model: nn.Module, train: Dataset, test: Dataset,
             strategy: Strategy, fit_args: dict[str, Any], *, under_torchrun: bool) -> FitResult:
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


def _checkpoint_args(args: argparse.Namespace) -> dict[str, Any]:
    return {"checkpoint_every": args.checkpoint_every,
            "checkpoint_interval": args.checkpoint_interval,
            "keep_checkpoints": args.keep_checkpoints,
            "async_checkpoint": not args.sync_checkpoints}


# Options that --resume may be given with: where the data is, how to show progress, how to keep
# writing checkpoints, and --steps to extend the run. Everything else is the recorded run's.
_RESUME_OPTIONS = {"resume", "steps", "data_dir", "no_download", "no_progress",
                   "checkpoint_every", "checkpoint_interval", "keep_checkpoints",
                   "sync_checkpoints", "trace", "command"}


def _resume_run(args: argparse.Namespace) -> int:
    """``exogym run --resume RUN_DIR``: rebuild the recorded run (task, data, sinks) and
    continue it from its newest usable checkpoint."""
    import torch

    from exogym.run.dist import torchrun_env
    from exogym.run.result import read_json
    from exogym.run.trainer import Trainer

    defaults = vars(build_parser().parse_args(["run"]))
    changed = sorted(f"--{k.replace('_', '-')}" for k, v in vars(args).items()
                     if k not in _RESUME_OPTIONS and v != defaults.get(k))
    if changed:
        raise ConfigError("--resume continues the run as it was recorded; drop "
                          f"{', '.join(changed)} (allowed with --resume: --steps to extend it, "
                          "--data-dir, --no-download, --no-progress, --trace and the "
                          "checkpoint options)")
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
    fit_args: dict[str, Any] = dict(resume=args.resume, progress=not args.no_progress,
                                    sinks=sinks, trace=args.trace)
    fresh = _checkpoint_args(build_parser().parse_args(["run"]))
    # the recorded checkpoint settings go on, unless an option here changes one
    fit_args.update({k: v for k, v in _checkpoint_args(args).items() if v != fresh[k]})
    if args.steps is not None:
        fit_args["max_steps"] = args.steps
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


def cmd_sample(args: argparse.Namespace) -> int:
    from exogym.lab.sample import sample

    print(sample(args.run_dir, prompt=args.prompt, max_new_tokens=args.tokens,
                 temperature=args.temperature, top_k=args.top_k, seed=args.seed,
                 data_dir=args.data_dir, download=not args.no_download))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """``exogym compare``: print the table and where the results were written."""
    from exogym.lab.compare import compare
    from exogym.lab.report import format_table

    out = args.out or _default_out(f"compare-{get_task(args.task).id}")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="plots not drawn")  # printed below instead
        c = compare(
            args.task, args.strategies, num_nodes=args.nodes, max_steps=args.steps,
            out_dir=out, network=args.network, repeats=args.repeats, seed=args.seed,
            target_loss=args.target_loss, batch_size=args.batch_size,
            partition=args.partition, micro_batch_size=args.micro_batch_size,
            precision=args.precision, eval_interval=args.eval_interval,
            overrides=args.overrides, step_time=args.step_time, device=args.device,
            data_dir=args.data_dir, download=not args.no_download, progress=not args.no_progress,
            eval_samples=args.eval_samples, allow_unsynced=args.allow_unsynced,
            allow_nonfinite=args.allow_nonfinite, world=args.world, trace=args.trace)
    print("\n".join(format_table(c)))
    if c.plot_note:
        print(f"exogym: {c.plot_note}")
    print(f"written to  {c.out_dir}  (results.md, results.json"
          + "".join(f", {p.name}" for p in c.plots) + ", runs/)")
    return 0


def _default_out(name: str) -> Path:
    """``runs/NAME-TIME``, with ``-2``, ``-3``, ... appended while that exists."""
    base = Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out, k = base, 1
    while out.exists():
        k += 1
        out = base.with_name(f"{base.name}-{k}")
    return out


def cmd_strategies(ids: Sequence[str]) -> int:
    """The settings every strategy shares, once; then each strategy's own (and any shared one
    whose default it changes)."""
    from exogym import strategy as strategies

    chosen = list(ids) or strategies.registry()
    classes = {sid: strategies.get(sid) for sid in chosen}  # an unknown id: error, listing all
    common = config_fields(strategies.Strategy)

    def show(spec: dict[str, tuple[object, object, str]], keys: list[str]) -> None:
        width = max(len(k) for k in keys)
        for key in keys:
            _tp, default, help_text = spec[key]
            print(f"    {key:<{width}}  = {default!r:<14} {help_text.replace('``', '')}")

    print("shared by every strategy (--set KEY=VALUE):")
    show(common, list(common))
    for sid, cls in classes.items():
        print()
        print(f"{sid}  ({cls.__name__}): {_summary_line(cls)}")
        spec = strategies.describe(sid)
        own = [k for k in spec if k not in common or spec[k][1] != common[k][1]]
        if own:
            show(spec, own)
        else:
            print("    (only the shared settings)")
    return 0


def _summary_line(cls: type) -> str:
    """The first line of the strategy's module docstring (a built-in's names its paper), else of
    its class's own docstring (not the signature a dataclass makes up), else a placeholder."""
    own = cls.__dict__.get("__doc__") or ""
    if own.startswith(f"{cls.__name__}("):  # dataclasses' generated ``Name(field=..., ...)``
        own = ""
    for doc in (sys.modules[cls.__module__].__doc__, own):
        lines = (doc or "").strip().splitlines()
        if lines:
            return lines[0]
    return "(no docstring)"


def cmd_networks() -> int:
    from exogym.sim.network import PROFILES

    for net in PROFILES.values():
        print(f"{net.name:<13} {net.describe()}")
        print(f"{'':<13} {net.description}")
    print("custom: --network bw=1Gbps,latency=5ms (keys: bw, up, down, latency, all_reduce, "
          "all_gather, broadcast, node_bw, node_up, node_down, node_speed, bw_sigma, "
          "speed_sigma, seed); a profile plus changes: --network home-100mbps,latency=50ms")
    print("measured: exogym calibrate --out mynet.json (torchrun, or --engine process), then "
          "--network mynet.json (or mynet.json,latency=20ms)")
    return 0


def cmd_recost(args: argparse.Namespace) -> int:
    from exogym.run.result import read_json
    from exogym.sim.clock import ClockTrace
    from exogym.sim.network import PROFILES, format_duration, parse_network

    path = args.run_dir / "summary.json"
    summary = read_json(path, "RUN_DIR must be a finished run's folder")
    if not summary.get("clock"):
        raise ValueError(f"{args.run_dir} has no simulated clock (it ran without a network)")
    try:
        trace = ClockTrace.from_dict(summary["clock"]["trace"])
        ran_on = parse_network(summary["network"]["spec"])
        strategy_id = summary["strategy"]
        sent = max(summary["bytes_sent_per_node"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path} is not a complete exogym run summary ({type(err).__name__}: "
                         f"{err})") from None
    step = args.step_time
    if step is not None and trace.not_recostable is not None:  # who took part would change too
        raise ValueError(f"this run cannot be re-costed with another compute time per step: "
                         f"{trace.not_recostable}; train it again with --step-time {step:g}s")
    # the run's own network, re-costed too (with --step-time the recorded report would not compare)
    ran = trace.cost(ran_on, step)
    networks: list[Network] = args.network or [
        net for net in PROFILES.values() if net.spec() != ran.network_spec]
    if not args.network and trace.not_recostable is not None:
        raise ValueError(f"this run cannot be re-costed on another network: "
                         f"{trace.not_recostable}; train it again with --network NAME on each "
                         "network to compare")
    for net in networks:  # before any output; FitResult.recost refuses the same
        if net.spec() != ran_on.spec():
            trace.check_recostable(net)
    print(f"run       {args.run_dir}: {strategy_id}, {trace.num_nodes} nodes, "
          f"{trace.steps:,} steps, {len(trace.records):,} collectives, "
          f"{_bytes(sent)} sent per node")
    print(f"compute   {format_duration(step or trace.step_time_s)} per step per node "
          f"({'given' if step else trace.compute_source})")
    rows = [["network", "total", "compute", "comm", "idle", "utilization", "vs the run"]]
    reports = [(f"{ran.network} (the run)", ran)] + [
        (net.name, trace.cost(net, step)) for net in networks]
    for name, r in reports:
        rows.append([name, format_duration(r.total_s), format_duration(r.compute_s),
                     format_duration(r.comm_s), format_duration(r.idle_s),
                     f"{100 * r.utilization:.1f}%", f"{r.total_s / ran.total_s:.3g}x"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    """``exogym trace RUN_DIR [-o FILE]``: the run's timeline rebuilt from its folder (its clock
    replayed, :func:`exogym.run.trace.rebuild`); an asynchronous run's is the one it recorded
    while it trained (``--trace``), copied to ``FILE``."""
    import shutil

    from exogym.run.result import check_writable
    from exogym.run.trace import TRACE_FILE, NotReplayable, rebuild, write_trace

    out = args.output if args.output is not None else args.run_dir / TRACE_FILE
    check_writable(out, "trace")
    recorded = args.run_dir / TRACE_FILE
    try:
        trace = rebuild(args.run_dir)
    except NotReplayable:
        if not recorded.exists():
            raise
        if out.resolve() != recorded.resolve():
            shutil.copyfile(recorded, out)
        print(f"{out}: the trace this asynchronous run recorded while it trained")
        return 0
    write_trace(trace, out)
    meta = trace["otherData"]["exogym"]
    print(f"{out}: {meta['strategy']}, {meta['num_nodes']} nodes, {meta['steps']:,} steps, "
          f"{len(trace['traceEvents']):,} events (detail: {trace['otherData']['detail']}); "
          "open it in https://ui.perfetto.dev or chrome://tracing")
    return 0


def _bytes(n: float) -> str:
    from exogym.lab.estimate import format_bytes

    return format_bytes(n)


def cmd_estimate(args: argparse.Namespace) -> int:
    from exogym import estimate as est
    from exogym.sim.network import PROFILES, parse_duration

    if args.plot:
        from exogym.lab.plots import require_matplotlib
        from exogym.run.result import check_writable

        require_matplotlib()  # before any output
        check_writable(args.plot, "plot file")
    networks: list[Network] = args.network or [PROFILES["datacenter"], PROFILES["home-100mbps"]]
    strategies_: list[str] = args.strategy or ["ddp", "diloco"]
    given: dict[str, float] = {}
    for item in args.sync_time:
        where, _, value = item.rpartition("=")
        given[where.strip()] = parse_duration(value)
    names = {net.name for net in networks} | {"", *PROFILES}
    unknown = set(given) - names
    if unknown:
        raise ValueError(f"--sync-time names network {sorted(unknown)[0]!r}, which is not one of "
                         f"the --network values ({', '.join(n.name for n in networks)})")
    batches = args.batches or (args.steps * args.nodes if args.steps else 1000)
    common = {"params": args.params, "dtype": args.dtype, "codec": args.codec,
              "batches": batches, "compute_s": args.compute_time}

    def sync_for(net: Network) -> float | None:
        return given.get(net.name, given.get(""))

    if args.sweep is not None:
        key, values = args.sweep
        strategy = strategies_[-1]
        results = {net.name: est.sweep(key, values, **common, network=net, strategy=strategy,
                                       num_nodes=args.nodes, H=None if strategy == "ddp" else
                                       args.H, sync_time_s=sync_for(net))
                   for net in networks}
        print(est.format_sweep(key, values, results))
        if args.plot:
            est.plot_estimates(str(args.plot), key, values, results)
            print(f"plot      {args.plot}")
        return 0
    rows = [est.estimate(**common, strategy="single")]
    for strategy in strategies_:
        for net in networks:
            rows.append(est.estimate(**common, num_nodes=args.nodes, network=net,
                                     strategy=strategy, H=None if strategy == "ddp" else args.H,
                                     sync_time_s=sync_for(net)))
    print(est.format_estimates(rows, params=args.params, dtype=args.dtype, codec=args.codec,
                               batches=batches, compute_s=args.compute_time))
    if args.plot:
        est.plot_estimates(str(args.plot), None, [], {"": rows})
        print(f"plot      {args.plot}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """``exogym bench``: print the leaderboard and where it was written."""
    from exogym.lab.bench import bench, format_leaderboard

    out = args.out or _default_out(f"bench-{args.suite}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # each comparison's results.md keeps its runs' warnings
        board = bench(args.suite, args.strategies, out_dir=out, tracks=args.tracks,
                      overrides=dict(args.overrides), repeats=args.repeats, seed=args.seed,
                      data_dir=args.data_dir, download=not args.no_download,
                      progress=not args.no_progress)
    print(format_leaderboard(board).rstrip())
    print(f"\nwritten to  {out}  (leaderboard.md, leaderboard.json, one folder per track)")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """``exogym sweep``: print the results table and where it was written."""
    from exogym.lab.sweep import parse_grid, sweep

    grid = parse_grid(args.grid)
    name = args.strategy.rpartition(":")[2] if ":" in args.strategy else args.strategy
    out = args.out or _default_out(f"sweep-{name}")
    result = sweep(args.task, args.strategy, grid, out_dir=out, num_nodes=args.nodes,
                   max_steps=args.steps, repeats=args.repeats, seed=args.seed,
                   network=args.network, overrides=dict(args.overrides),
                   step_time=args.step_time, eval_samples=args.eval_samples,
                   data_dir=args.data_dir, download=not args.no_download,
                   progress=not args.no_progress)
    print((out / "results.md").read_text(encoding="utf-8").rstrip())
    print(f"\ntrained {result.trained} run(s), read {result.reused} finished one(s); written "
          f"to {out}  (results.md, results.json" + (", sweep.png" if result.plot else "")
          + ", runs/)")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """``exogym check``: every check against each strategy; 1 if any failed."""
    from exogym.lab.check import check_strategy, render

    failed = False
    for spec in args.strategies:
        overrides = dict(args.overrides) if args.overrides is not None else None
        results = check_strategy(spec, overrides, processes=not args.no_processes)
        print(render(spec, results), flush=True)
        failed |= any(r.passed is False for r in results)
    return 1 if failed else 0


def cmd_tasks() -> int:
    from exogym.tasks.registry import TASKS, plugin_tasks

    for task in TASKS.values():
        print(f"{task.id}: {task.description} (batch {task.batch_size}/node, lr {task.lr})")
    for name, entry in plugin_tasks().items():  # installed packages' (entry points)
        task = get_task(name)
        print(f"{name}: {task.description} (batch {task.batch_size}/node, lr {task.lr}; "
              f"installed, {entry})")
    return 0


def _attach_negative_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--step-time -1s`` -> ``--step-time=-1s``: argparse takes a value that starts with ``-``
    and is not a plain negative number for an option and says "expected one argument"; joined,
    the value reaches its own check, which says what is wrong with it."""
    takes_value: set[str] = set()
    parsers = [parser]
    while parsers:
        p = parsers.pop()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
            elif action.option_strings and action.nargs is None and not isinstance(
                    action, (argparse._StoreConstAction, argparse._StoreTrueAction,
                             argparse._StoreFalseAction, argparse._CountAction)):
                takes_value.update(action.option_strings)
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if token in takes_value and len(nxt) > 1 and nxt[0] == "-" and (
                nxt[1].isdigit() or nxt[1] == "."):
            out.append(f"{token}={nxt}")
            i += 2
            continue
        out.append(token)
        i += 1
    return out


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None) -> None:
    """A warning as one line, ``exogym: warning: MESSAGE`` (not Python's ``FILE:LINE:
    CATEGORY: MESSAGE`` and the source line): the command line's user did not write the code
    that warns."""
    print(f"exogym: warning: {message}", file=file if file is not None else sys.stderr)


@contextmanager
def _cli_process() -> Iterator[None]:
    """What the command line sets for its process, restored on exit (``main`` may run inside
    another program, a test): SIGINT / SIGTERM raising :class:`exogym.utils.signals.Stopped`
    wherever no training loop handles them (first, before anything else runs), and one-line
    warnings."""
    with InterruptOnSignal():
        shown = warnings.showwarning
        warnings.showwarning = _show_warning
        try:
            yield
        finally:
            warnings.showwarning = shown


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments; an unknown option is an error of its subcommand's parser (which knows the
    options to suggest), not of ``exogym``'s."""
    parser = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(_attach_negative_values(parser, raw))
    if extra:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.command].unrecognized(extra)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """``exogym``'s entry point: the exit status (0, 1 a failed run or check, 2 bad usage, 130
    stopped by a signal).

    The signal handling is the first thing it does, before torch is imported (by
    :func:`_main`), so that a SIGTERM at any moment after it ends the command with one line and
    130, never silently (143)."""
    with _cli_process():
        try:
            return _main(argv)
        except Stopped as err:  # a signal while no training loop ran: nothing to checkpoint
            print(f"exogym: {err.signal.name}: stopped (no training step was running, nothing "
                  "to checkpoint)", file=sys.stderr)
            return 130


def _main(argv: Sequence[str] | None) -> int:
    """Parse, run the command, and turn the errors users cause into one line and a status; a
    signal (:class:`Stopped`) is left to :func:`main`."""
    # torch comes with these: imported here, after main's signal handling (a signal during the
    # import raises Stopped, for main), and before the try whose handlers name them
    from exogym.run.checkpoint import CheckpointError
    from exogym.run.result import NonFiniteLossError
    from exogym.run.state import RunInterrupted
    from exogym.tasks.data.download import ChecksumError, DatasetNotFoundError

    try:
        args = _parse(argv)
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        return _COMMANDS[args.command](args)
    except NonFiniteLossError as err:  # training ran and diverged: a failed run, not bad usage
        print(f"exogym: error: {err}", file=sys.stderr)
        return 1
    except (ConfigError, DatasetNotFoundError, ChecksumError, FileExistsError,
            FileNotFoundError, ValueError, ImportError, MemoryError, CheckpointError) as err:
        print(f"exogym: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `exogym strategies | head` (before OSError: it is one)
        sys.stdout = None  # type: ignore[assignment]
        return 0
    except OSError as err:  # a path that cannot be written or read: one line naming it
        where = f"{err.filename}: " if err.filename else ""
        print(f"exogym: error: {where}{err.strerror or err}", file=sys.stderr)
        return 2
    except RunInterrupted as err:  # stopped cleanly: says where the checkpoint is
        print(f"exogym: {err}", file=sys.stderr)
        return 130
    except Stopped:  # for main, which handles one before this function's imports too
        raise
    except KeyboardInterrupt:  # a second signal during training: aborted at once
        print("exogym: interrupted", file=sys.stderr)
        return 130


# -- exogym calibrate ---------------------------------------------------------------------------
def _add_calibrate_parser(sub: Any) -> None:
    """``exogym calibrate``'s options (:mod:`exogym.run.calibrate`)."""
    cal = sub.add_parser(
        "calibrate", help="measure the links between real ranks and write a network file",
        description="Measure the links between the ranks of a torchrun job (or of --engine "
                    "process on one machine) with the transport training uses (all-reduces "
                    "and ping-pongs over a range of sizes), fit the network model and write it "
                    "as a network file for --network FILE, recost and estimate. Prints what it "
                    "measured and the fit's residuals.")
    cal.add_argument("--out", type=_path, required=True, metavar="FILE.json",
                     help="where to write the network file")
    cal.add_argument("--engine", choices=["process"],
                     help="without torchrun: start --nodes processes on this machine")
    cal.add_argument("--nodes", type=_positive_int,
                     help="ranks with --engine process (default 2; under torchrun its world)")
    cal.add_argument("--reps", type=_positive_int, default=5,
                     help="timed repeats of every case, median taken (default 5)")
    cal.add_argument("--target-time", type=_argtype(_positive_duration), default=2.0,
                     metavar="TIME", help="the largest all-reduce takes about this (default "
                                          "2s)")
    cal.add_argument("--max-size", type=_positive_int, default=64_000_000, metavar="BYTES",
                     help="the largest transfer, bytes (default 64000000)")
    cal.add_argument("--name", default="calibrated", help="the network's name (default "
                                                          "calibrated)")
    cal.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                     help="cpu: gloo (default); cuda: nccl, one GPU per rank")
    cal.add_argument("--per-node", action=argparse.BooleanOptionalAction, default=None,
                     help="write every node's rates (the file then fits runs of exactly this "
                          "N) or one rate for all (any N); default: per node when they differ "
                          "by more than 10%%")


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``exogym calibrate``: measure (every rank), fit and write the file (rank 0 prints)."""
    import torch

    from exogym.run.calibrate import CalibrateOptions, calibrate, measure_rank
    from exogym.run.dist import RankContext, close_group, join_torchrun, torchrun_env
    from exogym.run.launch import launch
    from exogym.sim.calibration import format_fit

    opts = CalibrateOptions(reps=args.reps, target_s=args.target_time, max_bytes=args.max_size)
    backend = "nccl" if args.device == "cuda" else "gloo"
    env = torchrun_env()
    if env is not None:
        if args.engine is not None or (args.nodes is not None and args.nodes != env.world_size):
            raise ValueError(f"under torchrun the ranks are torchrun's ({env.world_size}): drop "
                             "--engine and --nodes")
        device = join_torchrun(env, torch.device(args.device))
        ctx = RankContext(env.rank, env.world_size, 1, str(device))
        measured = measure_rank(ctx, opts)
        close_group(clean=True)
    elif args.engine == "process":
        measured = launch(measure_rank, args.nodes or 2, opts, backend=backend, threads=1,
                          timeout_s=300.0)[0]
    else:
        raise ValueError("calibrate measures the links between real processes: launch it with "
                         "torchrun (one rank per machine), or give --engine process [--nodes N] "
                         "to measure this machine's loopback")
    if measured is None:  # a rank other than 0
        return 0
    fit = calibrate(measured, args.out, name=args.name, backend=backend, opts=opts,
                    per_node=args.per_node)
    ccs = ", ".join(sorted({r["cc"] for r in measured["ranks"]}))
    print(f"measured {len(measured['ranks'])} ranks ({backend}, TCP congestion control {ccs})")
    print(format_fit(fit))
    print(f"wrote {args.out}: use --network {args.out} (run, recost, estimate)")
    return 0


_COMMANDS: dict[str, Any] = {
    "run": cmd_run, "sample": cmd_sample, "strategies": lambda a: cmd_strategies(a.ids),
    "networks": lambda a: cmd_networks(), "recost": cmd_recost, "estimate": cmd_estimate,
    "trace": cmd_trace,
    "compare": cmd_compare, "check": cmd_check, "sweep": cmd_sweep, "bench": cmd_bench,
    "tasks": lambda a: cmd_tasks(), "calibrate": cmd_calibrate,
}


if __name__ == "__main__":
    sys.exit(main())
