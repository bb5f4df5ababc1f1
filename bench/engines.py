#!/usr/bin/env python
"""exogym's engines against plain PyTorch and a process-per-node run, model by model.

For each model in ``--models`` and each N in ``--nodes``, training samples/s (summed over nodes)
of, side by side:

- ``plain 64``: ONE model, ``torch.optim.AdamW(fused=True)`` (the kernel exogym's nodes use;
  torch's default on a CPU is slower), batch 64: how fast this machine trains the model at all;
- ``plain 64N``: ONE model, AdamW, batch ``64 N``: the same samples per step as N nodes;
- ``loop``, ``auto`` (exogym's default engine, which picks loop, threads or vmap: the table
  names it): exogym's engines with DDP (AdamW, every gradient all-reduced each step), N nodes
  of batch 64, stepped as ``Trainer.fit`` steps them (without its logging and clock);
- ``fit, auto``: ``Trainer.fit`` itself with the default engine (no network model, a metrics
  row each step: everything a user's run pays);
- ``procs``: exogym's process engine (``fit_processes``), one process per node, gloo, one
  intra-op thread per process: a tuned process-per-node run (the same DDP, over real sockets).

The first four run in ONE process (``--worker paired``), in ``--rounds`` timed rounds that
alternate the sides (order reversed every other round): on this machine speed drifts by 10-30%
over minutes, which separate processes cannot tell from the sides' difference, so ``auto /
best plain`` is the median over rounds of auto / max(plain 64, plain 64N) of the same round.
``fit, auto`` and ``procs`` run in fresh processes (this script with ``--worker``), interleaved
over ``--repeats`` (medians), and a loop ``fit`` once: each has its own peak memory
(``ru_maxrss`` of the worker; for ``procs`` the launcher's plus N times the largest worker's,
``RUSAGE_CHILDREN``: an upper estimate of the sum). Timing skips warm-up steps and start-up
(fit sides: the wall time between the logged rows of the first and last timed steps). Every run
times about :data:`TIMED_SAMPLES` samples (a round a third of them). Data: random tensors of
each model's shapes (speed does not depend on the values), the same in every side.

Models: ``exo_cnn`` (EXO Gym's MNIST CNN: 4 convolutions with BatchNorm, dropout, 1.87 M
parameters), ``mnist_cnn`` (exogym's MnistCNN, 215 k), ``gpt`` (the Shakespeare task's GPT: 4
layers x 128, block 64, 0.8 M), ``bn_cnn`` (a 3-convolution BatchNorm CNN, no dropout),
``dropout_mlp`` (784 -> 512 -> 512 -> 10 with dropout 0.5).

``--profile`` instead times the phases of one exogym step (``--engine``, DDP), in this process:
the data path (slicing ``[N, 64, ...]`` batches from a pool, ``to_batch_device``), forward and
backward (``forward_backward``), the strategy's communication (DDP's all-reduce through the
communicator, byte counting included) and its ``optimizer.step`` over the stacked tensors, and
``zero_grad``, each step inside ``NodeStack.stepping()`` as ``Trainer.fit`` takes it; medians
over the timed steps, ms and percent of the step. With ``--engine loop`` the last column is the
forward alone (each node's forward on the same batch, its graph dropped, timed separately just
before the step and not part of it).

Usage::

    python bench/engines.py --models exo_cnn,gpt --nodes 1,2,4,8,16,64 --repeats 3
    python bench/engines.py --profile --engine loop --nodes 1,2,4,8
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

BATCH = 64


def exo_cnn() -> nn.Module:
    """EXO Gym's example/mnist.py CNN (1,868,234 parameters with the Classifier)."""
    return nn.Sequential(
        nn.Conv2d(1, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Dropout2d(0.25),
        nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
        nn.Conv2d(128, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2),
        nn.Dropout2d(0.25),
        nn.Flatten(), nn.Linear(128 * 7 * 7, 256), nn.ReLU(), nn.Dropout(0.5), nn.Linear(256, 10))


def bn_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 10))


def dropout_mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(512, 512), nn.ReLU(), nn.Dropout(0.5), nn.Linear(512, 10))


def build(name: str) -> nn.Module:
    from exogym import Classifier, MnistCNN
    from exogym.tasks.gpt import GPT, GPTConfig

    if name == "gpt":
        return GPT(GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128))
    nets = {"exo_cnn": exo_cnn, "mnist_cnn": MnistCNN, "bn_cnn": bn_cnn,
            "dropout_mlp": dropout_mlp}
    if name not in nets:
        raise ValueError(f"unknown model {name!r}; allowed: gpt, {', '.join(nets)}")
    return Classifier(nets[name]())


def dataset(name: str, samples: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    if name == "gpt":
        return TensorDataset(torch.randint(0, 65, (samples, 64), generator=g),
                             torch.randint(0, 65, (samples, 64), generator=g))
    return TensorDataset(torch.randn(samples, 1, 28, 28, generator=g),
                         torch.randint(0, 10, (samples,), generator=g))


def _peak_mb(children: int = 0) -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own + children * child


def run_worker(side: str, model: str, n: int, steps: int, warmup: int) -> dict[str, Any]:
    """A ``fit`` side's samples/s and peak memory (``loop``, ``auto``, ``threads``: that engine;
    ``procs``: the process engine), in its own process."""
    torch.manual_seed(0)
    total = warmup + steps
    from exogym import Trainer
    from exogym.strategy import make

    kwargs = dict(strategy=make("ddp"), num_nodes=n, max_steps=total, batch_size=BATCH,
                  log_interval=1, network=None, progress=False)
    data = dataset(model, BATCH * n * total)
    if side == "procs":
        from exogym.run.launch import fit_processes

        result = fit_processes(build(model), data, None, backend="gloo", threads=1,
                               timeout_s=600.0, **kwargs)
        peak = _peak_mb(children=n)
        engine = "procs"
    else:
        trainer = Trainer(build(model), data)
        result = trainer.fit(engine=side, **kwargs)
        peak = _peak_mb()
        engine = result.engine
    wall = {row["step"]: row["wall_s"] for row in result.history if "wall_s" in row}
    seconds = wall[total] - wall[warmup]
    return {"samples_s": BATCH * n * steps / seconds, "peak_mb": peak, "engine": engine}


def run_paired(model: str, n: int, steps: int, warmup: int, rounds: int) -> dict[str, Any]:
    """The in-process sides in ONE process, alternating timed rounds of ``steps`` steps (order
    reversed every other round): samples/s per side and round. This machine's speed drifts by
    10-30% over minutes, which separate processes cannot tell from an engine's speed; rounds a
    second or two apart see the same machine, so their ratios are what the table reports."""
    from exogym.sim.comm import InProcessCommunicator
    from exogym.sim.engine import NodeStack
    from exogym.strategy import make

    xs, ys = dataset(model, BATCH * n * 4).tensors  # 4 steps' batches, cycled
    xs, ys = xs.view(4, n, BATCH, *xs.shape[1:]), ys.view(4, n, BATCH, *ys.shape[1:])
    sides: dict[str, Callable[[int], float]] = {}
    engines: dict[str, str] = {}

    def plain(batch_nodes: int) -> Callable[[int], float]:
        torch.manual_seed(0)
        net = build(model)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3, fused=True)  # exogym's kernel
        x, y = xs.reshape(-1, *xs.shape[3:]), ys.reshape(-1, *ys.shape[3:])
        rows = BATCH * batch_nodes
        done = [0]

        def run(k: int) -> float:
            start = time.perf_counter()
            for _ in range(k):
                at = (done[0] * rows) % x.shape[0]
                opt.zero_grad(set_to_none=False)
                net((x[at:at + rows], y[at:at + rows]))["loss"].backward()
                opt.step()
                done[0] += 1
            return time.perf_counter() - start
        return run

    def exo(engine: str) -> Callable[[int], float]:
        torch.manual_seed(0)
        nodes = NodeStack(build(model), n, engine=engine)  # type: ignore[arg-type]
        comm = InProcessCommunicator(n)
        strategy = make("ddp")
        strategy.setup(nodes, comm, 10**9)
        loss_sum = torch.zeros(())
        done = [0]

        def run(k: int) -> float:  # as Trainer.fit steps, without its logging and clock
            start = time.perf_counter()
            for _ in range(k):
                step = done[0]
                comm.attendance.step = step
                with nodes.stepping():
                    losses = nodes.forward_backward(nodes.to_batch_device((xs[step % 4],
                                                                           ys[step % 4])))
                    strategy.step(step)
                    nodes.zero_grad()
                loss_sum.add_(losses.sum())
                done[0] += 1
            engines[engine] = nodes.engine
            return time.perf_counter() - start
        return run

    sides["plain64"] = plain(1)
    if n > 1:
        sides["plain64N"] = plain(n)
    sides["loop"] = exo("loop")
    sides["auto"] = exo("auto")
    samples = {s: BATCH * (1 if s == "plain64" else n) * steps for s in sides}
    for run in sides.values():
        run(warmup)
    rates: dict[str, list[float]] = {s: [] for s in sides}
    for r in range(rounds):
        for s in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            rates[s].append(samples[s] / sides[s](steps))
    return {"rates": rates, "engine": engines["auto"]}


def profile(model: str, n: int, engine: str, steps: int, warmup: int) -> dict[str, float]:
    """Median seconds per phase of one step (see the module docstring)."""
    from exogym.sim.binding import bound
    from exogym.sim.comm import InProcessCommunicator
    from exogym.sim.engine import NodeStack
    from exogym.strategy import make

    torch.manual_seed(0)
    nodes = NodeStack(build(model), n, engine=engine)  # type: ignore[arg-type]
    comm = InProcessCommunicator(n)
    strategy = make("ddp")
    strategy.setup(nodes, comm, warmup + steps)
    optimizer_step = strategy.optimizer.step  # timed on its own inside the strategy's step
    spent: dict[str, list[float]] = {k: [] for k in
                                     ("data", "forward+backward", "communicate", "optimizer",
                                      "zero_grad", "forward")}
    inner: list[float] = []

    def timed_optimizer_step(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        out = optimizer_step(*a, **k)
        inner.append(time.perf_counter() - t)
        return out

    strategy.optimizer.step = timed_optimizer_step  # type: ignore[method-assign]
    xs, ys = dataset(model, BATCH * n * 4).tensors
    xs, ys = xs.view(4, n, BATCH, *xs.shape[1:]), ys.view(4, n, BATCH, *ys.shape[1:])
    for step in range(warmup + steps):
        t0 = time.perf_counter()
        batch = nodes.to_batch_device((xs[step % 4], ys[step % 4]))
        t1 = time.perf_counter()
        if engine == "loop":  # each node's forward alone on its own views, the graph dropped
            for i in range(n):
                with bound(nodes.module, nodes._node_params[i], nodes._node_buffers[i]) as m:
                    m((batch[0][i], batch[1][i]))
        t2 = time.perf_counter()
        with nodes.stepping():  # as Trainer.fit steps
            nodes.forward_backward(batch)
            t3 = time.perf_counter()
            inner.clear()
            strategy.step(step)
            t4 = time.perf_counter()
            nodes.zero_grad()
            t5 = time.perf_counter()
        if step >= warmup:
            spent["data"].append(t1 - t0)
            spent["forward+backward"].append(t3 - t2)
            spent["forward"].append(t2 - t1 if engine == "loop" else math.nan)
            spent["optimizer"].append(sum(inner))
            spent["communicate"].append(t4 - t3 - sum(inner))
            spent["zero_grad"].append(t5 - t4)
    return {k: statistics.median(v) for k, v in spent.items()}


# Timed samples per run, about 3 s of plain PyTorch at batch 64 on the 2-core machine of
# docs/benchmarks/engines-cpu2-202611.md: a fixed step count would time 0.1 s of a small model at N
# = 2 (noise).
TIMED_SAMPLES = {"exo_cnn": 1024, "gpt": 1024, "bn_cnn": 6144, "mnist_cnn": 15360,
                 "dropout_mlp": 28672}


def timed_samples(model: str, args: argparse.Namespace) -> int:
    """``--timed-samples``, else the model's :data:`TIMED_SAMPLES`."""
    return TIMED_SAMPLES.get(model, 0) if args.timed_samples is None else args.timed_samples


def steps_for(model: str, n: int, args: argparse.Namespace) -> tuple[int, int]:
    """``(timed steps, warm-up steps)`` of a run of ``model`` on ``n`` nodes: at least
    ``--steps`` and enough for the model's timed samples; a quarter as many warm-up steps, at
    least ``--warmup``."""
    steps = max(args.steps, -(-timed_samples(model, args) // (BATCH * n)))
    return steps, max(args.warmup, steps // 4)


def _worker_cmd(side: str, model: str, n: int, args: argparse.Namespace,
                steps: int | None = None, warmup: int | None = None) -> list[str]:
    if steps is None or warmup is None:
        steps, warmup = steps_for(model, n, args)
    return [sys.executable, __file__, "--worker", side, "--models", model, "--nodes", str(n),
            "--steps", str(steps), "--warmup", str(warmup), "--rounds", str(args.rounds)]


def measure(side: str, model: str, n: int, args: argparse.Namespace,
            steps: int | None = None, warmup: int | None = None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(_worker_cmd(side, model, n, args, steps, warmup), capture_output=True,
                          text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{side} {model} N={n} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="exo_cnn,mnist_cnn,gpt,bn_cnn,dropout_mlp")
    p.add_argument("--nodes", default="1,2,4,8,16,64")
    p.add_argument("--rounds", type=int, default=5,
                   help="alternating timed rounds of the in-process sides (default: 5)")
    p.add_argument("--steps", type=int, default=4,
                   help="timed steps, at least (default: 4; more where the model's "
                        "TIMED_SAMPLES need them)")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed steps first, at least (default: 2; a quarter of the timed "
                        "steps where that is more)")
    p.add_argument("--timed-samples", type=int, default=None,
                   help="timed samples per run, at least (default: the model's TIMED_SAMPLES; "
                        "0: --steps alone)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--procs-max-nodes", type=int, default=16,
                   help="the process side only up to this N (memory: one interpreter and "
                        "torch per node); default 16")
    p.add_argument("--json", default=None, help="write every measurement here")
    p.add_argument("--profile", action="store_true",
                   help="time the phases of one step instead (see the module docstring)")
    p.add_argument("--engine", default="loop", help="the engine --profile times")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    models = args.models.split(",")
    nodes = [int(x) for x in args.nodes.split(",")]
    if args.worker is not None:
        if args.worker == "paired":
            out = run_paired(models[0], nodes[0], args.steps, args.warmup, args.rounds)
        else:
            out = run_worker(args.worker, models[0], nodes[0], args.steps, args.warmup)
        print(json.dumps(out))
        return 0
    if args.profile:
        print(f"# phases of one DDP step, engine {args.engine}, batch {BATCH} per node; "
              f"medians of {args.steps} steps after {args.warmup}; ms (percent of the step)")
        for model in models:
            print(f"\n## {model}\n\n| N | data | forward + backward | communicate | "
                  "optimizer | zero_grad | step | of which forward (loop) |\n"
                  "|---|---|---|---|---|---|---|---|")
            for n in nodes:
                t = profile(model, n, args.engine, args.steps, args.warmup)
                forward = t.pop("forward")
                total = sum(t.values())
                cells = " | ".join(f"{1e3 * v:.1f} ({100 * v / total:.0f}%)" for v in t.values())
                alone = "-" if math.isnan(forward) else f"{1e3 * forward:.1f}"
                print(f"| {n} | {cells} | {1e3 * total:.1f} | {alone} |", flush=True)
        return 0
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
          f"{torch.__version__}, {torch.get_num_threads()} intra-op threads; batch {BATCH} per "
          f"node, DDP/AdamW; in-process sides: {args.rounds} alternating rounds, medians; fit "
          f"and procs: separate processes, {args.repeats} interleaved repeats, medians "
          f"(TIMED_SAMPLES {TIMED_SAMPLES})", flush=True)
    records: list[dict[str, Any]] = []
    for model in models:
        print(f"\n## {model}\n\n| N | plain 64 | plain 64N | loop | auto (engine) | auto / "
              "best plain | fit, auto | procs, 1 thread | fit auto / procs | peak MB fit auto "
              "/ loop / procs |\n|---|---|---|---|---|---|---|---|---|---|", flush=True)
        for n in nodes:
            per_round = max(args.steps // 3, 1, -(-timed_samples(model, args) // (3 * BATCH * n)))
            paired = measure("paired", model, n, args, steps=per_round,
                             warmup=max(1, per_round // 2))
            rates = paired["rates"]
            records.append({"model": model, "nodes": n, "side": "paired", **paired})
            med = {side: statistics.median(v) for side, v in rates.items()}
            best = [max(p, q) for p, q in zip(rates["plain64"], rates.get("plain64N",
                                                                        rates["plain64"]),
                                               strict=True)]
            vs_plain = statistics.median(a / b for a, b in zip(rates["auto"], best, strict=True))
            todo = ["auto"] + (["procs"] if 2 <= n <= args.procs_max_nodes else [])
            runs: dict[str, list[dict[str, Any]]] = {side: [] for side in [*todo, "loop"]}
            for rep in range(args.repeats):
                for side in (todo if rep % 2 == 0 else todo[::-1]):
                    runs[side].append(measure(side, model, n, args))
            runs["loop"].append(measure("loop", model, n, args))  # its peak memory
            for side, v in runs.items():
                records.extend({"model": model, "nodes": n, "side": side, "repeat": k, **r}
                               for k, r in enumerate(v))
            fit = {side: statistics.median(r["samples_s"] for r in v) for side, v in runs.items()}
            peak = {side: max(r["peak_mb"] for r in v) for side, v in runs.items()}

            def cell(side: str, m: dict[str, float]) -> str:
                return f"{m[side]:,.0f}" if side in m else "-"

            vs_procs = f"{fit['auto'] / fit['procs']:.2f}" if "procs" in fit else "-"
            print(f"| {n} | {cell('plain64', med)} | {cell('plain64N', med)} | "
                  f"{cell('loop', med)} | {cell('auto', med)} ({paired['engine']}) | "
                  f"{vs_plain:.2f} | {cell('auto', fit)} | {cell('procs', fit)} | {vs_procs} | "
                  f"{cell('auto', peak)} / {cell('loop', peak)} / {cell('procs', peak)} |",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
