#!/usr/bin/env python
"""Throughput of exogym's N simulated nodes beside a plain single-process PyTorch loop.

For every N in ``--nodes`` this measures, on the MNIST CNN (``Classifier(MnistCNN())``), batch
``--batch-size`` per node:

- **exogym**: ``NodeStack(model, N, engine=...)`` + ``InProcessCommunicator(N)`` + the strategy,
  stepping exactly as ``Trainer.fit`` does per step (``comm.step``, ``to_batch_device``,
  ``forward_backward``, ``strategy.step``, ``zero_grad``, loss accumulation), ``--steps`` timed
  steps after ``--warmup`` untimed ones;
- **baseline**: ONE ``Classifier(MnistCNN())`` and ONE inner optimizer of the same kind and
  hyperparameters as the strategy's (``torch.optim.AdamW`` for the default ``ddp``), taking
  ``N * steps`` ordinary steps (``zero_grad``, forward, backward, ``optimizer.step``) on batches of
  ``--batch-size``: the same samples, forward/backward passes and optimizer updates of the same
  model size, on the same batches (exogym node ``i`` at step ``s`` sees the baseline's batch
  ``s * N + i``).

Throughput is samples/s summed over nodes, ``N * batch_size * steps / seconds`` on both sides;
ratio = exogym / baseline. Every (side, N, repeat) runs in a fresh subprocess (this script with
the hidden ``--worker`` flag), so each side's peak memory is its own: the worker's
``getrusage(RUSAGE_SELF).ru_maxrss`` on CPU (it includes the Python interpreter, torch and the
shared batch pool; the table's notes give that floor), ``torch.cuda.max_memory_allocated`` on
CUDA. Repeats alternate the sides (baseline, exogym; then exogym, baseline; ...) and the table
reports the median (``--stat best`` for the best) of the repeats' samples/s and the largest peak.

Data: batches are pre-loaded into one pool of at most ``max(256, max N)`` batches (real MNIST
training images when found, via ``exogym.tasks.data.mnist.MNIST``; random tensors of the same shapes
with ``--synthetic`` or when MNIST is not found), written once to a temporary file, loaded by
every worker and indexed by views during the timed steps, identically on both sides.

Usage::

    python bench/throughput.py --nodes 1,2,4,8,16,64 --steps 30 --warmup 5 --repeats 3
    python bench/throughput.py --device cuda --engines loop,vmap --nodes 8 --json cuda.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import dataclasses
import io
import json
import os
import platform
import pstats
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from exogym.sim.comm import InProcessCommunicator
from exogym.sim.engine import ENGINES, NodeStack, loss_of
from exogym.strategy import StackedStrategy, make, registry
from exogym.tasks.models import Classifier, MnistCNN

RESULT_MARK = "@@throughput-result@@ "
POOL_BATCHES = 256
RATIO_TARGET = 0.95
MEMORY_TARGET_MB = 4000.0  # "under 4 GB", in decimal megabytes (the stricter reading)
MEMORY_TARGET_NODES = 64
VMAP_SPEEDUP_TARGET = 5.0
VMAP_TARGET_NODES = 8
BASELINE = "baseline"


# -- command line -----------------------------------------------------------------------------
def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        msg = f"expected comma-separated integers, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def _engine_list(text: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in values if v not in ENGINES]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"engines must be among {ENGINES}, got {text!r}") from None
    return list(dict.fromkeys(values))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="exogym throughput (samples/s summed over nodes) beside a plain PyTorch loop "
        "doing the same total work, with peak memory.",
    )
    p.add_argument("--nodes", type=_int_list, default=[1, 2, 4, 8, 16, 64],
                   help="comma-separated numbers of nodes N (default: 1,2,4,8,16,64)")
    p.add_argument("--steps", type=int, default=30,
                   help="timed training steps per measurement (default: 30)")
    p.add_argument("--warmup", type=int, default=5,
                   help="untimed steps before the timed ones (default: 5)")
    p.add_argument("--repeats", type=int, default=3,
                   help="measurements per (side, N), each in a fresh subprocess (default: 3)")
    p.add_argument("--rounds", type=int, default=0,
                   help="paired mode: per N, ONE worker holds both sides and alternates ROUNDS "
                   "timed rounds of --steps steps (order flipped each round); the table then "
                   "gives the median of the per-round ratios, which cancels the machine's drift "
                   "(default: 0, off; --repeats workers then measure peak memory only)")
    p.add_argument("--stat", choices=("median", "best"), default="median",
                   help="how the repeats' samples/s are combined (default: median)")
    p.add_argument("--strategy", default="ddp",
                   help=f"strategy registry id, one of {', '.join(registry())} (default: ddp)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="strategy hyperparameter override, as in `exogym strategies` (repeatable)")
    p.add_argument("--engine", "--engines", dest="engines", type=_engine_list, default=["loop"],
                   help="exogym engine(s), comma-separated among loop,vmap,auto (default: loop); "
                   "several compare the engines")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                   help="cpu, cuda, or auto (cuda if available) (default: cpu)")
    p.add_argument("--batch-size", type=int, default=64, help="per node (default: 64)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads in every worker (default: torch's default)")
    p.add_argument("--data-dir", default=None,
                   help="data directory holding mnist/ (default: EXOGYM_DATA_DIR, then the cache)")
    p.add_argument("--download", action="store_true",
                   help="allow downloading MNIST when it is not found")
    p.add_argument("--synthetic", action="store_true",
                   help="random tensors of MNIST's shapes instead of MNIST")
    p.add_argument("--json", type=Path, default=None, metavar="PATH",
                   help="also write the results as JSON to PATH")
    p.add_argument("--profile", action="store_true",
                   help="run the timed steps under cProfile and print the top entries of every "
                   "worker to stderr (diagnostic: slows the measured steps)")
    # Hidden: one measurement in this (fresh) process.
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--side", default=BASELINE, help=argparse.SUPPRESS)
    p.add_argument("--worker-nodes", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--pool", default="", help=argparse.SUPPRESS)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rounds < 0:
        parser.error("--rounds must be >= 0")
    for name in ("steps", "repeats", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    if args.strategy not in registry():
        parser.error(f"unknown strategy {args.strategy!r}; available: {', '.join(registry())}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch.cuda.is_available() is False")
    return args


def _overrides(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


# -- the worker: one measurement --------------------------------------------------------------
def _peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB (10^6 bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e6 if sys.platform == "darwin" else peak * 1024 / 1e6  # bytes vs KiB


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_baseline(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, xs: Tensor, ys: Tensor, n: int,
    warmup: int, steps: int, device: torch.device, profiler: cProfile.Profile | None,
) -> tuple[float, float]:
    """``n * (warmup + steps)`` plain steps; returns (seconds of the timed ones, mean loss)."""
    pool = xs.shape[0]
    loss_sum = torch.zeros((), device=device)

    def run(first: int, last: int) -> None:
        for k in range(first, last):
            j = k % pool
            batch = (xs[j], ys[j])
            optimizer.zero_grad()
            loss = loss_of(model(batch))
            loss.backward()
            optimizer.step()
            loss_sum.add_(loss.detach())

    run(0, warmup * n)
    _sync(device)
    loss_sum.zero_()
    if profiler is not None:
        profiler.enable()
    t0 = time.perf_counter()
    run(warmup * n, (warmup + steps) * n)
    _sync(device)
    elapsed = time.perf_counter() - t0
    if profiler is not None:
        profiler.disable()
    return elapsed, float(loss_sum) / (steps * n)


def _time_exogym(
    nodes: NodeStack, strategy: StackedStrategy, comm: InProcessCommunicator, xs: Tensor,
    ys: Tensor, warmup: int, steps: int, device: torch.device, profiler: cProfile.Profile | None,
) -> tuple[float, float]:
    """``warmup + steps`` steps of all nodes, as Trainer.fit takes them; (seconds, mean loss)."""
    n, pool = nodes.num_nodes, xs.shape[0]
    loss_sum = torch.zeros((), device=device)

    def run(first: int, last: int) -> None:
        for step in range(first, last):
            comm.attendance.step = step
            start = (step * n) % pool  # pool is a multiple of n: a view of n whole batches
            batch = nodes.to_batch_device((xs[start : start + n], ys[start : start + n]))
            losses = nodes.forward_backward(batch)
            strategy.step(step)
            nodes.zero_grad()
            loss_sum.add_(losses.mean())

    run(0, warmup)
    _sync(device)
    loss_sum.zero_()
    if profiler is not None:
        profiler.enable()
    t0 = time.perf_counter()
    run(warmup, warmup + steps)
    _sync(device)
    elapsed = time.perf_counter() - t0
    if profiler is not None:
        profiler.disable()
    return elapsed, float(loss_sum) / steps


def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    """One (side, N) measurement in this process; the result as a JSON-able dict."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    n, side = args.worker_nodes, args.side
    pool = torch.load(args.pool, weights_only=True)
    usable = n * (pool["x"].shape[0] // n)
    xs: Tensor = pool["x"][:usable].to(device)
    ys: Tensor = pool["y"][:usable].to(device)
    del pool
    setup_rss_mb = _peak_rss_mb()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    strategy = make(args.strategy, **_overrides(args.overrides))
    torch.manual_seed(0)
    model = Classifier(MnistCNN())
    profiler = cProfile.Profile() if args.profile else None
    engine_used = None
    if side.startswith("paired:"):
        return _paired(args, side, model, strategy, xs, ys, n, device)
    if side == BASELINE:
        model = model.to(device).train()
        optimizer = strategy.optim.build(list(model.parameters()))
        elapsed, loss = _time_baseline(model, optimizer, xs, ys, n, args.warmup, args.steps,
                                       device, profiler)
    else:
        engine = side.split(":", 1)[1]
        nodes = NodeStack(model, n, device=device, engine=engine)  # type: ignore[arg-type]
        comm = InProcessCommunicator(n)
        strategy.setup(nodes, comm, args.warmup + args.steps)
        elapsed, loss = _time_exogym(nodes, strategy, comm, xs, ys, args.warmup, args.steps,
                                     device, profiler)
        engine_used = nodes.engine
    samples = n * args.batch_size * args.steps
    result: dict[str, Any] = {
        "side": side, "nodes": n, "engine": engine_used, "seconds": elapsed,
        "samples": samples, "samples_per_s": samples / elapsed, "mean_loss": loss,
        "peak_rss_mb": _peak_rss_mb(), "setup_rss_mb": setup_rss_mb,
        "threads": torch.get_num_threads(), "device": str(device),
    }
    if device.type == "cuda":
        result["peak_cuda_mb"] = torch.cuda.max_memory_allocated(device) / 1e6
    if profiler is not None:
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text).strip_dirs().sort_stats("tottime")
        stats.print_stats(20)
        print(f"--- cProfile, {side}, N={n}, {args.steps} timed steps, by tottime ---",
              file=sys.stderr)
        print(text.getvalue(), file=sys.stderr)
    return result


def _paired(
    args: argparse.Namespace, side: str, model: torch.nn.Module, strategy: StackedStrategy,
    xs: Tensor, ys: Tensor, n: int, device: torch.device,
) -> dict[str, Any]:
    """Both sides in this process, alternating timed rounds; per-round samples/s of each."""
    base_model = copy.deepcopy(model).to(device).train()
    optimizer = strategy.optim.build(list(base_model.parameters()))
    engine = side.split(":", 1)[1]
    nodes = NodeStack(model, n, device=device, engine=engine)  # type: ignore[arg-type]
    comm = InProcessCommunicator(n)
    strategy.setup(nodes, comm, 10**9)
    samples = n * args.batch_size * args.steps

    def base() -> float:
        return samples / _time_baseline(base_model, optimizer, xs, ys, n, 0, args.steps,
                                        device, None)[0]

    def exo() -> float:
        return samples / _time_exogym(nodes, strategy, comm, xs, ys, 0, args.steps, device,
                                      None)[0]

    _time_baseline(base_model, optimizer, xs, ys, n, args.warmup, 1, device, None)
    _time_exogym(nodes, strategy, comm, xs, ys, args.warmup, 1, device, None)
    base_rates: list[float] = []
    exo_rates: list[float] = []
    for r in range(args.rounds):
        if r % 2 == 0:
            base_rates.append(base())
            exo_rates.append(exo())
        else:
            exo_rates.append(exo())
            base_rates.append(base())
    return {"side": side, "nodes": n, "engine": nodes.engine, "base_rates": base_rates,
            "exo_rates": exo_rates,
            "ratios": [e / b for e, b in zip(exo_rates, base_rates, strict=True)]}


# -- the parent: data pool, subprocesses, table ----------------------------------------------
def build_pool(args: argparse.Namespace, max_nodes: int, path: Path) -> str:
    """Write the batch pool to ``path``; returns a description of the data."""
    count = max(POOL_BATCHES, max_nodes)
    b = args.batch_size
    gen = torch.Generator().manual_seed(0)
    description = ""
    if not args.synthetic:
        try:
            from exogym.tasks.data.download import DatasetNotFoundError
            from exogym.tasks.data.mnist import MNIST

            try:
                train = MNIST(args.data_dir, train=True, download=args.download)
            except DatasetNotFoundError as err:
                first = str(err).strip().splitlines()[0] if str(err).strip() else ""
                print(f"MNIST not found ({first}); using synthetic data "
                      "(pass --download or --data-dir for the real images)", file=sys.stderr)
            else:
                idx = torch.randperm(len(train), generator=gen)
                idx = idx.repeat(-(-count * b // len(idx)))[: count * b]
                x, y = train.get_batch(idx)
                x, y = x.reshape(count, b, *x.shape[1:]), y.reshape(count, b)
                description = f"MNIST train ({train.root})"
                del train
        except ImportError as err:  # pragma: no cover - data module missing
            print(f"exogym.tasks.data.mnist unavailable ({err}); using synthetic data",
                  file=sys.stderr)
    if not description:
        x = torch.randn(count, b, 1, 28, 28, generator=gen)
        y = torch.randint(0, 10, (count, b), generator=gen)
        description = "synthetic (random tensors of MNIST's shapes)"
    torch.save({"x": x.contiguous(), "y": y.contiguous()}, path)
    return f"{description}; pool of {count} batches of {b}, the same batches on both sides"


def _worker_cmd(args: argparse.Namespace, side: str, n: int, device: str, pool: Path) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--side", side,
           "--worker-nodes", str(n), "--pool", str(pool), "--device", device,
           "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--batch-size", str(args.batch_size), "--strategy", args.strategy,
           "--rounds", str(args.rounds)]
    for item in args.overrides:
        cmd += ["--set", item]
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    if args.profile:
        cmd.append("--profile")
    return cmd


def run_one(args: argparse.Namespace, side: str, n: int, device: str,
            pool: Path) -> dict[str, Any]:
    proc = subprocess.run(_worker_cmd(args, side, n, device, pool), capture_output=True,
                          text=True, check=False)
    if args.profile and proc.stderr:
        print(proc.stderr, file=sys.stderr)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return {"side": side, "nodes": n, "error": f"exit code {proc.returncode}: " + " | ".join(tail)}


@dataclass
class Summary:
    """One (N, side): the combined repeats."""

    nodes: int
    side: str
    samples_per_s: float | None
    peak_mb: float | None
    runs: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


def summarize(n: int, side: str, runs: list[dict[str, Any]], stat: str, cuda: bool) -> Summary:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return Summary(n, side, None, None, runs, runs[0].get("error") if runs else "no runs")
    rates = [r["samples_per_s"] for r in ok]
    rate = max(rates) if stat == "best" else statistics.median(rates)
    peak = max(r["peak_cuda_mb"] if cuda else r["peak_rss_mb"] for r in ok)
    err = None if len(ok) == len(runs) else f"{len(runs) - len(ok)} of {len(runs)} runs failed"
    return Summary(n, side, rate, peak, runs, err)


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info: dict[str, Any] = {
        "cpu": cpu, "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "python": platform.python_version(), "threads": torch.get_num_threads(),
        "platform": platform.platform(),
    }
    with contextlib.suppress(OSError, AttributeError):
        info["loadavg_at_start"] = [round(v, 2) for v in os.getloadavg()]
    if torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name(0)
    return info


def _fmt(value: float | None, digits: int = 0) -> str:
    return "failed" if value is None else f"{value:,.{digits}f}"


def render(
    args: argparse.Namespace, command: str, machine: dict[str, Any], data: str, device: str,
    summaries: dict[tuple[int, str], Summary], sides: list[str],
    paired: dict[tuple[int, str], dict[str, Any]] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The markdown report and the targets' verdicts."""
    cuda = device == "cuda"
    engines = [s.split(":", 1)[1] for s in sides if s != BASELINE]
    mem_kind = "torch.cuda.max_memory_allocated" if cuda else "peak RSS (ru_maxrss) of the worker"
    threads = machine["threads"] if args.threads is None else args.threads
    lines = [
        f"## exogym throughput: strategy {args.strategy}, engine {','.join(engines)}, {device}",
        "",
        f"- command: `{command}`",
        f"- machine: {machine['cpu']} ({machine['cpu_count']} logical CPUs), torch "
        f"{machine['torch']}, python {machine['python']}, threads {threads}"
        + (f", GPU {machine['cuda_device']}" if cuda and "cuda_device" in machine else "")
        + (f", load average at start {machine['loadavg_at_start']}"
           if "loadavg_at_start" in machine else ""),
        f"- data: {data}",
        f"- work per measurement: {args.steps} timed steps after {args.warmup} untimed; "
        f"batch {args.batch_size} per node; baseline = one model + one "
        f"{args.strategy} inner optimizer taking N x {args.steps} plain steps",
        (f"- samples/s and ratio: paired, one worker per N holding both sides, median of "
         f"{args.rounds} alternating rounds (ratio = median of the per-round ratios); peak MB "
         f"(10^6 bytes): {mem_kind} of separate one-side workers, largest of {args.repeats}"
         if paired else
         f"- samples/s: {args.stat} of {args.repeats} repeat(s), each side in a fresh "
         "subprocess, sides alternated per repeat; peak MB (10^6 bytes): "
         f"{mem_kind}, largest over the repeats"),
    ]
    setups = [r["setup_rss_mb"] for s in summaries.values() for r in s.runs if "setup_rss_mb" in r]
    if setups and not cuda:
        lines.append(f"- peak RSS includes a worker's floor (python + torch + exogym + batch "
                     f"pool) of about {statistics.median(setups):,.0f} MB")
    lines.append("")
    multi = len(engines) > 1
    head = ["N"] + (["engine"] if multi else []) + [
        "baseline samples/s", "exogym samples/s", "ratio", "baseline peak MB", "exogym peak MB",
        "target met?"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    verdicts: dict[str, Any] = {"ratio": {}, "memory": None, "vmap_speedup": None}
    for n in args.nodes:
        base = summaries[(n, BASELINE)]
        for side in sides[1:]:
            exo = summaries[(n, side)]
            ratio = (exo.samples_per_s / base.samples_per_s
                     if exo.samples_per_s and base.samples_per_s else None)
            pair = (paired or {}).get((n, side))
            if pair and "ratios" in pair:
                ratio = statistics.median(pair["ratios"])
                base = dataclasses.replace(base, samples_per_s=statistics.median(
                    pair["base_rates"]))
                exo = dataclasses.replace(exo, samples_per_s=statistics.median(pair["exo_rates"]))
            elif pair:
                ratio = None
                exo = dataclasses.replace(exo, error=pair.get("error", "paired run failed"))
            checks: list[str] = []
            met: bool | None = None
            if not cuda and ratio is not None:
                met = ratio >= RATIO_TARGET
                checks.append(f"ratio {'>=' if met else '<'} {RATIO_TARGET}")
                verdicts["ratio"][f"{n}:{side}"] = met
                if n == MEMORY_TARGET_NODES and exo.peak_mb is not None:
                    mem_ok = exo.peak_mb < MEMORY_TARGET_MB
                    verdicts["memory"] = mem_ok if verdicts["memory"] is None else (
                        verdicts["memory"] and mem_ok)
                    checks.append(f"peak {'<' if mem_ok else '>='} {MEMORY_TARGET_MB:.0f} MB")
                    met = met and mem_ok
            verdict = "-" if met is None else ("yes" if met else "**no**")
            if checks:
                verdict += f" ({', '.join(checks)})"
            notes = "; ".join(e for e in (base.error, exo.error) if e)
            if notes:
                verdict += f" [{notes}]"
            row = [str(n)] + ([side.split(":", 1)[1]] if multi else []) + [
                _fmt(base.samples_per_s), _fmt(exo.samples_per_s),
                _fmt(ratio, 3), _fmt(base.peak_mb), _fmt(exo.peak_mb), verdict]
            lines.append("| " + " | ".join(row) + " |")
    if not cuda:
        all_ratio = list(verdicts["ratio"].values())
        lines += ["", f"- target ratio >= {RATIO_TARGET} for every N: "
                  + ("yes" if all_ratio and all(all_ratio) else "**no**" if all_ratio else "n/a"),
                  f"- target N = {MEMORY_TARGET_NODES} under {MEMORY_TARGET_MB:.0f} MB peak: "
                  + {True: "yes", False: "**no**", None: "not measured"}[verdicts["memory"]]]
    if "loop" in engines and "vmap" in engines:
        lines += ["", f"### engines on {device}: loop vs vmap", "",
                  "| N | loop samples/s | vmap samples/s | vmap / loop | loop peak MB "
                  "| vmap peak MB |", "|---|---|---|---|---|---|"]
        for n in args.nodes:
            lo, vm = summaries[(n, "exogym:loop")], summaries[(n, "exogym:vmap")]
            speedup = (vm.samples_per_s / lo.samples_per_s
                       if vm.samples_per_s and lo.samples_per_s else None)
            lines.append(f"| {n} | {_fmt(lo.samples_per_s)} | {_fmt(vm.samples_per_s)} | "
                         f"{_fmt(speedup, 2)} | {_fmt(lo.peak_mb)} | {_fmt(vm.peak_mb)} |")
            if cuda and n == VMAP_TARGET_NODES and speedup is not None:
                verdicts["vmap_speedup"] = speedup >= VMAP_SPEEDUP_TARGET
        if cuda:
            v = verdicts["vmap_speedup"]
            lines += ["", f"- target vmap >= {VMAP_SPEEDUP_TARGET:g}x loop at N = "
                      f"{VMAP_TARGET_NODES} on CUDA: "
                      + {True: "yes", False: "**no**", None: "not measured"}[v]]
    return "\n".join(lines), verdicts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(RESULT_MARK + json.dumps(run_worker(args)), flush=True)
        return 0
    make(args.strategy, **_overrides(args.overrides))  # fail early on bad overrides
    command = shlex.join(["python", *(sys.argv if argv is None else [sys.argv[0], *argv])])
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    machine = machine_info()
    sides = [BASELINE] + [f"exogym:{e}" for e in args.engines]
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {(n, s): [] for n in args.nodes
                                                         for s in sides}
    with tempfile.TemporaryDirectory(prefix="exogym-bench-") as tmp:
        pool = Path(tmp) / "pool.pt"
        data = build_pool(args, max(args.nodes), pool)
        for n in args.nodes:
            for rep in range(args.repeats):
                for side in sides if rep % 2 == 0 else sides[::-1]:
                    result = run_one(args, side, n, device, pool)
                    runs[(n, side)].append(result)
                    if "error" in result:
                        msg = f"FAILED: {result['error']}"
                    else:
                        peak = result.get("peak_cuda_mb", result["peak_rss_mb"])
                        msg = (f"{result['samples_per_s']:,.0f} samples/s, peak {peak:,.0f} MB, "
                               f"loss {result['mean_loss']:.3f}")
                    print(f"[N={n} repeat {rep + 1}/{args.repeats}] {side}: {msg}",
                          file=sys.stderr, flush=True)
        paired: dict[tuple[int, str], dict[str, Any]] = {}
        for n in args.nodes if args.rounds else []:
            for side in sides[1:]:
                result = run_one(args, "paired:" + side.split(":", 1)[1], n, device, pool)
                paired[(n, side)] = result
                msg = (f"FAILED: {result['error']}" if "error" in result else
                       "ratios " + ", ".join(f"{r:.3f}" for r in result["ratios"]))
                print(f"[N={n} paired] {side}: {msg}", file=sys.stderr, flush=True)
    summaries = {key: summarize(key[0], key[1], r, args.stat, device == "cuda")
                 for key, r in runs.items()}
    report, verdicts = render(args, command, machine, data, device, summaries, sides, paired)
    print(report)
    if args.json is not None:
        payload = {
            "command": command, "machine": machine, "data": data, "device": device,
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                       if k not in ("worker", "side", "worker_nodes", "pool")},
            "targets": {"ratio": RATIO_TARGET, "memory_mb": MEMORY_TARGET_MB,
                        "memory_nodes": MEMORY_TARGET_NODES,
                        "vmap_speedup": VMAP_SPEEDUP_TARGET, "vmap_nodes": VMAP_TARGET_NODES},
            "verdicts": verdicts,
            "results": [asdict(s) for s in summaries.values()],
            "paired": [dict(v, key=list(k)) for k, v in paired.items()],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nwrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
