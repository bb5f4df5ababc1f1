#!/usr/bin/env python
"""exogym against two peer federated-learning simulators on one workload, side by side.

The workload (issue 34): FedAvg over 1,000 clients, 10 clients per round, Dirichlet(0.5) label
skew over MNIST, exogym's MNIST CNN; each selected client trains 10 AdamW steps of batch 8 from a
fresh optimizer (exogym's inner settings for the task), the server model is the plain mean of
the clients' models; 100 rounds; the final global model is evaluated on the 10,000 test images.

Same work for every tool: this script exports ONE workload file from exogym (:func:`export`):
the clients' shards (exogym's ``NodeBatches`` for ``--partition dirichlet:0.5 --nodes 1000
--batch-size 8``), the initial weights (``torch.manual_seed(seed)`` then the task's model, as
``exogym run`` builds it), each round's clients (exogym's participation draws) and the samples
each of them trains on, step by step (its shard in exogym's per-node pass order: a client that
sits a round out does not advance). Each peer program (``bench/fl_peers/``) reads only that
file and runs its own engine:

- ``exogym``: the ``exogym run`` command of :func:`exogym_command`, in this interpreter;
- ``flower``: Flower's simulation engine (``flwr[simulation]``, Ray backend, ``run_simulation``
  with a ``ServerApp`` and a ``ClientApp``, 2 actors of 1 CPU); before the rounds the server
  asks each SuperNode its client id once, to send each round's messages to the drawn clients;
- ``pfl``, ``pfl-2``: Apple's pfl, PyTorch backend, one process, and two worker processes
  launched with ``torchrun`` as pfl's guide to distributed simulation says;
- ``torch_loop``: plain PyTorch, the round's clients trained one after another in one process
  on one thread (the reference).

Flower and pfl are not exogym dependencies: each is installed into its own virtual environment
under ``--cache`` (``torch==2.13.0`` first, the CPU wheel, then the pinned peer), created once
and reused while its pins are unchanged; the installed versions are recorded in the results.

Measured per run, the tools interleaved in each of ``--repeats`` repeats (the order rotated each
repeat): samples/s of the rounds (samples trained / wall time from the first round's start to the
last round's end, as each tool reports it; exogym: its ``summary.json`` ``train_time_s``), the
rest of the wall time (start-up, final evaluation, exit) separately, peak memory of the tool's
whole process tree (Ray's and torchrun's processes included: ``/proc`` read every 0.2 s, RSS
and PSS summed over the processes, the peak of the sums), and the final accuracy. The table
gives medians; a JSON file keeps every run (``--json``, default under ``--cache``), with the
peers' installed packages.

``--check`` runs ``--check-rounds`` rounds (default 1) of every tool and prints the largest
absolute difference of each one's global model from ``torch_loop``'s: the same workload must give
the same model to float tolerance. ``--draw-seed S`` draws each round's clients from another
seed (the rest unchanged; peers only): how far the draws alone move the final accuracy.

Usage::

    EXOGYM_DATA_DIR=../shared/data python bench/fl_peers.py --check
    EXOGYM_DATA_DIR=../shared/data python bench/fl_peers.py --repeats 3 --rounds 100 \\
        --json fl_peers.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exogym.sim.partition import Partition

REPO = Path(__file__).resolve().parents[1]
PEERS_DIR = REPO / "bench" / "fl_peers"
TORCH_PIN = "torch==2.13.0"
"""Installed first in each peer environment: a bare torch requirement would pull CUDA wheels."""
PEER_PINS: dict[str, tuple[str, ...]] = {
    "flower": ("flwr[simulation]==1.42.0",),
    "pfl": ("pfl==0.6.0",),
}
TOOLS = ("exogym", "flower", "pfl", "pfl-2", "torch_loop")
SAMPLE_INTERVAL_S = 0.2
LABEL_SKEW = Partition(kind="dirichlet", alpha=0.5)


@dataclass(frozen=True)
class WorkloadSpec:
    """The workload's shape (issue 34's defaults)."""

    clients: int = 1000
    """N, the client population (exogym's nodes)."""
    per_round: int = 10
    """K, the clients drawn each round."""
    local_steps: int = 10
    """H, each client's AdamW steps per round."""
    batch_size: int = 8
    """B, samples per step."""
    partition: Partition = LABEL_SKEW
    """How MNIST is split among the clients: Dirichlet(0.5) label skew."""
    rounds: int = 100
    """R, FedAvg rounds."""
    seed: int = 0
    """exogym's seed: the shards, draws, pass orders and initial weights."""
    draw_seed: int | None = None
    """Draw the clients of each round from this seed instead (the rest from ``seed``): the
    peers then train other clients than exogym's run of ``seed`` (how much the draws alone
    move the final accuracy); None: ``seed``."""

    @property
    def samples_per_round(self) -> int:
        return self.per_round * self.local_steps * self.batch_size


def spec_dict(w: WorkloadSpec) -> dict[str, Any]:
    """The spec as JSON data (the partition as its string, ``"dirichlet:0.5"``)."""
    return {**asdict(w), "partition": w.partition.spec}


# -- the exogym side -----------------------------------------------------------------------------
def exogym_command(w: WorkloadSpec, run_dir: Path, data_dir: str | None) -> list[str]:
    """The ``exogym run`` of the workload: ``w.rounds`` rounds of ``H = local_steps`` steps,
    ``K`` clients drawn per round, each with a fresh AdamW (``--client-state fresh``), one
    evaluation (at the end, on the whole test set)."""
    steps = w.rounds * w.local_steps
    cmd = [sys.executable, "-m", "exogym", "run", "--task", "mnist", "--strategy", "fedavg",
           "--nodes", str(w.clients), "--participation", str(w.per_round),
           "--client-state", "fresh", "--set", f"H={w.local_steps}",
           "--partition", w.partition.spec, "--batch-size", str(w.batch_size),
           "--steps", str(steps), "--eval-interval", str(steps), "--seed", str(w.seed),
           "--no-download", "--no-progress", "--out", str(run_dir)]
    return cmd + (["--data-dir", data_dir] if data_dir else [])


def inner_optimizer() -> dict[str, Any]:
    """AdamW's settings in ``exogym run --task mnist --strategy fedavg``: the strategy's
    defaults with the task's learning rate, made as the command line makes them."""
    from exogym import strategy as strategies
    from exogym.tasks import get_task

    optim = strategies.make("fedavg", **{"optim.lr": str(get_task("mnist").lr)}).optim
    if optim.name != "adamw":
        raise RuntimeError(f"exogym's fedavg inner optimizer is {optim.name!r}, not AdamW: the "
                           "peers' clients (AdamW) would no longer match")
    return {"lr": optim.lr, "betas": list(optim.betas), "eps": optim.eps,
            "weight_decay": optim.weight_decay}


def workload_arrays(w: WorkloadSpec, train: Any, test: Any, raw: dict[str, np.ndarray]
                    ) -> dict[str, np.ndarray]:
    """The workload file's arrays (see ``bench/fl_peers/peer_common.py``), from exogym.

    Args:
        w: the workload's shape.
        train, test: exogym's MNIST datasets (``targets`` int64).
        raw: ``{"x_train": uint8 [60000, 28, 28], "x_test": ...}``, the images as in the files.
    """
    from exogym.sim.participation import Participation
    from exogym.sim.sharding import NodeBatches
    from exogym.tasks import get_task, models
    from exogym.tasks.data import mnist

    torch.manual_seed(w.seed)  # as exogym run builds the model
    model = get_task("mnist").build_model()
    batches = NodeBatches(train, w.clients, w.batch_size, seed=w.seed, partition=w.partition)
    assert batches.shards is not None
    draws = Participation(count=w.per_round, seed=w.seed if w.draw_seed is None else w.draw_seed)
    everyone = [True] * w.clients
    clients, orders = [], []
    for r in range(w.rounds):
        chosen = draws.draw(r, everyone)
        ids = [i for i, c in enumerate(chosen) if c]
        steps = [batches.next_indices(chosen)[ids] for _ in range(w.local_steps)]  # [K, B] each
        clients.append(ids)
        orders.append(torch.stack(steps, dim=1))  # [K, H, B]
    meta = {"workload": spec_dict(w), "batch_size": w.batch_size,
            "optim": inner_optimizer(), "mnist_mean": mnist.MEAN, "mnist_std": mnist.STD,
            "model_source": str(Path(models.__file__).resolve())}
    sizes = [len(s) for s in batches.shards]
    return {
        "meta": np.array(json.dumps(meta)),
        "x_train": raw["x_train"], "y_train": train.targets.numpy(),
        "x_test": raw["x_test"], "y_test": test.targets.numpy(),
        **{f"init/{k}": v.detach().numpy() for k, v in model.state_dict().items()},
        "clients": np.array(clients, dtype=np.int64),
        "batches": torch.stack(orders).numpy(),  # [R, K, H, B]
        "shard_ids": torch.cat(batches.shards).numpy(),
        "shard_offsets": np.cumsum([0, *sizes]).astype(np.int64),
    }


def export(w: WorkloadSpec, data_dir: str | None, path: Path) -> Path:
    """Write the workload file (``.npz``) to ``path``."""
    from exogym.tasks.data import mnist

    train, test = mnist.load_mnist(data_dir, download=False)
    raw = {"x_train": mnist.read_idx(train.root / mnist.TRAIN_IMAGES.name).numpy(),
           "x_test": mnist.read_idx(test.root / mnist.TEST_IMAGES.name).numpy()}
    np.savez(path, **workload_arrays(w, train, test, raw))
    return path


# -- the peers' environments ---------------------------------------------------------------------
def peer_python(name: str, cache: Path) -> Path:
    """The interpreter of the peer's virtual environment under ``cache``, created (``torch``
    first, then the peer's pins) unless it exists with the same pins."""
    root = cache / "venvs" / name
    pins = [TORCH_PIN, *PEER_PINS[name]]
    marker = root / "exogym-bench-pins.txt"
    python = root / "bin" / "python"
    if marker.is_file() and marker.read_text().split() == pins and python.exists():
        return python
    print(f"setting up {root}: {' then '.join(pins)}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(root)], check=True)
    log = root / "pip-install.log"
    for pin in pins:
        with open(log, "a") as f:
            rc = subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                                 "--disable-pip-version-check", pin], stdout=f,
                                stderr=subprocess.STDOUT).returncode
        if rc:
            raise RuntimeError(f"pip install {pin} failed in {root}; the end of {log}:\n"
                               + log.read_text(errors="replace")[-3000:])
    freeze = subprocess.run([str(python), "-m", "pip", "freeze"], check=True,
                            capture_output=True, text=True).stdout
    (root / "pip-freeze.txt").write_text(freeze)
    marker.write_text("\n".join(pins) + "\n")
    return python


# -- measuring a process tree --------------------------------------------------------------------
def _proc_table() -> dict[int, tuple[int, int]]:
    """``{pid: (parent pid, session id)}`` of every process."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) "
        table[int(entry.name)] = (int(fields[1]), int(fields[3]))
    return table


def tree(root: int) -> set[int]:
    """``root`` and every process descended from it or in its session (a tool started in a new
    session: daemons that re-parent themselves, Ray's, stay counted)."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    found |= {pid for pid, (_, sid) in table.items() if sid == root}
    return found & (set(table) | {root})


def _memory(pid: int) -> tuple[int, int]:
    """``(RSS, PSS)`` of a process in bytes (0 where it is gone or unreadable)."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    return rss, pss


class TreeMemory(threading.Thread):
    """Samples a process tree's memory every ``interval`` seconds: the peaks of the RSS and PSS
    summed over its processes, and the most processes seen at once."""

    def __init__(self, root: int, interval: float = SAMPLE_INTERVAL_S) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.peak_rss = self.peak_pss = self.most_processes = 0
        self._stop_event = threading.Event()

    def sample(self) -> None:
        pids = tree(self.root)
        sizes = [_memory(pid) for pid in pids]
        self.peak_rss = max(self.peak_rss, sum(s[0] for s in sizes))
        self.peak_pss = max(self.peak_pss, sum(s[1] for s in sizes))
        self.most_processes = max(self.most_processes, sum(1 for s in sizes if s[0]))

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def _end_leftovers(root: int) -> None:
    """Terminate what the tool left running in its session (Ray's daemons), by process id."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = tree(root) - {root}
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if not left:
            return
        time.sleep(2.0)


# -- running the tools ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Context:
    """What a tool's command needs."""

    workload: WorkloadSpec
    workload_file: Path
    data_dir: str | None
    cache: Path
    work: Path  # a scratch folder for this run


def command(tool: str, ctx: Context, save_model: Path | None) -> tuple[list[str], Path]:
    """``(argv, where its result lands)``: ``summary.json`` of exogym's run folder, else the
    peer's result file."""
    if tool == "exogym":
        run_dir = ctx.work / "exogym-run"
        return exogym_command(ctx.workload, run_dir, ctx.data_dir), run_dir / "summary.json"
    result = ctx.work / "result.json"
    args = ["--workload", str(ctx.workload_file), "--rounds", str(ctx.workload.rounds),
            "--out", str(result)] + (["--save-model", str(save_model)] if save_model else [])
    if tool == "torch_loop":
        return [sys.executable, str(PEERS_DIR / "torch_loop.py"), *args], result
    if tool == "flower":
        python = peer_python("flower", ctx.cache)
        return [str(python), str(PEERS_DIR / "flower_fedavg.py"), *args], result
    python = peer_python("pfl", ctx.cache)
    script = str(PEERS_DIR / "pfl_fedavg.py")
    if tool == "pfl":
        return [str(python), script, *args], result
    if tool == "pfl-2":
        torchrun = python.parent / "torchrun"
        return [str(torchrun), "--standalone", "--nnodes=1", "--nproc_per_node=2", script,
                *args], result
    raise ValueError(f"unknown tool {tool!r}; known: {', '.join(TOOLS)}")


def run_tool(tool: str, ctx: Context, *, repeat: int = 0, save_model: Path | None = None,
             timeout_s: float = 3600.0) -> dict[str, Any]:
    """Run one tool once and measure it; returns the run's record."""
    ctx.work.mkdir(parents=True, exist_ok=True)
    argv, result_path = command(tool, ctx, save_model)
    path = os.pathsep.join([str(PEERS_DIR), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = dict(os.environ, PYTHONPATH=path, FLWR_TELEMETRY_ENABLED="0",
               RAY_USAGE_STATS_ENABLED="0")
    log_path = ctx.work / "log.txt"
    with open(log_path, "w") as log:
        t0 = time.time()
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        memory = TreeMemory(proc.pid)
        memory.start()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
        wall = time.time() - t0
        memory.stop()
    _end_leftovers(proc.pid)
    record: dict[str, Any] = {"tool": tool, "repeat": repeat, "rc": rc, "wall_s": wall,
                              "peak_rss_bytes": memory.peak_rss, "peak_pss_bytes": memory.peak_pss,
                              "most_processes": memory.most_processes, "log": str(log_path)}
    if rc != 0 or not result_path.is_file():
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{tool} failed (exit {rc}); the end of {log_path}:\n{tail}")
    out = json.loads(result_path.read_text())
    if tool == "exogym":
        record.update(rounds_s=out["train_time_s"], samples=out["samples"],
                      accuracy=out["final"]["eval_accuracy"],
                      eval_loss=out["final"]["eval_loss"], versions=_own_versions())
    else:
        record.update({k: out[k] for k in ("rounds_s", "samples", "accuracy", "eval_loss",
                                           "versions", "round_s")})
        record.update({k: out[k] for k in ("discovery_s",) if k in out})
        record["startup_s"] = out["t_rounds_start"] - t0
    record["samples_per_s"] = record["samples"] / record["rounds_s"]
    record["other_s"] = wall - record["rounds_s"]
    return record


def _own_versions() -> dict[str, str]:
    import importlib.metadata

    return {"python": platform.python_version(), "torch": torch.__version__,
            "numpy": np.__version__, "exogym": importlib.metadata.version("exogym")}


def interleaved(tools: Sequence[str], repeats: int) -> list[tuple[int, str]]:
    """``(repeat, tool)`` in running order: every tool once per repeat, the order rotated by one
    each repeat (so no tool always runs first, or right after the same one)."""
    order = []
    for rep in range(repeats):
        k = rep % len(tools)
        order += [(rep, t) for t in [*tools[k:], *tools[:k]]]
    return order


# -- the report ----------------------------------------------------------------------------------
PROCESSES = {"exogym": "1 (threads engine)", "flower": "Ray: 2 actors + driver",
             "pfl": "1", "pfl-2": "2 (torchrun)", "torch_loop": "1 (1 thread)"}


def table(records: Sequence[dict[str, Any]]) -> str:
    """The markdown table: one row per tool (first-seen order), medians over its repeats."""
    head = ("| tool | processes | samples/s (rounds) | peak RSS GB (sum) | peak PSS GB (sum) "
            "| start-up + eval s | final accuracy | repeats |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    tools = list(dict.fromkeys(r["tool"] for r in records))
    for tool in tools:
        runs = [r for r in records if r["tool"] == tool]

        def med(key: str, runs: list[dict[str, Any]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        accuracies = sorted({f"{100 * r['accuracy']:.2f}%" for r in runs})
        lines.append(
            f"| {tool} | {PROCESSES.get(tool, '?')} | {med('samples_per_s'):,.0f} "
            f"| {med('peak_rss_bytes') / 1e9:.2f} | {med('peak_pss_bytes') / 1e9:.2f} "
            f"| {med('other_s'):.1f} | {' / '.join(accuracies)} | {len(runs)} |")
    return "\n".join(lines)


def max_abs_diffs(models: dict[str, dict[str, np.ndarray]], reference: str
                  ) -> dict[str, float]:
    """Each model's largest absolute difference from ``reference``'s, over all tensors."""
    ref = models[reference]
    return {name: max(float(np.abs(m[k] - ref[k]).max()) for k in ref)
            for name, m in models.items() if name != reference}


def _load_model(path: Path) -> dict[str, np.ndarray]:
    if path.suffix == ".pt":
        return {k: v.numpy() for k, v in torch.load(path, weights_only=True).items()}
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


# -- the command line ----------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tools", default=",".join(TOOLS),
                   help=f"comma-separated, from {', '.join(TOOLS)} (default: all)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each tool (default 3)")
    p.add_argument("--rounds", type=int, default=100, help="FedAvg rounds (default 100)")
    p.add_argument("--seed", type=int, default=0, help="exogym's seed (default 0)")
    p.add_argument("--draw-seed", type=int, default=None,
                   help="draw each round's clients from this seed, the rest from --seed "
                        "(peers only: exogym's draws follow --seed)")
    p.add_argument("--data-dir", default=None,
                   help="MNIST's folder's parent (default: $EXOGYM_DATA_DIR, as exogym)")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "exogym-bench",
                   help="where the peers' virtual environments live (default "
                        "~/.cache/exogym-bench)")
    p.add_argument("--workload", type=Path, default=None,
                   help="keep the workload file here (default: a temporary folder)")
    p.add_argument("--json", type=Path, default=None,
                   help="write every run's record here (default: "
                        "CACHE/fl_peers-YYYYmmdd-HHMMSS.json)")
    p.add_argument("--check", action="store_true",
                   help="run --check-rounds rounds of every tool once and compare the global "
                        "models with torch_loop's")
    p.add_argument("--check-rounds", type=int, default=1, help="rounds of --check (default 1)")
    p.add_argument("--setup-only", action="store_true",
                   help="create the peers' environments, then stop")
    a = p.parse_args(argv)
    a.tools = [t.strip() for t in a.tools.split(",") if t.strip()]
    unknown = [t for t in a.tools if t not in TOOLS]
    if unknown:
        p.error(f"unknown tools {unknown}; known: {', '.join(TOOLS)}")
    if a.repeats < 1 or a.rounds < 1 or a.check_rounds < 1:
        p.error("--repeats, --rounds and --check-rounds must be >= 1")
    if a.draw_seed not in (None, a.seed) and "exogym" in a.tools:
        p.error("--draw-seed applies to the peers only (exogym draws from --seed): leave "
                "exogym out of --tools")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    environments = {}
    for name in PEER_PINS:
        if a.setup_only or any(t.startswith(name) for t in a.tools):
            python = peer_python(name, a.cache)
            freeze = python.parents[1] / "pip-freeze.txt"
            environments[name] = {"path": str(python.parents[1]),
                                  "pins": [TORCH_PIN, *PEER_PINS[name]],
                                  "installed": freeze.read_text().split()}
            print(f"{name}: {python.parents[1]} ({', '.join(environments[name]['pins'])})")
    if a.setup_only:
        return 0
    rounds = a.check_rounds if a.check else a.rounds
    w = WorkloadSpec(rounds=rounds, seed=a.seed, draw_seed=a.draw_seed)
    scratch = Path(tempfile.mkdtemp(prefix="exogym-fl-peers-"))
    done = False
    try:
        path = a.workload or scratch / "workload.npz"
        t = time.time()
        export(w, a.data_dir, path)
        print(f"workload: {path} ({path.stat().st_size / 1e6:.0f} MB, {time.time() - t:.1f} s)",
              flush=True)

        def ctx(tool: str, rep: int) -> Context:
            return Context(w, path, a.data_dir, a.cache, scratch / f"{tool}-{rep}")

        if a.check:
            _check(a.tools, ctx, scratch)
            done = True
            return 0
        records = []
        for rep, tool in interleaved(a.tools, a.repeats):
            record = run_tool(tool, ctx(tool, rep), repeat=rep)
            records.append(record)
            print(f"  repeat {rep} {tool}: {record['samples_per_s']:,.0f} samples/s, "
                  f"{record['peak_rss_bytes'] / 1e9:.2f} GB RSS, "
                  f"{100 * record['accuracy']:.2f}%", flush=True)
        print(table(records))
        out = a.json or a.cache / time.strftime("fl_peers-%Y%m%d-%H%M%S.json")
        out.write_text(json.dumps({"workload": spec_dict(w), "machine": _machine(),
                                   "command": [sys.executable, *sys.argv],
                                   "environments": environments, "runs": records}, indent=1))
        print(f"every run: {out}")
        done = True
        return 0
    finally:
        if done:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            print(f"the runs' logs are kept in {scratch}", file=sys.stderr)


def _check(tools: Sequence[str], ctx: Callable[[str, int], Context], scratch: Path) -> None:
    """Every tool once on the check workload; max abs difference of each global model from
    torch_loop's."""
    models = {}
    for tool in dict.fromkeys(["torch_loop", *tools]):
        c = ctx(tool, 0)
        saved = scratch / f"{tool}-model.npz"
        record = run_tool(tool, c, save_model=None if tool == "exogym" else saved)
        models[tool] = _load_model(c.work / "exogym-run" / "model.pt" if tool == "exogym"
                                   else saved)
        print(f"{tool}: accuracy {100 * record['accuracy']:.2f}%, versions {record['versions']}",
              flush=True)
    for tool, diff in max_abs_diffs(models, "torch_loop").items():
        print(f"{tool}: max |global model - torch_loop's| = {diff:.3g}")


def _machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__}


if __name__ == "__main__":
    sys.exit(main())
