"""One training run as the lab reads it, and one quantity over the repeats of a setting.

:class:`CurvePoint` (one evaluation of the global model during a run), :class:`RunOutcome` (one
run, as its ``summary.json`` records it: built from a :class:`exogym.FitResult` or read back from
a run folder) and :class:`Stat` (one quantity over the repeats, mean ± sample standard
deviation). :data:`RUN_METRICS` names the per-run quantities that a comparison aggregates besides
the final evaluation metrics.

The shared vocabulary of the lab: :mod:`exogym.lab.compare`, :mod:`exogym.lab.sweep` and
:mod:`exogym.lab.bench` build these, :mod:`exogym.lab.report` and :mod:`exogym.lab.sweep_report`
render them. Nothing here trains, reads or writes files, or imports another lab module.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exogym.run.output.result import FitResult

__all__ = ["RUN_METRICS", "CurvePoint", "RunOutcome", "Stat"]


@dataclass(frozen=True)
class Stat:
    """One quantity over the repeats of a strategy.

    A run that diverged has a NaN (or infinite) value: the mean is then NaN or infinite as
    arithmetic gives it, and the spread, the lowest and the highest are NaN (not an error after
    hours of training, and not an order-dependent ``min`` of a NaN).

    Attributes:
        values: one per run, in seed order.
    """

    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float | None:
        """The sample standard deviation (``n - 1`` in the denominator); None for one run."""
        if self.n < 2:
            return None
        return statistics.stdev(self.values) if self._finite else math.nan

    @property
    def min(self) -> float:
        return min(self.values) if self._finite else math.nan

    @property
    def max(self) -> float:
        return max(self.values) if self._finite else math.nan

    @property
    def _finite(self) -> bool:
        return all(math.isfinite(v) for v in self.values)

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "std": self.std, "min": self.min, "max": self.max,
                "values": list(self.values)}


@dataclass(frozen=True)
class CurvePoint:
    """One evaluation of the global model during a run.

    Attributes:
        step: training steps done.
        eval_loss: the global model's evaluation loss.
        bytes_sent: bytes sent per node so far (max over nodes).
        sim_time_s: the simulated clock then (seconds).
    """

    step: int
    eval_loss: float
    bytes_sent: float
    sim_time_s: float


@dataclass(frozen=True)
class RunOutcome:
    """One training run of a comparison, as its ``summary.json`` records it.

    Attributes:
        label: the strategy's label in the comparison; ``strategy`` its registry id.
        seed: the run's seed.
        out_dir: the run's folder (``metrics.jsonl``, ``config.json``, ``summary.json``).
        final: the last evaluation (``eval_loss``, ``eval_accuracy`` or ``eval_perplexity``, ...).
        bytes_sent_per_node: bytes sent, max over nodes.
        sim_time_s: simulated wall clock of the run on the comparison's network.
        utilization: simulated compute / total.
        step_time_s: the compute per step per node the clock used; ``compute_source`` how it
            was obtained (``profile``, ``measured``, ``given``).
        hardware: the simulated device(s) that priced the step (``compute_source`` profile:
            ``"NVIDIA GeForce RTX 4090"``); None otherwise.
        samples_per_s: measured training throughput on this machine.
        wall_time_s: measured wall time of the whole fit (evaluations included).
        curve: every evaluation, in step order (the first, at step 0, is the initial model).
        warnings: what the run warned about (e.g. a run that is not a multiple of H).
        world: what the world did in the run (counts, :attr:`exogym.FitResult.world`), None
            for a perfect world; ``failure_times_s`` the simulated times of its failures.
    """

    label: str
    strategy: str
    seed: int
    out_dir: Path
    final: dict[str, float]
    bytes_sent_per_node: float
    sim_time_s: float
    utilization: float
    step_time_s: float
    compute_source: str
    samples_per_s: float
    wall_time_s: float
    curve: tuple[CurvePoint, ...]
    warnings: tuple[str, ...] = ()
    world: dict[str, Any] | None = None
    failure_times_s: tuple[float, ...] = ()
    hardware: str | None = None

    @property
    def improved(self) -> bool:
        """Whether the last evaluation's loss is below the first's (the initial model's)."""
        return len(self.curve) >= 2 and self.curve[-1].eval_loss < self.curve[0].eval_loss

    @classmethod
    def from_fit(cls, label: str, result: FitResult,
                 warnings: tuple[str, ...] = ()) -> RunOutcome:
        if result.clock is None or result.out_dir is None:
            raise ValueError("a compared run needs a simulated clock and a run folder")
        curve = tuple(
            CurvePoint(step=row["step"], eval_loss=row["eval_loss"],
                       bytes_sent=row["bytes_sent"], sim_time_s=row["sim_time_s"])
            for row in result.history if "eval_loss" in row)
        return cls(label=label, strategy=result.strategy, seed=result.seed,
                   out_dir=result.out_dir, final=dict(result.final),
                   bytes_sent_per_node=max(result.bytes_sent), sim_time_s=result.clock.total_s,
                   utilization=result.clock.utilization, step_time_s=result.clock.step_time_s,
                   compute_source=result.clock.compute_source,
                   samples_per_s=result.samples_per_s, wall_time_s=result.wall_time_s,
                   curve=curve, warnings=warnings, world=result.world,
                   failure_times_s=tuple(e["time_s"] for e in result.events
                                         if e["event"] == "fail"),
                   hardware=(None if result.compute is None
                             else result.compute["hardware"]["described"]))

    def reach(self, target: float | None) -> CurvePoint | None:
        """The first evaluation with ``eval_loss <= target`` (None: never, or no target)."""
        if target is None:
            return None
        return next((p for p in self.curve if p.eval_loss <= target), None)

    def to_dict(self, target: float | None) -> dict[str, Any]:
        hit = self.reach(target)
        return {"seed": self.seed, "out_dir": str(self.out_dir), "final": self.final,
                "steps_to_target": hit.step if hit else None,
                "sim_time_to_target_s": hit.sim_time_s if hit else None,
                "bytes_sent_per_node": self.bytes_sent_per_node, "sim_time_s": self.sim_time_s,
                "utilization": self.utilization, "step_time_s": self.step_time_s,
                "samples_per_s": self.samples_per_s, "wall_time_s": self.wall_time_s,
                "improved": self.improved, "warnings": list(self.warnings),
                "world": self.world, "failure_times_s": list(self.failure_times_s)}


RUN_METRICS = ("bytes_sent_per_node", "sim_time_s", "utilization", "samples_per_s", "wall_time_s")
"""Per-run quantities aggregated besides the final evaluation metrics."""
