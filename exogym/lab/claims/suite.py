"""Run claims and decide them: :func:`run_claims` trains every configuration of every claim with
its seeds (resumable), reads the runs, decides the rules (:mod:`exogym.lab.claims.stats`) and
writes the report (:mod:`exogym.lab.claims.report`).

The results folder ``OUT``: ``OUT/suite.json`` (the suite, ``--quick`` or not, each claim's spec
fingerprint), ``OUT/provenance.json`` (each session's commit, versions, machine and times),
``OUT/ID/LABEL-seedS/`` a run folder as ``exogym run`` writes it, ``OUT/claims.json`` and
``OUT/claims.md`` the verdicts, ``OUT/ID.png`` a claim's plot. Run the same command again and
the finished runs (those with a ``summary.json``) are read, not retrained; an unfinished run's
folder is cleared and trained from its start. A folder of another suite, of the other mode
(``--quick`` or not) or of a claim whose spec changed since its runs is an error naming it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from exogym import strategy as strategies
from exogym.lab.claims.intervals import equivalence, superiority
from exogym.lab.claims.measure import RunRecord, read_run
from exogym.lab.claims.provenance import checked_source, close_session, open_session
from exogym.lab.claims.spec import Claim, Config, Rule
from exogym.lab.claims.stats import RuleOutcome, Verdict, claim_verdict, decide, per_seed
from exogym.lab.progress import RunProgress
from exogym.run.options import settings
from exogym.tasks.registry import Task, get_task

__all__ = ["ClaimOutcome", "command_of", "decide_rule", "fingerprint", "run_claims", "select"]


@dataclass(frozen=True)
class ClaimOutcome:
    """A claim decided: each rule's outcome (in the spec's order), the verdict, the seeds."""

    claim: Claim
    rules: tuple[RuleOutcome, ...]
    verdict: Verdict
    seeds: int
    quick: bool


def select(claims: Sequence[Claim], only: Sequence[str] | None) -> list[Claim]:
    """The claims named in ``only`` (None: all), in the suite's order; an unknown id is an
    error naming the known ones."""
    if only is None:
        return list(claims)
    ids = [c.id for c in claims]
    unknown = [i for i in only if i not in ids]
    if unknown:
        raise ValueError(f"unknown claim(s) {', '.join(unknown)}; the suite's: {', '.join(ids)}")
    return [c for c in claims if c.id in only]


def fingerprint(claim: Claim) -> str:
    """A hash of what decides the claim's runs and verdict (its task, settings, configs, rules,
    seeds and quick settings; not its prose): runs of another spec are not this claim's. The
    fields added with ``claims-v1`` count where they are not their defaults, so that
    ``claims-v0``'s fingerprints stay what its recorded folders hold."""
    rules = tuple(_changed_repr(r, ("kind", "margin", "effect", "censored")) for r in claim.rules)
    configs = tuple(_changed_repr(c, ("data_offset",)) for c in claim.configs)
    decisive: tuple[Any, ...] = (claim.task, claim.common, configs, rules, claim.seeds,
                                 claim.quick)
    extra = {k: getattr(claim, k) for k in ("first_seed", "interval", "control", "diagnoses",
                                            "role")
             if getattr(claim, k) != Claim.__dataclass_fields__[k].default}
    if extra:
        decisive += (extra,)
    return hashlib.sha256(repr(decisive).encode()).hexdigest()[:16]


class _Repr:
    """An object whose repr is the given text (a tuple of them reprs as a tuple of objects)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _changed_repr(obj: Rule | Config, added: tuple[str, ...]) -> _Repr:
    """``obj``'s dataclass repr as it was before the fields ``added`` existed, those of them
    that are not their defaults appended."""
    fields = type(obj).__dataclass_fields__
    old = ", ".join(f"{k}={getattr(obj, k)!r}" for k in fields if k not in added)
    new = "".join(f", {k}={getattr(obj, k)!r}" for k in added
                  if getattr(obj, k) != fields[k].default)
    return _Repr(f"{type(obj).__name__}({old}{new})")


def command_of(claim: Claim, config: Config, quick: bool = False) -> str:
    """``config``'s ``exogym run`` command (without ``--seed`` and ``--out``)."""
    parts = ["exogym run", f"--task {claim.task}", f"--strategy {config.strategy}"]
    parts += [f"--set {k}={v}" for k, v in config.sets.items()]
    known = settings()
    for name, value in claim.settings_of(config, quick).items():
        flag = known[name].flag
        if flag is None:
            parts.append(f"(fit {name}={value!r})")
        elif isinstance(value, bool):
            if value:
                parts.append(flag)
        else:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


def run_claims(claims: Sequence[Claim], out_dir: str | Path, *, suite: str,
               quick: bool = False, data_dir: str | Path | None = None,
               download: bool = True, progress: bool = False,
               allow_dirty: bool = False) -> list[ClaimOutcome]:
    """Train, read and decide ``claims`` into ``out_dir`` (module docstring); ``suite``: the
    suite's name and version (``claims-v0``). ``quick``: one seed and each claim's ``quick``
    settings (a check of the machinery: the verdicts are not the claims'). The session is
    recorded in ``out_dir/provenance.json`` (:mod:`exogym.lab.claims.provenance`); code with
    uncommitted changes is refused unless ``allow_dirty``."""
    out = Path(out_dir)
    source = checked_source(allow_dirty=allow_dirty)
    _open(out, suite, quick, claims)
    session = open_session(out, source)
    total = sum((1 if quick else c.seeds) * len(c.configs) for c in claims)
    meter = RunProgress(total) if progress else None
    outcomes = []
    for claim in claims:
        seeds = 1 if quick else claim.seeds
        runs = _train(claim, out / claim.id, seeds, quick, data_dir, download, meter)
        outcomes.append(_decide(claim, runs, seeds, quick))
    close_session(out, session)
    return outcomes


def _open(out: Path, suite: str, quick: bool, claims: Sequence[Claim]) -> None:
    """Create ``out``'s record, or check that the folder holds this suite's runs."""
    record_path = out / "suite.json"
    specs = {c.id: fingerprint(c) for c in claims}
    if record_path.exists():
        record = _read_record(record_path)
        if record["suite"] != suite or record["quick"] != quick:
            raise ValueError(f"{out} holds the runs of {record['suite']} (quick="
                             f"{record['quick']}), not of {suite} (quick={quick}): give "
                             "another folder")
        changed = [i for i, f in specs.items() if record["claims"].get(i, f) != f]
        if changed:
            raise ValueError(f"{out}: the spec of {', '.join(changed)} changed since its runs; "
                             "its runs are not this spec's: give another folder")
        specs = {**record["claims"], **specs}
    elif out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not a claims folder (no suite.json)")
    out.mkdir(parents=True, exist_ok=True)
    record_path.write_text(json.dumps({"suite": suite, "quick": quick, "claims": specs},
                                      indent=1) + "\n", encoding="utf-8")


def _read_record(path: Path) -> dict[str, Any]:
    """``path``'s suite record (``{"suite": str, "quick": bool, "claims": {id: fingerprint}}``);
    a file that is not one (not JSON, or JSON of another shape) is an error naming it and what
    to do, not the JSON parser's words or a KeyError."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        problem = None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        record, problem = None, f"not valid JSON ({err})"
    if problem is None and not (
            isinstance(record, dict) and isinstance(record.get("suite"), str)
            and isinstance(record.get("quick"), bool) and isinstance(record.get("claims"), dict)
            and all(isinstance(k, str) and isinstance(v, str)
                    for k, v in record["claims"].items())):
        problem = ('JSON of another shape (expected {"suite": ..., "quick": ..., "claims": '
                   '{...}})')
    if problem is not None:
        raise ValueError(f"{path} is {problem}: it is not a claims suite record written by "
                         f"`exogym claims`; give another --out, or remove the folder "
                         f"{path.parent} to start afresh")
    return record


def _train(claim: Claim, folder: Path, seeds: int, quick: bool, data_dir: str | Path | None,
           download: bool, meter: RunProgress | None) -> dict[str, list[RunRecord]]:
    """Every config with every seed (seed by seed: the claim's first ``seeds`` test seeds), the
    finished ones read back."""
    task = get_task(claim.task)
    data: tuple[Any, Any] | None = None
    runs: dict[str, list[RunRecord]] = {c.label: [] for c in claim.configs}
    shared = _SharedRuns(folder.parent)
    for seed in claim.seed_ids[:seeds]:
        for config in claim.configs:
            key = run_key(claim, config, seed, quick)
            run_dir = shared.finished(key) or folder / f"{config.label}-seed{seed}"
            if (run_dir / "summary.json").exists():
                if meter is not None:
                    meter.skip()
            else:
                if run_dir.exists():
                    shutil.rmtree(run_dir)  # unfinished: trained again from its start
                if data is None:
                    data = task.load_data(data_dir, download)
                if meter is not None:
                    meter.begin(f"{claim.id}: {config.label} seed {seed}", run_dir)
                _fit(task, claim, config, seed, quick, run_dir, *data)
                if meter is not None:
                    meter.end()
            shared.add(key, run_dir)
            runs[config.label].append(read_run(run_dir))
    return runs


def run_key(claim: Claim, config: Config, seed: int, quick: bool) -> str:
    """What makes a run the same run in any claim: its task, strategy, settings and seeds."""
    what = (claim.task, config.strategy, sorted(config.sets.items()),
            sorted((k, repr(v)) for k, v in claim.settings_of(config, quick).items()), seed,
            config.data_offset)
    return hashlib.sha256(repr(what).encode()).hexdigest()[:16]


class _SharedRuns:
    """``OUT/runs.json``: each finished run's key and folder, so that a run two claims share
    (DDP on 8 nodes, DiLoCo at H = 50) trains once and each claim reads it."""

    def __init__(self, out: Path) -> None:
        self.path = out / "runs.json"
        self.index: dict[str, str] = (json.loads(self.path.read_text(encoding="utf-8"))
                                      if self.path.exists() else {})

    def finished(self, key: str) -> Path | None:
        where = self.index.get(key)
        run_dir = None if where is None else self.path.parent / where
        return run_dir if run_dir is not None and (run_dir / "summary.json").exists() else None

    def add(self, key: str, run_dir: Path) -> None:
        where = str(run_dir.relative_to(self.path.parent))
        if self.index.get(key) == where:
            return
        self.index.setdefault(key, where)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.index, indent=1) + "\n", encoding="utf-8")
        tmp.replace(self.path)


def _fit(task: Task, claim: Claim, config: Config, seed: int, quick: bool, run_dir: Path,
         train: Any, test: Any) -> None:
    """One run, as ``exogym run`` trains it: the task's learning rate, batch size and
    evaluation interval unless given, the model built after ``torch.manual_seed(seed)``."""
    from exogym.run.trainer import Trainer

    sets = dict(config.sets)
    if "lr" not in sets and "optim.lr" not in sets:
        sets["optim.lr"] = str(task.lr)
    strategy = strategies.make(config.strategy, **sets)
    fit = claim.settings_of(config, quick)
    fit.setdefault("batch_size", task.batch_size)
    fit.setdefault("eval_interval", task.eval_interval)
    torch.manual_seed(seed)
    model = task.build_model()
    Trainer(model, train, test).fit(strategy=strategy, seed=seed + config.data_offset,
                                    out_dir=run_dir, progress=False,
                                    run_info=task.run_info(train), **fit)


def _decide(claim: Claim, runs: dict[str, list[RunRecord]], seeds: int,
            quick: bool) -> ClaimOutcome:
    outcomes = [decide_rule(claim, rule, runs[rule.a], runs[rule.b]) for rule in claim.rules]
    verdict = claim_verdict([o.verdict for r, o in zip(claim.rules, outcomes, strict=True)
                             if r.evidence])
    return ClaimOutcome(claim, tuple(outcomes), verdict, seeds, quick)


def decide_rule(claim: Claim, rule: Rule, a_runs: Sequence[RunRecord],
                b_runs: Sequence[RunRecord]) -> RuleOutcome:
    """One rule over the seeds' paired runs: ``claims-v0``'s bootstrap, or ``claims-v1``'s
    t-interval by the rule's kind (a reported rule's values and interval, no verdict)."""
    a, b = _paired_values(rule, a_runs, b_runs)
    values = per_seed(a, b, rule.form)
    if claim.interval == "bootstrap":
        return decide(values, rule.side, rule.threshold)
    if rule.kind == "equivalence":
        assert rule.margin is not None
        return equivalence(values, *rule.margin)
    outcome = superiority(values, rule.side, rule.threshold)
    if rule.kind == "reported":
        return RuleOutcome(outcome.values, outcome.mean, outcome.ci, "reported")
    return outcome


def _paired_values(rule: Rule, a_runs: Sequence[RunRecord],
                   b_runs: Sequence[RunRecord]) -> tuple[list[float], list[float]]:
    """Each seed's metric of both runs; a censored rule's ``*_to_accuracy`` at most the pair's
    common budget (the shorter run's simulated time, or steps): never infinite."""
    a = [r.value(rule.metric, rule.target) for r in a_runs]
    b = [r.value(rule.metric, rule.target) for r in b_runs]
    if not rule.censored:
        return a, b
    unit = {"time_to_accuracy": "sim_time", "steps_to_accuracy": "steps",
            "rounds_to_accuracy": "rounds"}[rule.metric]
    budgets = [min(x.extent(unit), y.extent(unit)) for x, y in zip(a_runs, b_runs, strict=True)]
    return ([min(v, c) for v, c in zip(a, budgets, strict=True)],
            [min(v, c) for v, c in zip(b, budgets, strict=True)])
