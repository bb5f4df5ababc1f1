"""What a claim of the suite says and how it is decided: :class:`Claim`, its :class:`Paper`, the
:class:`Config` s it trains and the :class:`Rule` s that decide it.

A claim is data, written once: the paper and where in it, the claim in words and the paper's
figure, the small-scale experiment (a task, configurations that are ``exogym run``'s settings),
and its verdict rules, written before the first run (the spec's git history shows that they were
not changed after it). Nothing here trains or reads a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from exogym.run.options import settings

__all__ = ["METRICS", "Claim", "Config", "Paper", "Rule"]

METRICS: dict[str, str] = {
    "final_loss": "the final evaluation loss (the whole test set)",
    "final_accuracy": "the final evaluation accuracy (the whole test set)",
    "bytes_per_node": "bytes sent per node over the run (max over nodes)",
    "sim_time": "the run's simulated time, seconds",
    "time_to_accuracy": "the simulated time of the first evaluation at or above the rule's "
                        "target accuracy (inf: never)",
    "steps_to_accuracy": "the steps of the first evaluation at or above the rule's target "
                         "accuracy (inf: never)",
    "rounds_to_accuracy": "steps_to_accuracy / H, the strategy's steps per round (FedAvg's "
                          "communication rounds; inf: never)",
    "peak_bytes_per_step": "the most bytes a node sent in one step (with log_interval 1; "
                           "else the most per step over one logged interval)",
}
"""The quantities a rule compares (:mod:`exogym.lab.claims.measure` reads them from a run)."""


@dataclass(frozen=True)
class Paper:
    """The paper a claim comes from."""

    authors: str
    year: int
    title: str
    source: str  # where to read it: "arXiv 2311.08105", "OpenReview stFPf3gzq1"

    def cite(self) -> str:
        return f"{self.authors} {self.year}, \"{self.title}\", {self.source}"


@dataclass(frozen=True)
class Config:
    """One configuration a claim trains: a strategy, its hyperparameters (as ``--set`` gives
    them) and the run's settings (:meth:`exogym.Trainer.fit`'s arguments by name, as ``exogym
    run`` parses its flags: ``{"network": "home-100mbps", "num_nodes": 8}``), over the claim's
    ``common`` settings."""

    label: str
    strategy: str
    sets: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.label or not self.label.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"a config's label is letters, digits, - and _, got "
                             f"{self.label!r}")
        _check_settings(self.settings, f"config {self.label!r}")


@dataclass(frozen=True)
class Rule:
    """One verdict rule: per seed, ``metric(a) - metric(b)`` (``form="diff"``) or
    ``metric(a) / metric(b)`` (``"ratio"``); the mean over the seeds with a bootstrap 95% CI
    (:mod:`exogym.lab.claims.stats`). The claim says the mean is on ``side`` of
    ``threshold``: **reproduced** when the whole CI is there, **not reproduced** when the whole
    CI is on the other side, **inconclusive** when the CI straddles the threshold.

    Attributes:
        text: the rule in words (the docs' table shows it).
        target: the accuracy of ``time_to_accuracy`` / ``steps_to_accuracy``.
    """

    text: str
    metric: str
    a: str
    b: str
    form: Literal["diff", "ratio"]
    side: Literal["below", "above"]
    threshold: float
    target: float | None = None

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"rule metric {self.metric!r} is not one of {sorted(METRICS)}")
        if self.form not in ("diff", "ratio"):
            raise ValueError(f"rule form must be 'diff' or 'ratio', got {self.form!r}")
        if self.side not in ("below", "above"):
            raise ValueError(f"rule side must be 'below' or 'above', got {self.side!r}")
        needs_target = self.metric.endswith("_to_accuracy")
        if needs_target != (self.target is not None):
            raise ValueError(f"rule on {self.metric!r}: target is "
                             + ("required (an accuracy in (0, 1])" if needs_target
                                else f"only for the *_to_accuracy metrics, got {self.target}"))
        if self.target is not None and not 0 < self.target <= 1:
            raise ValueError(f"rule target must be an accuracy in (0, 1], got {self.target}")


@dataclass(frozen=True)
class Claim:
    """One published claim and its small-scale check.

    Attributes:
        id: the claim's id in the suite (``diloco-matches-ddp``).
        paper: where it comes from; ``where``: table, figure or section.
        claim: the claim in words; ``paper_figure``: the paper's number(s), as the paper
            gives them (or what could not be verified there).
        scale: the paper's scale against this experiment's.
        task: the task every configuration trains.
        common: the settings every configuration shares (``Config.settings`` names).
        configs: what is trained, each with every seed.
        rules: the verdict rules (all reproduced: reproduced; any not reproduced: not
            reproduced; else inconclusive).
        seeds: how many seeds (5 for runs under a minute, 3 otherwise), from seed 0.
        quick: settings that replace the others for ``--quick`` (one seed, short runs: a
            check of the machinery, never of the verdict).
    """

    id: str
    paper: Paper
    where: str
    claim: str
    paper_figure: str
    scale: str
    task: str
    common: Mapping[str, Any]
    configs: tuple[Config, ...]
    rules: tuple[Rule, ...]
    seeds: int
    quick: Mapping[str, Any]

    def __post_init__(self) -> None:
        labels = [c.label for c in self.configs]
        if len(set(labels)) != len(labels):
            raise ValueError(f"claim {self.id!r}: config labels repeat: {labels}")
        for rule in self.rules:
            for side in (rule.a, rule.b):
                if side not in labels:
                    raise ValueError(f"claim {self.id!r}: a rule compares {side!r}, not one of "
                                     f"its configs {labels}")
        if not self.rules:
            raise ValueError(f"claim {self.id!r} has no verdict rule")
        if self.seeds < 1:
            raise ValueError(f"claim {self.id!r}: seeds must be >= 1, got {self.seeds}")
        _check_settings(self.common, f"claim {self.id!r}'s common settings")
        _check_settings(self.quick, f"claim {self.id!r}'s quick settings")

    def config(self, label: str) -> Config:
        return next(c for c in self.configs if c.label == label)

    def settings_of(self, config: Config, quick: bool) -> dict[str, Any]:
        """``config``'s run settings: the claim's common ones, the config's, and with
        ``quick`` the quick ones over both."""
        return {**self.common, **config.settings, **(self.quick if quick else {})}


_NOT_SETTINGS = ("strategy", "out_dir", "seed", "resume", "sinks", "run_info", "progress",
                 "distributed", "handle_signals")


def _check_settings(given: Mapping[str, Any], where: str) -> None:
    known = settings()
    for name in given:
        if name not in known or name in _NOT_SETTINGS:
            allowed = sorted(set(known) - set(_NOT_SETTINGS))
            raise ValueError(f"{where}: {name!r} is not a run setting a claim gives; allowed: "
                             f"{', '.join(allowed)}")
