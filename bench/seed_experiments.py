#!/usr/bin/env python
"""Reproduce the two experiments of the original EXO Gym post (seed document 000) with the CLI.

1. **CIFAR CNN, 1 node vs 2 nodes with DiLoCo** (the post's Figure 3: CIFAR-100, "with a single
   node, the first time we reach an evaluation loss below 2.5 is after 6000 steps (12*500).
   However, with 2 nodes we can reach the same loss in less than 4000 steps"). Here: task
   ``cifar10-cnn-v0`` (CIFAR-10; with the shared offline data folder its test set is the first
   1,000 official test images), DiLoCo with the same ``H`` and per-node batch size on 1 and on 2
   nodes, plus two references: plain AdamW on 1 node and synchronous DDP on 2 nodes. Reported:
   the first evaluated step whose eval loss is below each target, the samples that took, and the
   final and best eval loss and accuracy.
2. **NanoGPT on one node** (the post's Figure 4: "single node DiLoCo with different
   synchronization intervals (H=50 vs H=500)", and the DiLoCo paper's claim that inner AdamW +
   outer Nesterov beats AdamW alone). Here: task ``shakespeare-char-gpt-v0`` on one node, plain
   AdamW (``--strategy ddp --nodes 1``: the all-reduce of one node is a no-op and there are no
   buffers, so it is AdamW step for step) against DiLoCo with ``H = 50`` and ``H = 500`` (outer
   Nesterov, lr 0.7, momentum 0.9: the defaults), the same inner AdamW and the same warm-up +
   cosine schedule. Reported: eval loss at checkpoints, final eval loss and perplexity.

Every run is one ``exogym run ... --out OUT/NAME --no-progress`` command, started here as
``python -m exogym run ...`` under ``nice`` with ``OMP_NUM_THREADS`` set, one after the other (the
seed's runs of both experiments first, the CIFAR references last); a run whose ``summary.json``
exists is not run again (so an interrupted sweep resumes). The tables are computed from each
run's ``metrics.jsonl``. DiLoCo's global model changes only at outer steps, so its step
resolution is ``H`` whatever the evaluation interval.

Usage::

    python bench/seed_experiments.py --sanity                 # 20 steps of every configuration
    python bench/seed_experiments.py --experiment cifar       # then gpt; or all (the default)
    python bench/seed_experiments.py --report-only            # the tables from finished runs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CIFAR_TASK = "cifar10-cnn-v0"
GPT_TASK = "shakespeare-char-gpt-v0"
# The GPT's inner schedule, nanoGPT's shakespeare_char recipe: warm-up 100, cosine to lr / 10.
GPT_SCHEDULE: tuple[tuple[str, str], ...] = (
    ("schedule.warmup_steps", "100"), ("schedule.cosine", "true"),
    ("schedule.min_lr_ratio", "0.1"),
)
EXPERIMENTS = ("cifar", "gpt", "all")
# CIFAR eval-loss targets. 1.25 is the seed's 2.5 on CIFAR-100 rescaled to 10 classes
# (2.5 / ln 100 * ln 10); 1.0 is the headline: the tightest round loss that the 1-node DiLoCo run
# stays under once reached (its best is 0.879). Late in that run the loss moves by up to 0.07
# between consecutive outer steps, so first crossings of 0.95 and 0.9 are partly noise.
CIFAR_TARGETS: tuple[float, ...] = (1.25, 1.1, 1.0, 0.95, 0.9)


@dataclass(frozen=True)
class RunSpec:
    """One ``exogym run`` command.

    Attributes:
        name: the run folder's name under the output folder, and the table's label.
        task: task id.
        strategy: strategy id.
        nodes: simulated nodes N.
        steps: training steps.
        eval_interval: steps between evaluations of the global model.
        sets: ``--set KEY=VALUE`` strategy overrides, in order.
        reference: a baseline beside the seed's own runs; references run after every seed run.
    """

    name: str
    task: str
    strategy: str
    nodes: int
    steps: int
    eval_interval: int
    sets: tuple[tuple[str, str], ...] = ()
    reference: bool = False

    def args(self, out_root: Path) -> list[str]:
        """The arguments after ``exogym``."""
        argv = ["run", "--task", self.task, "--strategy", self.strategy,
                "--nodes", str(self.nodes), "--steps", str(self.steps),
                "--eval-interval", str(self.eval_interval)]
        for key, value in self.sets:
            argv += ["--set", f"{key}={value}"]
        return [*argv, "--out", str(out_root / self.name), "--no-progress"]

    def command(self, out_root: Path) -> str:
        """The shell command, as a user would type it."""
        return shlex.join(["exogym", *self.args(out_root)])


@dataclass(frozen=True)
class Config:
    """The sweep's sizes, validated.

    Attributes:
        cifar_steps: steps of every CIFAR run.
        cifar_H: DiLoCo's H in the CIFAR runs (the same on 1 and 2 nodes).
        cifar_eval_interval: steps between CIFAR evaluations.
        gpt_steps: steps of every GPT run; a multiple of 500 (so H = 50 and H = 500 both end on
            an outer step).
        gpt_eval_interval: steps between GPT evaluations; must divide 500.
        nice: niceness of every run (0-19).
        threads: ``OMP_NUM_THREADS`` of every run (torch's intra-op threads).
    """

    cifar_steps: int = 3000
    cifar_H: int = 100
    cifar_eval_interval: int = 50
    gpt_steps: int = 2500
    gpt_eval_interval: int = 250
    nice: int = 15
    threads: int = 1

    def __post_init__(self) -> None:
        for name in ("cifar_steps", "cifar_H", "cifar_eval_interval", "gpt_steps",
                     "gpt_eval_interval", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.cifar_steps % self.cifar_H:
            raise ValueError(f"cifar_steps must be a multiple of cifar_H={self.cifar_H} (the last "
                             f"local steps would never reach the global model), got "
                             f"{self.cifar_steps}")
        if self.gpt_steps % 500:
            raise ValueError(f"gpt_steps must be a multiple of 500, got {self.gpt_steps}")
        if 500 % self.gpt_eval_interval:
            raise ValueError(f"gpt_eval_interval must divide 500 (checkpoints every 500 steps), "
                             f"got {self.gpt_eval_interval}")
        if isinstance(self.nice, bool) or not isinstance(self.nice, int) \
                or not 0 <= self.nice <= 19:
            raise ValueError(f"nice must be an integer in [0, 19], got {self.nice!r}")


def cifar_runs(cfg: Config) -> list[RunSpec]:
    """DiLoCo on 1 and 2 nodes (same H, same batch per node), then the AdamW / DDP references."""
    h = (("H", str(cfg.cifar_H)),)
    common = {"task": CIFAR_TASK, "steps": cfg.cifar_steps,
              "eval_interval": cfg.cifar_eval_interval}
    return [
        RunSpec(f"cifar-diloco-H{cfg.cifar_H}-n1", strategy="diloco", nodes=1, sets=h, **common),
        RunSpec(f"cifar-diloco-H{cfg.cifar_H}-n2", strategy="diloco", nodes=2, sets=h, **common),
        RunSpec("cifar-adamw-n1", strategy="ddp", nodes=1, reference=True, **common),
        RunSpec("cifar-ddp-n2", strategy="ddp", nodes=2, reference=True, **common),
    ]


def gpt_runs(cfg: Config) -> list[RunSpec]:
    """One node: AdamW (DDP of one node), DiLoCo H = 50 and H = 500; the same inner schedule."""
    common = {"task": GPT_TASK, "nodes": 1, "steps": cfg.gpt_steps,
              "eval_interval": cfg.gpt_eval_interval}
    return [
        RunSpec("gpt-adamw", strategy="ddp", sets=GPT_SCHEDULE, **common),
        RunSpec("gpt-diloco-H50", strategy="diloco", sets=(("H", "50"), *GPT_SCHEDULE), **common),
        RunSpec("gpt-diloco-H500", strategy="diloco", sets=(("H", "500"), *GPT_SCHEDULE),
                **common),
    ]


def sanity_runs(specs: list[RunSpec], steps: int = 20) -> list[RunSpec]:
    """The same configurations for ``steps`` steps, evaluated every ``steps // 2``, with every
    ``H`` (and warm-up) cut to fit, so each command is checked end to end in seconds. Folders
    are ``sanity-`` + the full run's name (which keeps its ``H`` even where it was cut)."""
    out = []
    for spec in specs:
        sets = tuple((k, str(min(int(v), steps // 2)) if k in ("H", "schedule.warmup_steps")
                      else v) for k, v in spec.sets)
        out.append(replace(spec, name=f"sanity-{spec.name}", steps=steps,
                           eval_interval=steps // 2, sets=sets))
    return out


def execute(spec: RunSpec, out_root: Path, cfg: Config) -> Path:
    """Run ``spec`` unless its ``summary.json`` exists; returns the run folder.

    Raises:
        RuntimeError: the command failed, or an unfinished run (metrics but no summary) is in the
            way.
    """
    run_dir = out_root / spec.name
    if (run_dir / "summary.json").exists():
        print(f"[done before] {spec.name}", flush=True)
        return run_dir
    if (run_dir / "metrics.jsonl").exists():
        raise RuntimeError(f"{run_dir} holds an unfinished run (metrics.jsonl, no summary.json); "
                           "move it away to run it again")
    env = dict(os.environ, OMP_NUM_THREADS=str(cfg.threads), MKL_NUM_THREADS=str(cfg.threads))
    # The checkout first, so the script runs the code beside it even without an install.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    argv = ["nice", "-n", str(cfg.nice), sys.executable, "-m", "exogym", *spec.args(out_root)]
    print(f"[run] OMP_NUM_THREADS={cfg.threads} nice -n {cfg.nice} {spec.command(out_root)}",
          flush=True)
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=REPO, check=False)
    if proc.returncode:
        raise RuntimeError(f"{spec.name} failed with exit status {proc.returncode}")
    print(f"[ok] {spec.name} in {time.perf_counter() - start:.0f} s", flush=True)
    return run_dir


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Every row of ``run_dir/metrics.jsonl``."""
    with (run_dir / "metrics.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def eval_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with an evaluation, in step order."""
    return [r for r in rows if "eval_loss" in r]


def steps_to_target(rows: list[dict[str, Any]], target: float) -> int | None:
    """The first evaluated step whose eval loss is below ``target`` (None: never).

    >>> steps_to_target([{"step": 50, "eval_loss": 1.3}, {"step": 100, "eval_loss": 1.19},
    ...                  {"step": 150, "eval_loss": 1.1}], 1.2)
    100
    >>> steps_to_target([{"step": 50, "eval_loss": 1.2}], 1.2) is None
    True
    """
    return next((int(r["step"]) for r in eval_rows(rows) if r["eval_loss"] < target), None)


def at_step(rows: list[dict[str, Any]], step: int, key: str = "eval_loss") -> float | None:
    """``key`` of the evaluated row at ``step`` (None when that step was not evaluated)."""
    return next((float(r[key]) for r in eval_rows(rows) if r["step"] == step), None)


def best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The evaluated row with the lowest eval loss (the first one on ties)."""
    return min(eval_rows(rows), key=lambda r: r["eval_loss"])


def _summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def cifar_report(specs: list[RunSpec], out_root: Path, targets: list[float]) -> str:
    """Steps (and samples) to each target, then final and best eval loss and accuracy."""
    header = ["run", "nodes", "H"] + [f"steps (samples) to loss < {t:g}" for t in targets] + [
        "final loss", "final acc.", "best loss (step)", "sent per node", "train time"]
    body = []
    for spec in specs:
        run_dir = out_root / spec.name
        rows, summary = read_rows(run_dir), _summary(run_dir)
        per_step = spec.nodes * int(summary["batch_size_per_node"])
        cells = [spec.name, str(spec.nodes), dict(spec.sets).get("H", "-")]
        for t in targets:
            s = steps_to_target(rows, t)
            cells.append("not reached" if s is None else f"{s:,} ({s * per_step:,})")
        top = best(rows)
        final = summary["final"]
        cells += [_fmt(final["eval_loss"]), f"{100 * final['eval_accuracy']:.1f}%",
                  f"{top['eval_loss']:.4f} ({top['step']:,})",
                  f"{max(summary['bytes_sent_per_node']) / 1e6:,.2f} MB",
                  f"{summary['train_time_s'] / 60:.1f} min"]
        body.append(cells)
    return _table(header, body)


def gpt_report(specs: list[RunSpec], out_root: Path) -> str:
    """Eval loss every 500 steps, then final eval loss and perplexity."""
    steps = specs[0].steps
    checkpoints = list(range(500, steps, 500))
    header = ["run", "H"] + [f"loss @ {s:,}" for s in checkpoints] + [
        f"final loss @ {steps:,}", "final perplexity", "train time"]
    body = []
    for spec in specs:
        run_dir = out_root / spec.name
        rows, summary = read_rows(run_dir), _summary(run_dir)
        cells = [spec.name, dict(spec.sets).get("H", "-")]
        cells += [_fmt(at_step(rows, s)) for s in checkpoints]
        final = summary["final"]
        cells += [_fmt(final["eval_loss"]), f"{final['eval_perplexity']:.3f}",
                  f"{summary['train_time_s'] / 60:.1f} min"]
        body.append(cells)
    return _table(header, body)


def machine() -> str:
    """One line: CPU model and count, Python, torch, date."""
    import torch  # only for its version; the runs are subprocesses

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} logical CPUs, Python {platform.python_version()}, "
            f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")


def build_parser() -> argparse.ArgumentParser:
    d = Config()
    p = argparse.ArgumentParser(description="Run the seed's CIFAR and NanoGPT experiments with "
                                "exogym's CLI, in sequence, and print markdown tables.")
    p.add_argument("--experiment", choices=EXPERIMENTS, default="all")
    p.add_argument("--out", type=Path, default=Path("/tmp/exp"),
                   help="folder of the run folders (default /tmp/exp)")
    p.add_argument("--cifar-steps", type=int, default=d.cifar_steps)
    p.add_argument("--cifar-H", type=int, default=d.cifar_H)
    p.add_argument("--cifar-eval-interval", type=int, default=d.cifar_eval_interval)
    p.add_argument("--targets", type=float, nargs="+", default=list(CIFAR_TARGETS),
                   help="CIFAR eval-loss targets (default: "
                   f"{' '.join(f'{t:g}' for t in CIFAR_TARGETS)})")
    p.add_argument("--gpt-steps", type=int, default=d.gpt_steps, help="a multiple of 500")
    p.add_argument("--gpt-eval-interval", type=int, default=d.gpt_eval_interval)
    p.add_argument("--nice", type=int, default=d.nice)
    p.add_argument("--threads", type=int, default=d.threads, help="OMP_NUM_THREADS of each run")
    p.add_argument("--sanity", action="store_true",
                   help="20 steps of every configuration instead (run folders sanity-*)")
    p.add_argument("--no-references", action="store_true",
                   help="skip the CIFAR references (AdamW on 1 node, DDP on 2 nodes)")
    p.add_argument("--report-only", action="store_true", help="no runs: tables of finished runs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = Config(cifar_steps=args.cifar_steps, cifar_H=args.cifar_H,
                     cifar_eval_interval=args.cifar_eval_interval, gpt_steps=args.gpt_steps,
                     gpt_eval_interval=args.gpt_eval_interval, nice=args.nice,
                     threads=args.threads)
        bad = [t for t in args.targets if not t > 0]
        if bad:
            raise ValueError(f"targets must be eval losses > 0, got {bad[0]!r}")
    except ValueError as err:
        print(f"seed_experiments: error: {err}", file=sys.stderr)
        return 2
    groups: list[tuple[str, list[RunSpec]]] = []
    if args.experiment in ("cifar", "all"):
        groups.append(("cifar", cifar_runs(cfg)))
    if args.experiment in ("gpt", "all"):
        groups.append(("gpt", gpt_runs(cfg)))
    if args.no_references:
        groups = [(kind, [s for s in specs if not s.reference]) for kind, specs in groups]
    if args.sanity:
        groups = [(kind, sanity_runs(specs)) for kind, specs in groups]
    if not args.report_only:
        # The seed's own runs first (both experiments), then the references.
        for reference in (False, True):
            for _, specs in groups:
                for spec in specs:
                    if spec.reference == reference:
                        execute(spec, args.out, cfg)
    missing = [spec for _, specs in groups for spec in specs
               if not (args.out / spec.name / "summary.json").exists()]
    if missing:
        print(f"seed_experiments: error: {args.out / missing[0].name} is not a finished run; "
              f"run it first: {missing[0].command(args.out)}", file=sys.stderr)
        return 2
    print(f"\nMachine: {machine()}; every run with OMP_NUM_THREADS={cfg.threads}, "
          f"nice -n {cfg.nice}.\n")
    for kind, specs in groups:
        print("```")
        print("\n".join(spec.command(args.out) for spec in specs))
        print("```\n")
        if kind == "cifar":
            print(cifar_report(specs, args.out, args.targets))
        else:
            print(gpt_report(specs, args.out))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
