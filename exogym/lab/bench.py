"""``exogym bench``: fixed benchmark suites, scored the same way for everyone; a leaderboard.

A suite has a versioned id (``gym-v0``) and fixes everything but the method: per track the task,
N, the network, the world, the step budget, the evaluation interval and set, and the compute
time per step the simulated clock charges (a given reference value, never this machine's
measurement, so that scores do not depend on who ran them). A change to any of these is a new
suite version, never a silent change of results.

Scoring, per track and strategy (means over the seeds):

- **score**: the eval loss at the simulated-time budget: the last evaluation (every
  ``eval_interval`` steps, step 0 included, on the track's fixed evaluation subset) whose
  simulated time is within the budget. A method that communicates more is slower in simulated
  time and is scored at an earlier step. Lower is better. A track without a time budget scores
  the last evaluation.
- **time to target**: the simulated time of the first evaluation at or below the track's target
  loss (None when not reached);
- the bytes sent per node and the final evaluation on the whole test set, for reference.

The leaderboard ranks the strategies per track by score and overall by their mean rank over the
tracks; ``leaderboard.md`` and ``leaderboard.json`` record the suite id, exogym's and torch's
versions, the seeds and the machine, and every track's comparison folder is kept.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from exogym.lab.compare import compare
from exogym.lab.outcome import CurvePoint, RunOutcome
from exogym.lab.report import Comparison
from exogym.run.output.result import check_out_dir
from exogym.utils.config import ConfigError

__all__ = ["SUITES", "Suite", "Track", "bench", "score_at_budget", "time_to_target"]


@dataclass(frozen=True)
class Track:
    """One fixed training problem of a suite.

    Attributes:
        name: the track's id within the suite.
        task: a task id.
        num_nodes: N.
        network: a network profile or spec.
        steps: training steps of every run.
        step_time_s: the compute per step per node the clock charges (a reference device).
        eval_interval: steps between evaluations (the score's resolution).
        budget_s: the simulated-time budget the score is read at (None: the end of the run).
        target_loss: the loss of "time to target".
        world: a world spec (None: perfect).
        eval_samples: the size of the fixed evaluation subset during training.
    """

    name: str
    task: str
    num_nodes: int
    network: str
    steps: int
    step_time_s: float
    eval_interval: int
    budget_s: float | None
    target_loss: float
    world: str | None = None
    eval_samples: int = 2000

    def describe(self) -> str:
        budget = "the end" if self.budget_s is None else f"{self.budget_s / 60:g} simulated min"
        world = f", world {self.world}" if self.world else ""
        return (f"{self.task}, {self.num_nodes} nodes, {self.network}{world}, {self.steps} steps "
                f"at {self.step_time_s * 1000:g} ms/step, eval every {self.eval_interval} steps "
                f"on {self.eval_samples} samples; score: eval loss at {budget}; target "
                f"{self.target_loss:g}")


@dataclass(frozen=True)
class Suite:
    """A versioned set of tracks."""

    id: str
    description: str
    tracks: tuple[Track, ...]


SUITES: dict[str, Suite] = {
    "gym-v0": Suite(
        id="gym-v0",
        description="MNIST on 4 nodes over home internet, and the EXO Gym competition's shape: "
                    "the Shakespeare char-GPT on 8 nodes over home internet, scored at a fixed "
                    "simulated-time budget",
        tracks=(
            Track(name="mnist-4-home", task="mnist-cnn-v0", num_nodes=4,
                  network="home-100mbps", steps=500, step_time_s=0.05, eval_interval=50,
                  budget_s=120.0, target_loss=0.15),
            Track(name="nanogpt-8-home", task="shakespeare-char-gpt-v0", num_nodes=8,
                  network="home-100mbps", steps=1000, step_time_s=0.1, eval_interval=50,
                  budget_s=300.0, target_loss=2.0),
        ),
    ),
}
"""The suites by id. ``gym-v0``'s step times are a small GPU's (50 ms for the MNIST CNN's batch
of 64, 100 ms for the GPT's batch of 32 x 64 tokens), so that communication matters as it would
for larger models on real devices."""


def score_at_budget(curve: Sequence[CurvePoint], budget_s: float | None) -> float:
    """The eval loss of the last evaluation at or within ``budget_s`` of simulated time (the
    last one when None); NaN if none is (an evaluation at time 0, the initial model, always
    is)."""
    within = [p for p in curve if budget_s is None or p.sim_time_s <= budget_s]
    return within[-1].eval_loss if within else math.nan


def time_to_target(curve: Sequence[CurvePoint], target: float) -> float | None:
    """The simulated time of the first evaluation at or below ``target``; None if never."""
    return next((p.sim_time_s for p in curve if p.eval_loss <= target), None)


@dataclass(frozen=True)
class Entry:
    """One strategy on one track: ``score`` (mean over seeds), ``time_to_target_s`` (mean over
    the seeds that reached it; None if none did), bytes, final evaluation, rank (1 = best)."""

    label: str
    score: float
    time_to_target_s: float | None
    reached: int
    bytes_sent_per_node: float
    final_eval_loss: float
    rank: int


def _entries(track: Track, comparison: Comparison) -> list[Entry]:
    rows = []
    for row in comparison.rows:
        runs: tuple[RunOutcome, ...] = row.runs
        scores = [score_at_budget(r.curve, track.budget_s) for r in runs]
        times = [t for t in (time_to_target(r.curve, track.target_loss) for r in runs)
                 if t is not None]
        rows.append((row.label, statistics.fmean(scores),
                     statistics.fmean(times) if times else None, len(times),
                     row.metrics["bytes_sent_per_node"].mean, row.metrics["eval_loss"].mean))
    order = sorted(rows, key=lambda r: (not math.isfinite(r[1]), r[1]))
    return [Entry(*r, rank=order.index(r) + 1) for r in rows]


def machine() -> dict[str, Any]:
    """What the leaderboard records of the machine and software."""
    from exogym import __version__

    return {"exogym": __version__, "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "processor": platform.processor() or
            platform.machine(), "cpus": os.cpu_count(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def bench(
    suite: str,
    strategies: Sequence[str],
    *,
    out_dir: str | Path,
    tracks: Sequence[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    repeats: int = 1,
    seed: int = 0,
    data_dir: str | Path | None = None,
    download: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """Run ``strategies`` (labels, as :func:`exogym.lab.compare.compare` takes them) on every
    track of ``suite`` (or the named ``tracks``) and write the leaderboard into ``out_dir``;
    returns its JSON content.

    Raises:
        ConfigError: an unknown suite or track (listing the known ones), a bad label or setting.
    """
    if suite not in SUITES:
        raise ConfigError(f"unknown suite {suite!r}; available: {', '.join(SUITES)}")
    the_suite = SUITES[suite]
    names = [t.name for t in the_suite.tracks]
    chosen = list(tracks) if tracks else names
    unknown = [t for t in chosen if t not in names]
    if unknown:
        raise ConfigError(f"suite {suite} has no track {', '.join(map(repr, unknown))}; its "
                          f"tracks: {', '.join(names)}")
    out = check_out_dir(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    board: dict[str, Any] = {"suite": suite, "description": the_suite.description,
                             "seeds": list(range(seed, seed + repeats)), "machine": machine(),
                             "settings": dict(overrides or {}), "tracks": {}}
    for track in (t for t in the_suite.tracks if t.name in chosen):
        comparison = compare(
            track.task, list(strategies), num_nodes=track.num_nodes, max_steps=track.steps,
            out_dir=out / track.name, network=track.network, repeats=repeats, seed=seed,
            target_loss=track.target_loss, eval_interval=track.eval_interval,
            eval_samples=track.eval_samples, overrides=dict(overrides or {}),
            step_time=track.step_time_s, world=track.world, data_dir=data_dir,
            download=download, progress=progress)
        board["tracks"][track.name] = {
            "track": track.describe(), "comparison": str(comparison.out_dir),
            "entries": [e.__dict__ for e in _entries(track, comparison)]}
    labels = [e["label"] for e in next(iter(board["tracks"].values()))["entries"]]
    board["overall"] = sorted(
        ({"label": label, "mean_rank": statistics.fmean(
            e["rank"] for t in board["tracks"].values() for e in t["entries"]
            if e["label"] == label)} for label in labels), key=lambda r: r["mean_rank"])
    (out / "leaderboard.json").write_text(json.dumps(board, indent=2, default=str) + "\n",
                                          encoding="utf-8")
    (out / "leaderboard.md").write_text(format_leaderboard(board), encoding="utf-8")
    return board


def format_leaderboard(board: Mapping[str, Any]) -> str:
    """``leaderboard.md``: per track the entries by rank, then the overall mean ranks."""
    m = board["machine"]
    lines = [f"# exogym bench: {board['suite']}", "", board["description"] + ".", "",
             f"exogym {m['exogym']}, torch {m['torch']}, {m['cpus']} CPUs ({m['processor']})"
             + (f", {m['cuda']}" if m["cuda"] else "") + f"; seeds {board['seeds']}"
             + (f"; settings {board['settings']}" if board["settings"] else "") + "."]
    for name, track in board["tracks"].items():
        lines += ["", f"## {name}", "", track["track"], "",
                  "| rank | strategy | score (eval loss at budget) | time to target | "
                  "sent per node | final eval loss |", "|---|---|---|---|---|---|"]
        for e in sorted(track["entries"], key=lambda e: e["rank"]):
            t = e["time_to_target_s"]
            lines.append(f"| {e['rank']} | `{e['label']}` | {e['score']:.4f} | "
                         + ("not reached" if t is None else f"{t / 60:.2f} min") + " | "
                         f"{e['bytes_sent_per_node'] / 1e6:,.2f} MB | "
                         f"{e['final_eval_loss']:.4f} |")
    lines += ["", "## Overall (mean rank over the tracks)", "", "| strategy | mean rank |",
              "|---|---|"]
    lines += [f"| `{r['label']}` | {r['mean_rank']:g} |" for r in board["overall"]]
    return "\n".join(lines) + "\n"
