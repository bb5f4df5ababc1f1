"""A claim's quantities read from a finished run's folder (:data:`~exogym.lab.claims.spec.METRICS`):
its ``summary.json`` and the evaluations of its ``metrics.jsonl``."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from exogym.run.output.result import read_json

__all__ = ["RunRecord", "read_run"]


@dataclass(frozen=True)
class RunRecord:
    """One finished run as a claim reads it: the summary, the evaluation rows and the training
    rows (those with ``bytes_sent``)."""

    summary: dict[str, Any]
    evaluations: list[dict[str, Any]]
    logged: list[dict[str, Any]] = field(default_factory=list)

    def value(self, metric: str, target: float | None = None) -> float:
        """``metric`` of this run (``target``: the accuracy of the ``*_to_accuracy`` ones)."""
        s = self.summary
        if metric == "final_loss":
            return float(s["final"]["eval_loss"])
        if metric == "final_accuracy":
            return float(s["final"]["eval_accuracy"])
        if metric == "bytes_per_node":
            return float(max(s["bytes_sent_per_node"]))
        if metric == "sim_time":
            return float(s["sim_time_s"])
        if metric == "peak_bytes_per_step":
            return self._peak_bytes_per_step()
        if metric == "rounds_to_accuracy":
            return self.value("steps_to_accuracy", target) / self._steps_per_round()
        if metric in ("time_to_accuracy", "steps_to_accuracy"):
            assert target is not None
            key = "sim_time_s" if metric == "time_to_accuracy" else "step"
            return next((float(r[key]) for r in self.evaluations
                         if r.get("eval_accuracy", -1.0) >= target), math.inf)
        raise ValueError(f"unknown metric {metric!r}")


    def extent(self, unit: str) -> float:
        """How far the run went: ``"sim_time"`` (its simulated seconds), ``"steps"`` or
        ``"rounds"`` (steps / H): a censored time-to-target's budget."""
        if unit == "sim_time":
            return float(self.summary["sim_time_s"])
        steps = float(self.summary["steps"])
        return steps / self._steps_per_round() if unit == "rounds" else steps

    def _peak_bytes_per_step(self) -> float:
        rows = [(0, 0.0)] + [(int(r["step"]), float(r["bytes_sent"])) for r in self.logged]
        per_step = [(b1 - b0) / (s1 - s0) for (s0, b0), (s1, b1) in pairwise(rows)
                    if s1 > s0]
        if not per_step:
            raise ValueError("peak_bytes_per_step: the run logged no training rows "
                             "(set log_interval)")
        return max(per_step)

    def _steps_per_round(self) -> float:
        H = self.summary.get("hyperparameters", {}).get("H")
        if not isinstance(H, int) or H < 1:
            raise ValueError(f"rounds_to_accuracy needs a strategy with rounds of H steps; "
                             f"{self.summary.get('strategy')!r} has H = {H!r}")
        return float(H)


def read_run(run_dir: Path) -> RunRecord:
    """The run in ``run_dir`` (it must have finished: its ``summary.json``)."""
    summary = read_json(run_dir / "summary.json", "a run folder written by exogym")
    rows = [json.loads(line) for line in
            (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if line]
    return RunRecord(summary, [r for r in rows if "eval_loss" in r],
                     [r for r in rows if "bytes_sent" in r])
