#!/usr/bin/env python
"""exogym on one GPU: its device tests, its engines beside plain PyTorch, and paging; one table,
and ``gpu_check.json`` in ``--out`` (default ``$OUT``, else a temporary folder).

    bash bench/gpu_check.sh                           # one GPU; sized for 8 minutes at most
    python bench/gpu_check.py --device cpu --quick    # CI (tests/run/test_devices.py): < 1 minute

No GPU has run it yet: the sizes below are estimates (about 4 minutes on an H100), and
``--time-limit`` (450 s) skips any part, cell or round that would start later.

Parts (``--parts``, default all three):

1. ``tests``: ``python -m pytest -m cuda tests/run/test_devices.py`` with ``EXOGYM_TEST_DEVICE`` set
   to the device: the engines against each other and against the CPU, bf16, gradient
   accumulation, paging to (pinned) host memory, a checkpoint written on the device and resumed,
   two processes (nccl where there are 2 GPUs, else gloo); the counts from pytest's JUnit XML.
2. ``engines``: for each model and N, in ONE process, samples/s (summed over nodes) of
   ``plain`` PyTorch (one model, the strategy's AdamW, one batch of ``N x B`` rows: the same
   samples per step; bench/throughput.py's baseline loop) and of exogym's ``loop``, ``threads``
   (CPU only: it runs nodes in CPU threads) and ``vmap`` engines with DiLoCo (H = 50), N nodes of
   batch B each (bench/throughput.py's exogym loop, inside ``NodeStack.stepping()`` as
   ``Trainer.fit`` steps). A timed round is H steps (one outer step); the sides' rounds alternate
   (order reversed every other repeat, as bench/engines.py does: a machine's speed drifts over
   minutes), and the table gives the median of ``--repeats`` rounds and of the per-round ratios.
   Peak GPU memory of a side: the sides of a cell are built one after another and each runs one
   untimed round (warm-up, an outer step included) right after it is built; its peak is
   ``torch.cuda.max_memory_allocated`` over that round less what was allocated before it was
   built (the data and the sides built before it, idle meanwhile). Models: ``mnist_cnn``
   (exogym's MNIST CNN, batch 64), ``gpt`` (the Shakespeare GPT of bench/engines.py, 4 x 128,
   block 64, batch 64), ``nanogpt`` (GPT-2 small's shape: 12 layers, 12 heads, 768 wide,
   vocabulary 50304, block 1024, random tokens; batch 2) at N = 1, 8 and 32 (nanogpt: 1 and 8:
   32 replicas with AdamW's state hold 64 GB before any activation, and a cell's sides live
   side by side). On CUDA the measurement allows TF32 (as nanoGPT's train.py does), both sides
   alike. ``--quick``: tiny sizes, H = 2 (and one intra-op thread on a CPU). Where the GPU has a
   device profile (exogym.sim.devices: H200, H100, A100, L4, RTX 4090, RTX 3090), the plain
   row also gives exogym's prediction of its samples/s: one step of the same model and rows
   counted and priced on that profile, as a run's steps are (docs/devices.md).
3. ``paging``: ``Trainer.fit`` of DiLoCo (H = 50), 32 nodes of the MNIST CNN (batch 64), 3 H
   steps, the loop engine (what a paged run uses), in memory and with ``resident=8,
   offload="host"`` (pinned host buffers on CUDA), alternating; samples/s over the last 2 H
   steps (the logged rows' wall times: the first round warms up), paging's share of the
   training time (``summary["paging"]["seconds"]``).

Warnings raised while measuring (vmap's slow fallbacks for an operator without a batching rule,
say) are kept in the JSON, a list per part.

Goals (issue 37; they apply to a GPU run without ``--quick``): every device test passes; 8 nodes
of nanogpt at >= 0.9x plain's samples/s with the engine ``engine="auto"`` picks (vmap on CUDA);
vmap >= 3x loop at N = 32 for mnist_cnn; paged >= 0.9x in memory. The JSON holds each goal's
value and whether it is met, the device, torch, every side's rates and the tests' outcome. The
exit status is 1 when a device test failed or a measurement raised, else 0 (goals not met
included: a benchmark, not a test). A part or cell that would start after ``--time-limit``
seconds is skipped and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import engines as engines_bench  # bench/engines.py: the models
import throughput  # bench/throughput.py: the timed loops, the machine's description
import torch
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from exogym.run.trainer import Trainer
from exogym.sim.comm import InProcessCommunicator
from exogym.sim.devices import PROFILES, DeviceProfile
from exogym.sim.engine import NodeStack, auto_engine
from exogym.sim.flops import count_step
from exogym.strategy import make
from exogym.tasks.gpt import GPT, GPTConfig

REPO = Path(__file__).resolve().parents[1]
SIDES = ("plain", "loop", "threads", "vmap")
NANOGPT_124M = dict(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768)
NANOGPT_TINY = dict(vocab_size=512, block_size=32, n_layer=2, n_head=2, n_embd=64)
GPT_TINY = dict(vocab_size=65, block_size=16, n_layer=2, n_head=2, n_embd=32)
TARGETS = {"nanogpt_diloco_vs_plain": 0.9, "vmap_vs_loop_mnist": 3.0,
           "paging_host_vs_memory": 0.9}


@dataclass(frozen=True)
class Cell:
    """A model's measurements: ``batch`` rows per node, at each N in ``nodes``."""

    model: str
    batch: int
    nodes: tuple[int, ...]


@dataclass(frozen=True)
class Sizes:
    cells: tuple[Cell, ...]
    gpts: dict[str, dict[str, int] | None]  # a GPT's sizes; None: bench/engines.py's model
    H: int
    repeats: int
    paging_nodes: int
    paging_resident: int
    paging_batch: int
    goal_nodes: dict[str, int]  # the N each goal is read at


FULL = Sizes(cells=(Cell("mnist_cnn", 64, (1, 8, 32)), Cell("gpt", 64, (1, 8, 32)),
                    Cell("nanogpt", 2, (1, 8))),
             gpts={"gpt": None, "nanogpt": NANOGPT_124M}, H=50, repeats=3,
             paging_nodes=32, paging_resident=8, paging_batch=64,
             goal_nodes={"nanogpt": 8, "mnist_cnn": 32})
QUICK = Sizes(cells=(Cell("mnist_cnn", 8, (1, 2)), Cell("gpt", 4, (1, 2)),
                     Cell("nanogpt", 2, (1, 2))),
              gpts={"gpt": GPT_TINY, "nanogpt": NANOGPT_TINY}, H=2, repeats=2,
              paging_nodes=4, paging_resident=2, paging_batch=8,
              goal_nodes={"nanogpt": 2, "mnist_cnn": 2})


class Clock:
    """The run's time limit: what would start after it is skipped."""

    def __init__(self, limit_s: float) -> None:
        self.start, self.limit_s = time.perf_counter(), limit_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def over(self) -> bool:
        return self.elapsed() > self.limit_s


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


@contextlib.contextmanager
def _warnings_kept() -> Iterator[list[str]]:
    """The distinct warnings raised inside, each by its first line (into the yielded list)."""
    kept: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield kept
    for w in caught:
        text = f"{w.category.__name__}: {str(w.message).strip().splitlines()[0][:200]}"
        if text not in kept:
            kept.append(text)


def _error(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"[:300]


# -- 1. the device tests ----------------------------------------------------------------------
def run_tests(device: torch.device, clock: Clock) -> dict[str, Any]:
    """``pytest -m cuda tests/run/test_devices.py`` on ``device``, in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="exogym-gpu-check-") as tmp:
        xml = Path(tmp) / "tests.xml"
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "EXOGYM_TEST_DEVICE": str(device), "EXOGYM_GPU_CHECK": "1",
               "PYTHONPATH": str(REPO) + (os.pathsep + path if path else "")}
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider",
               f"--junitxml={xml}", str(REPO / "tests" / "run" / "test_devices.py")]
        t0 = time.perf_counter()
        try:
            done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                                  timeout=max(60.0, clock.limit_s - clock.elapsed()),
                                  check=False)
        except subprocess.TimeoutExpired as err:
            return {"passed": 0, "failed": 0, "errors": 1, "skipped": 0, "seconds":
                    time.perf_counter() - t0, "failures": [f"timed out after {err.timeout:.0f} s"],
                    "output": ""}
        seconds = time.perf_counter() - t0
        if not xml.exists():
            return {"passed": 0, "failed": 0, "errors": 1, "skipped": 0, "seconds": seconds,
                    "failures": [f"pytest exit code {done.returncode}, no report"],
                    "output": (done.stdout + done.stderr)[-4000:]}
        root = ET.parse(xml).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failures = [case.get("name", "?") for case in suite.iter("testcase")
                if case.find("failure") is not None or case.find("error") is not None]
    return {"passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "failed": counts["failures"], "errors": counts["errors"],
            "skipped": counts["skipped"], "seconds": seconds, "failures": failures,
            "output": (done.stdout + done.stderr)[-4000:] if failures else ""}


# -- 2. engines beside plain PyTorch ----------------------------------------------------------
def build_model(name: str, sizes: Sizes) -> nn.Module:
    torch.manual_seed(0)
    config = sizes.gpts.get(name)
    return engines_bench.build(name) if config is None else GPT(GPTConfig(**config))


def batches(name: str, model: nn.Module, pool: int, batch: int,
            device: torch.device) -> tuple[Tensor, Tensor]:
    """``pool`` batches of ``batch`` rows, ``[pool, batch, ...]``, random, on ``device``."""
    g = torch.Generator().manual_seed(0)
    if name == "mnist_cnn":
        xs = torch.randn(pool, batch, 1, 28, 28, generator=g)
        ys = torch.randint(0, 10, (pool, batch), generator=g)
    else:
        cfg = model.config  # type: ignore[union-attr]
        shape = (pool, batch, cfg.block_size)
        xs = torch.randint(0, cfg.vocab_size, shape, generator=g)
        ys = torch.randint(0, cfg.vocab_size, shape, generator=g)
    return xs.to(device), ys.to(device)


def plain_side(model: nn.Module, xs: Tensor, ys: Tensor, n: int, H: int,
               device: torch.device) -> Callable[[], float]:
    """One model, the strategy's inner AdamW, batches of the N nodes' rows together."""
    net = copy.deepcopy(model).to(device).train()
    optimizer = make("diloco", H=H).optim.build(list(net.parameters()))
    bx, by = (t.view(t.shape[0] // n, n * t.shape[1], *t.shape[2:]) for t in (xs, ys))
    return lambda: throughput._time_baseline(net, optimizer, bx, by, 1, 0, H, device, None)[0]


def exogym_side(model: nn.Module, xs: Tensor, ys: Tensor, n: int, H: int, engine: str,
                device: torch.device) -> tuple[Callable[[], float], NodeStack]:
    """N nodes with DiLoCo (H inner steps, one outer step a round), as ``Trainer.fit`` steps."""
    nodes = NodeStack(model, n, device=device, engine=engine)  # type: ignore[arg-type]
    comm = InProcessCommunicator(n)
    strategy = make("diloco", H=H)
    strategy.setup(nodes, comm, 10**9)

    def run() -> float:
        with nodes.stepping():
            return throughput._time_exogym(nodes, strategy, comm, xs, ys, 0, H, device,
                                           None)[0]
    return run, nodes


def device_profile_of(device: torch.device) -> DeviceProfile | None:
    """The device profile (exogym.sim.devices) of this GPU, by its name; None: none matches."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_properties(device).name.lower().replace(" ", "")
    for key in ("h200", "h100", "a100", "l4", "4090", "3090"):
        if key in name:
            return PROFILES[key if key[0] != "4" and key[0] != "3" else f"rtx{key}"]
    return None


def predict_plain(name: str, model: nn.Module, rows: int,
                  device: torch.device) -> dict[str, Any] | None:
    """exogym's predicted samples/s of the plain side (one model, ``rows`` rows a step, AdamW)
    on this GPU's profile: the same count and roofline that price a run's steps."""
    profile = device_profile_of(device)
    if profile is None:
        return None
    xs, ys = batches(name, model, 1, rows, torch.device("cpu"))
    count = count_step(model, (xs[0], ys[0]), make("diloco").optim)
    step = profile.step_time(count)
    return {"profile": profile.name, "step_time_s": step, "samples_per_s": rows / step}


def measure_cell(cell: Cell, n: int, sizes: Sizes, device: torch.device,
                 clock: Clock) -> dict[str, Any]:
    """Every side of one (model, N): built and warmed one after another, then interleaved."""
    H = sizes.H
    model = build_model(cell.model, sizes)
    xs, ys = batches(cell.model, model, 2 * n, cell.batch, device)
    out: dict[str, Any] = {"model": cell.model, "nodes": n, "batch": cell.batch, "H": H,
                           "parameters": sum(p.numel() for p in model.parameters()),
                           "sides": {}}
    runs: dict[str, Callable[[], float]] = {}
    stacks: dict[str, NodeStack] = {}
    samples = {s: n * cell.batch * H for s in SIDES}
    for side in SIDES:
        record: dict[str, Any] = {"samples_per_s": None, "rates": [], "peak_mb": None,
                                  "engine": None, "error": None, "skipped": None}
        out["sides"][side] = record
        if side == "threads" and device.type != "cpu":
            record["skipped"] = "the threads engine runs nodes in CPU threads"
            continue
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        try:
            if side == "plain":
                runs[side] = plain_side(model, xs, ys, n, H, device)
            else:
                runs[side], stacks[side] = exogym_side(model, xs, ys, n, H, side, device)
            runs[side]()  # warm-up: kernels chosen, optimizer state allocated, an outer step
            if side in stacks:
                record["engine"] = stacks[side].engine  # vmap falls back to the loop if it must
            if device.type == "cuda":
                record["peak_mb"] = (torch.cuda.max_memory_allocated(device) - base) / 1e6
        except Exception as err:  # an out-of-memory or a broken path: named, the rest goes on
            record["error"] = _error(err)
            runs.pop(side, None)
            stacks.pop(side, None)
            _free(device)
    for r in range(sizes.repeats):
        if clock.over():
            out["skipped_rounds"] = sizes.repeats - r
            break
        for side in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            try:
                out["sides"][side]["rates"].append(samples[side] / runs[side]())
            except Exception as err:
                out["sides"][side]["error"] = _error(err)
                runs.pop(side)
    for record in out["sides"].values():
        if record["rates"]:
            record["samples_per_s"] = statistics.median(record["rates"])
    out["predicted"] = predict_plain(cell.model, model, n * cell.batch, device)
    out["ratios"] = {}
    for a, b in [(s, "plain") for s in SIDES[1:]] + [("vmap", "loop")]:
        ra, rb = out["sides"][a]["rates"], out["sides"][b]["rates"]
        if ra and len(ra) == len(rb):
            out["ratios"][f"{a}/{b}"] = statistics.median(x / y for x, y in zip(ra, rb,
                                                                              strict=True))
    del runs, stacks, xs, ys, model
    _free(device)
    return out


def run_engines(sizes: Sizes, device: torch.device, clock: Clock) -> list[dict[str, Any]]:
    cells = []
    for cell in sizes.cells:
        for n in cell.nodes:
            if clock.over():
                cells.append({"model": cell.model, "nodes": n, "batch": cell.batch,
                              "skipped": "time limit", "sides": {}, "ratios": {}})
                continue
            t0 = time.perf_counter()
            with _warnings_kept() as kept:
                cells.append(measure_cell(cell, n, sizes, device, clock))
            cells[-1]["seconds"] = time.perf_counter() - t0
            cells[-1]["warnings"] = kept
            print(f"  engines: {cell.model} N={n} in {cells[-1]['seconds']:.1f} s",
                  file=sys.stderr, flush=True)
    return cells


# -- 3. paging to host memory -----------------------------------------------------------------
def run_paging(sizes: Sizes, device: torch.device, clock: Clock) -> dict[str, Any]:
    """DiLoCo on the MNIST CNN in memory and paged to host memory, alternating."""
    H, n, b = sizes.H, sizes.paging_nodes, sizes.paging_batch
    g = torch.Generator().manual_seed(0)
    samples = n * b * 4  # 4 batches a node, cycled over epochs
    data = TensorDataset(torch.randn(samples, 1, 28, 28, generator=g),
                         torch.randint(0, 10, (samples,), generator=g))
    kinds = {"in_memory": {}, "paged": {"resident": sizes.paging_resident, "offload": "host"}}
    out: dict[str, Any] = {"model": "mnist_cnn", "nodes": n, "batch": b, "H": H,
                           "resident": sizes.paging_resident, "offload": "host",
                           "pinned": device.type == "cuda"}
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for r in range(sizes.repeats):
        if clock.over():
            out["skipped_rounds"] = sizes.repeats - r
            break
        for kind in (list(kinds) if r % 2 == 0 else list(kinds)[::-1]):
            result = Trainer(build_model("mnist_cnn", sizes), data).fit(
                strategy=make("diloco", H=H), num_nodes=n, max_steps=3 * H, batch_size=b,
                log_interval=H, engine="loop", device=device, seed=0, progress=False,
                network=None, **kinds[kind])
            wall = {row["step"]: row["wall_s"] for row in result.history}
            paging = result.paging or {}
            rows[kind].append({  # the first round (warm-up) left out of the rate
                "samples_per_s": n * b * 2 * H / (wall[3 * H] - wall[H]),
                "paging_share": paging.get("seconds", 0.0) / result.train_time_s,
                "bytes_read": paging.get("bytes_read", 0)})
    for kind, got in rows.items():
        out[kind] = {k: statistics.median(row[k] for row in got) for k in got[0]} if got else None
    if rows["paged"] and rows["in_memory"]:
        out["paged/in_memory"] = statistics.median(
            p["samples_per_s"] / m["samples_per_s"]
            for p, m in zip(rows["paged"], rows["in_memory"], strict=True))
    return out


# -- the report ---------------------------------------------------------------------------------
def goals(report: dict[str, Any], sizes: Sizes, device: torch.device) -> dict[str, Any]:
    """Each goal: target, measured value (None: not measured), met."""
    out: dict[str, Any] = {}
    tests = report.get("tests")
    if tests is not None:
        ran = tests["passed"] + tests["failed"] + tests["errors"]
        out["device_tests"] = {"target": 1.0, "value": tests["passed"] / ran if ran else None,
                               "met": ran > 0 and tests["failed"] == tests["errors"] == 0,
                               "what": "share of the device tests that pass"}

    def ratio(model: str, key: str) -> tuple[float | None, int]:
        nodes = sizes.goal_nodes[model]
        cell = next((c for c in report.get("engines", []) if c["model"] == model
                     and c["nodes"] == nodes), None)
        return (None if cell is None else cell["ratios"].get(key)), nodes

    if "engines" in report:
        auto = auto_engine(device, sizes.goal_nodes["nanogpt"])
        value, nodes = ratio("nanogpt", f"{auto}/plain")
        out["nanogpt_diloco_vs_plain"] = {
            "what": f"nanogpt, {nodes} nodes, DiLoCo H={sizes.H}, engine {auto} (auto's), "
                    "samples/s over plain PyTorch's at the same total batch"}
        out["nanogpt_diloco_vs_plain"].update(_met("nanogpt_diloco_vs_plain", value))
        value, nodes = ratio("mnist_cnn", "vmap/loop")
        out["vmap_vs_loop_mnist"] = {"what": f"mnist_cnn, {nodes} nodes: vmap's samples/s over "
                                             "the loop's"}
        out["vmap_vs_loop_mnist"].update(_met("vmap_vs_loop_mnist", value))
    if "paging" in report:
        p = report["paging"]
        out["paging_host_vs_memory"] = {"what": f"mnist_cnn, {p['nodes']} nodes, resident "
                                                f"{p['resident']}, host: samples/s paged over "
                                                "in memory"}
        out["paging_host_vs_memory"].update(_met("paging_host_vs_memory",
                                                 p.get("paged/in_memory")))
    return out


def _met(goal: str, value: float | None) -> dict[str, Any]:
    return {"target": TARGETS[goal], "value": value,
            "met": value is not None and value >= TARGETS[goal]}


def _num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def table(report: dict[str, Any]) -> str:
    """The report as one markdown table (a row per side, and paging's two runs) and the goals."""
    dev = report["device"]
    lines = [f"# exogym GPU check: {dev['type']} ({dev['name']}), torch {report['torch']}, "
             f"{'quick' if report['quick'] else 'full'}, {report['elapsed_s']:.0f} s"]
    tests = report.get("tests")
    if tests is not None:
        lines.append(f"device tests: {tests['passed']} passed, {tests['failed']} failed, "
                     f"{tests['errors']} errors, {tests['skipped']} skipped "
                     f"({tests['seconds']:.0f} s)" + "".join(f"\n  FAILED {name}"
                                                           for name in tests["failures"]))
    lines += ["samples/s summed over nodes, medians of interleaved rounds; DiLoCo, AdamW; "
              "plain = one model, the N nodes' rows in one batch; peak = GPU MB of the side", "",
              "| part | model | N | side | samples/s | vs plain | peak MB | note |",
              "|---|---|---|---|---|---|---|---|"]
    for cell in report.get("engines", []):
        if cell.get("skipped"):
            lines.append(f"| engines | {cell['model']} | {cell['nodes']} | - | - | - | - | "
                         f"skipped: {cell['skipped']} |")
            continue
        for side, rec in cell["sides"].items():
            note = rec["error"] or rec["skipped"] or ""
            if rec["engine"] not in (None, side):
                note = f"ran {rec['engine']}"
            if side == "vmap" and "vmap/loop" in cell["ratios"]:
                note = (note + "; " if note else "") + f"{cell['ratios']['vmap/loop']:.2f}x loop"
            vs = cell["ratios"].get(f"{side}/plain")
            name = side if side != "plain" else f"plain ({cell['batch']}N rows)"
            guess = cell.get("predicted")
            if side == "plain" and guess and rec["samples_per_s"]:
                note = (note + "; " if note else "") + (
                    f"predicted on {guess['profile']}: {_num(guess['samples_per_s'])} "
                    f"({100 * (guess['samples_per_s'] / rec['samples_per_s'] - 1):+.0f}%)")
            lines.append(f"| engines | {cell['model']} | {cell['nodes']} | {name} | "
                         f"{_num(rec['samples_per_s'])} | {_num(vs, 2)} | "
                         f"{_num(rec['peak_mb'])} | {note} |")
    p = report.get("paging")
    if p is not None:
        for kind in ("in_memory", "paged"):
            rec = p.get(kind) or {}
            note = (f"resident {p['resident']}, host{' (pinned)' if p['pinned'] else ''}, "
                    f"paging {100 * rec['paging_share']:.1f}% of the time, "
                    f"{rec['bytes_read'] / 1e6:,.0f} MB read; "
                    f"{p.get('paged/in_memory', float('nan')):.2f}x in memory"
                    if kind == "paged" and rec else "")
            lines.append(f"| paging | {p['model']} | {p['nodes']} | {kind} | "
                         f"{_num(rec.get('samples_per_s'))} | - | - | {note} |")
    lines.append("")
    seen: dict[str, list[str]] = {}
    for cell in report.get("engines", []):
        for text in cell.get("warnings", []):
            seen.setdefault(text, []).append(f"{cell['model']} N={cell['nodes']}")
    for text in (p or {}).get("warnings", []):
        seen.setdefault(text, []).append("paging")
    lines += [f"- warned ({', '.join(where)}): {text}" for text, where in seen.items()]
    for name, goal in report["goals"].items():
        value = "-" if goal["value"] is None else f"{goal['value']:.2f}"
        lines.append(f"- goal {name}: {value} (target {goal['target']:g}) "
                     f"{'met' if goal['met'] else 'NOT met'}: {goal['what']}")
    if not report["goals_apply"]:
        lines.append("  (the goals apply to a GPU run without --quick)")
    return "\n".join(lines)


def describe_device(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"type": "cuda", "name": props.name, "count": torch.cuda.device_count(),
                "memory_gb": props.total_memory / 1e9,
                "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda}
    return {"type": device.type, "name": throughput.machine_info()["cpu"],
            "count": os.cpu_count(), "threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="where everything runs (default: cuda)")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes and H = 2: the whole path in under a minute on a CPU")
    p.add_argument("--parts", default="tests,engines,paging",
                   help="comma-separated among tests, engines, paging (default: all)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed rounds per side (default: 3; --quick 2)")
    p.add_argument("--time-limit", type=float, default=450.0,
                   help="seconds after which no part, cell or round starts (default: 450)")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for gpu_check.json (default: $OUT if set, else a temporary one)")
    args = p.parse_args(argv)
    parts = [s.strip() for s in args.parts.split(",") if s.strip()]
    if not parts or set(parts) - {"tests", "engines", "paging"}:
        p.error(f"--parts takes tests, engines, paging; got {args.parts!r}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch.cuda.is_available() is False (--device cpu --quick "
                "runs the check on a CPU)")
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    sizes = QUICK if args.quick else FULL
    if args.quick and args.device == "cpu":
        # the numbers are not the point here: one intra-op thread, so that a loaded machine (CI,
        # a test run beside) cannot stall every parallel region waiting for a second thread
        torch.set_num_threads(1)
    if args.repeats is not None:
        sizes = dataclasses.replace(sizes, repeats=args.repeats)
    out_dir = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else
                           Path(tempfile.mkdtemp(prefix="exogym-gpu-check-")))
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    clock = Clock(args.time_limit)
    report: dict[str, Any] = {
        "command": " ".join(["python", "bench/gpu_check.py", *(sys.argv[1:] if argv is None
                                                                else argv)]),
        "device": describe_device(device), "torch": torch.__version__,
        "machine": throughput.machine_info(), "quick": args.quick,
        "goals_apply": device.type == "cuda" and not args.quick,
        "sizes": asdict(sizes), "tf32": device.type == "cuda", "skipped_parts": []}
    for part in parts:
        if clock.over():
            report["skipped_parts"].append(part)
            continue
        print(f"gpu_check: {part} ({clock.elapsed():.0f} s)", file=sys.stderr, flush=True)
        if part == "tests":
            report["tests"] = run_tests(device, clock)
            continue
        tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        if device.type == "cuda":  # both sides alike; nanoGPT's train.py does the same
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            if part == "engines":
                report["engines"] = run_engines(sizes, device, clock)
            else:
                with _warnings_kept() as kept:
                    report["paging"] = run_paging(sizes, device, clock)
                report["paging"]["warnings"] = kept
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    report["elapsed_s"] = clock.elapsed()
    report["goals"] = goals(report, sizes, device)
    tests = report.get("tests")
    broken = [f"{c['model']} N={c['nodes']} {side}: {rec['error']}"
              for c in report.get("engines", []) for side, rec in c["sides"].items()
              if rec["error"]]
    report["errors"] = broken
    report["ok"] = not broken and (tests is None or tests["failed"] == tests["errors"] == 0)
    path = out_dir / "gpu_check.json"
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(table(report))
    if tests is not None and tests["output"]:
        print("\n" + tests["output"], file=sys.stderr)
    for line in broken:
        print(f"ERROR {line}", file=sys.stderr)
    print(f"\nwrote {path}", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
