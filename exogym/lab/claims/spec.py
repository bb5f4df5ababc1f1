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

__all__ = ["METRICS", "RULE_KINDS", "Claim", "Config", "Paper", "Rule"]

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
    ``common`` settings. ``data_offset``: the run's seed (its data order, draws) is the seed plus
    this, its initial model the seed's: a null control's other data orders."""

    label: str
    strategy: str
    sets: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)
    data_offset: int = 0

    def __post_init__(self) -> None:
        if not self.label or not self.label.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"a config's label is letters, digits, - and _, got "
                             f"{self.label!r}")
        _check_settings(self.settings, f"config {self.label!r}")


RuleKind = Literal["superiority", "equivalence", "reported"]
RULE_KINDS: tuple[str, ...] = ("superiority", "equivalence", "reported")


@dataclass(frozen=True)
class Rule:
    """One verdict rule: per seed, ``metric(a) - metric(b)`` (``form="diff"``) or
    ``metric(a) / metric(b)`` (``"ratio"``); the mean over the seeds with a 95% interval
    (``claims-v0``: the bootstrap, :mod:`exogym.lab.claims.stats`; ``claims-v1``: Student's t,
    :mod:`exogym.lab.claims.intervals`). A ``superiority`` rule says the mean is on ``side`` of
    ``threshold``: **reproduced** when the whole interval is there, **not reproduced** when it
    is wholly on the other side, **inconclusive** when it straddles the threshold. An
    ``equivalence`` rule ("matches") says it lies within ``margin``: reproduced when the whole
    interval does, not reproduced when the whole interval lies outside. A ``reported`` rule is a
    quantity the configuration fixes (a schedule's bytes): shown, never evidence.

    Attributes:
        text: the rule in words (the docs' table shows it).
        target: the accuracy of ``time_to_accuracy`` / ``steps_to_accuracy``.
        kind: ``superiority`` (the default, ``claims-v0``'s only kind), ``equivalence`` or
            ``reported``.
        margin: an equivalence rule's ``(low, high)`` on the per-seed statistic.
        effect: the smallest effect of interest, in the statistic's units (``claims-v1``: the
            test seeds are chosen to resolve it; :func:`exogym.lab.claims.intervals.seeds_for`).
        censored: a ``*_to_accuracy`` metric read with both runs of a seed censored at their
            common budget (the shorter run's simulated time, or steps): a run that does not
            reach the target by then counts as the budget, never as infinity.
    """

    text: str
    metric: str
    a: str
    b: str
    form: Literal["diff", "ratio"]
    side: Literal["below", "above"]
    threshold: float
    target: float | None = None
    kind: RuleKind = "superiority"
    margin: tuple[float, float] | None = None
    effect: float | None = None
    censored: bool = False

    def __post_init__(self) -> None:
        self._check_kind()
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

    def _check_kind(self) -> None:
        if self.kind not in RULE_KINDS:
            raise ValueError(f"rule kind must be one of {list(RULE_KINDS)}, got {self.kind!r}")
        if (self.kind == "equivalence") != (self.margin is not None):
            raise ValueError("an equivalence rule needs a margin (low, high), and only it")
        if self.margin is not None and not self.margin[0] < self.margin[1]:
            raise ValueError(f"an equivalence margin needs low < high, got {self.margin}")
        if self.effect is not None and not self.effect > 0:
            raise ValueError(f"a rule's smallest effect of interest must be > 0, got "
                             f"{self.effect}")
        if self.censored and not self.metric.endswith("_to_accuracy"):
            raise ValueError(f"censored applies to the *_to_accuracy metrics, not "
                             f"{self.metric!r}")

    @property
    def evidence(self) -> bool:
        """Whether the rule counts towards the verdict (a reported one does not)."""
        return self.kind != "reported"


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
        seeds: how many seeds (5 for runs under a minute, 3 otherwise), from ``first_seed``.
        quick: settings that replace the others for ``--quick`` (one seed, short runs: a
            check of the machinery, never of the verdict).
        first_seed: the first test seed (``claims-v1``: 10, apart from the pilot's seeds).
        interval: ``"bootstrap"`` (``claims-v0``) or ``"t"`` (``claims-v1``).
        pilot: how the seed count was chosen (the pilot's seeds, its spread, the effect).
        control: ``"null"`` (must come out reproduced: a method against itself) or
            ``"negative"`` (must come out not reproduced: a method broken on purpose); None:
            a claim. A suite whose controls fail publishes no verdict.
        diagnoses: the id of the claim (of another suite) this one diagnoses, with ``role``:
            ``"identity"`` (equal by construction when the code is right: not reproduced means
            a defect) or ``"explanation"`` (a setting nearer the paper's, where the claim
            should hold if scale or setting explains the miss);
            :mod:`exogym.lab.claims.diagnostics`. None: not a diagnostic.
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
    first_seed: int = 0
    interval: Literal["bootstrap", "t"] = "bootstrap"
    pilot: str = ""
    control: Literal["null", "negative"] | None = None
    diagnoses: str | None = None
    role: Literal["identity", "explanation"] | None = None

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
        if self.interval not in ("bootstrap", "t"):
            raise ValueError(f"claim {self.id!r}: interval must be 'bootstrap' or 't', got "
                             f"{self.interval!r}")
        if self.control not in (None, "null", "negative"):
            raise ValueError(f"claim {self.id!r}: control must be 'null', 'negative' or None, "
                             f"got {self.control!r}")
        if (self.diagnoses is None) != (self.role is None) or self.role not in (
                None, "identity", "explanation"):
            raise ValueError(f"claim {self.id!r}: a diagnostic names the claim it diagnoses and "
                             f"its role ('identity' or 'explanation'), both or neither; got "
                             f"diagnoses={self.diagnoses!r}, role={self.role!r}")
        if not any(r.evidence for r in self.rules):
            raise ValueError(f"claim {self.id!r}: every rule is reported; a claim needs one "
                             "that is evidence")
        _check_settings(self.common, f"claim {self.id!r}'s common settings")
        _check_settings(self.quick, f"claim {self.id!r}'s quick settings")

    @property
    def seed_ids(self) -> range:
        """The test seeds."""
        return range(self.first_seed, self.first_seed + self.seeds)

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
