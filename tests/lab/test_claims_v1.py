"""claims-v1's statistics (exogym.lab.claims.intervals): Student's t quantiles against their
tables, the t-interval worked by hand, its coverage checked by simulation at the suite's seed
counts (and v0's bootstrap shown not to cover), equivalence and superiority decided by where
the interval lies, the seeds a smallest effect needs."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from exogym.lab.claims.intervals import (
    equivalence,
    seeds_for,
    superiority,
    t_interval,
    t_quantile,
)
from exogym.lab.claims.measure import RunRecord
from exogym.lab.claims.spec import Claim, Config, Paper, Rule
from exogym.lab.claims.stats import RuleOutcome, bootstrap_ci
from exogym.lab.claims.suite import ClaimOutcome, decide_rule, fingerprint


@pytest.mark.parametrize(("level", "nu", "table"), [
    (0.95, 1, 12.706204736174698), (0.95, 2, 4.302652729749464), (0.95, 4, 2.7764451051977987),
    (0.95, 10, 2.2281388519649385), (0.95, 30, 2.0422724563012373),
    (0.90, 4, 2.131846786326649), (0.60, 9, 0.8834038596181806),
])
def test_t_quantiles_are_the_tables(level: float, nu: int, table: float) -> None:
    assert t_quantile(level, nu) == pytest.approx(table, rel=1e-9)


def test_the_t_interval_by_hand() -> None:
    # mean 3, sd sqrt(2.5), half-width 2.7764451 * sqrt(2.5) / sqrt(5) = 1.96321...
    lo, hi = t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.7764451051977987 * math.sqrt(2.5) / math.sqrt(5)
    assert lo == pytest.approx(3 - half, rel=1e-12) and hi == pytest.approx(3 + half, rel=1e-12)
    with pytest.raises(ValueError, match="2 values or more"):
        t_interval([1.0])
    with pytest.raises(ValueError, match="finite values"):
        t_interval([1.0, math.inf])


def _coverage(draw: np.ndarray, truth: float, interval) -> float:
    hits = 0
    for row in draw:
        lo, hi = interval(row)
        hits += lo <= truth <= hi
    return hits / len(draw)


@pytest.mark.parametrize("n", [5, 6, 8])
def test_the_interval_covers_what_it_says(n: int) -> None:
    """4,000 simulated suites of n seeds (binomial standard error 0.34%): a nominal 95% covers
    >= 93% on normal per-seed values and >= 90% on lognormal ones of sigma 0.5 (their mean
    exp(0.125)); v0's percentile bootstrap of 3 seeds covered far less."""
    rng = np.random.default_rng(n)
    assert _coverage(rng.normal(0.0, 1.0, (4000, n)), 0.0, t_interval) >= 0.93
    assert _coverage(rng.lognormal(0.0, 0.5, (4000, n)), math.exp(0.125), t_interval) >= 0.90
    boot = _coverage(rng.normal(0.0, 1.0, (400, 3)), 0.0,
                     lambda v: bootstrap_ci(v, resamples=2000))
    assert boot < 0.85  # the min and max of 3 values: 75% in theory


def test_superiority_and_equivalence_by_where_the_interval_lies() -> None:
    up = [0.9, 1.0, 1.1, 1.0, 1.0]  # t-interval about [0.90, 1.10]
    assert superiority(up, "above", 0.5).verdict == "reproduced"
    assert superiority(up, "below", 0.5).verdict == "not reproduced"
    assert superiority(up, "above", 1.0).verdict == "inconclusive"
    assert equivalence(up, 0.8, 1.2).verdict == "reproduced"
    assert equivalence(up, 0.95, 1.05).verdict == "inconclusive"  # straddles a bound
    assert equivalence(up, 1.5, 2.0).verdict == "not reproduced"  # wholly outside
    assert equivalence([1.0], 0.5, 2.0).verdict == "not decided"  # one seed
    assert superiority([1.0, math.nan], "above", 0.0).verdict == "inconclusive"
    with pytest.raises(ValueError, match="low < high"):
        equivalence(up, 1.0, 1.0)


def test_the_seeds_a_smallest_effect_needs_by_hand() -> None:
    # sd 1, delta 1: n = 9 gives (2.306 + 0.889) / 3 = 1.065 > 1; n = 10: (2.262 + 0.883) /
    # 3.162 = 0.995 <= 1
    assert seeds_for(1.0, 1.0) == (10, True)
    assert seeds_for(0.1, 1.0) == (5, True)  # the least
    assert seeds_for(1.0, 0.1) == (12, False)  # underpowered at the most
    with pytest.raises(ValueError, match="smallest effect of interest must be > 0"):
        seeds_for(1.0, 0.0)


# -- rules: kinds, censoring ----------------------------------------------------------------------
def _run(sim_time: float, reached_at: float | None, loss: float = 0.1) -> RunRecord:
    evals = [] if reached_at is None else [{"step": 10, "sim_time_s": reached_at,
                                            "eval_accuracy": 0.95}]
    return RunRecord({"final": {"eval_loss": loss, "eval_accuracy": 0.9}, "sim_time_s": sim_time,
                      "steps": 100, "bytes_sent_per_node": [8.0]}, evals)


def _claim(*rules: Rule) -> Claim:
    return Claim(id="c", paper=Paper("A", 2020, "T", "x"), where="w", claim="c", paper_figure="f",
                 scale="s", task="mnist", common={}, configs=(Config("a", "ddp"),
                                                              Config("b", "ddp")),
                 rules=rules, seeds=3, quick={}, interval="t")


def _rule() -> Rule:
    return Rule("r", "final_loss", "a", "b", "diff", "below", 0.0)


def outcome(c: Claim, verdict: str) -> ClaimOutcome:
    """``c`` decided ``verdict`` on two seeds (one rule, values 1 and 1): a report's input."""
    x = RuleOutcome((1.0, 1.0), 1.0, (1.0, 1.0), verdict)  # type: ignore[arg-type]
    return ClaimOutcome(c, (x,), verdict, 2, False)  # type: ignore[arg-type]


def test_time_to_target_is_censored_at_the_pair_s_budget_by_hand() -> None:
    # seed 0: a reaches at 4 s, b never within its 10 s: b counts 10 (its budget, the shorter
    # run's) -> a / b = 0.4; seed 1: a never (runs 6 s), b at 2 s of 9: the budget is 6 s ->
    # 6 / 2 = 3; seed 2: neither within 5 s (a's run): 5 / 5 = 1. Never infinite.
    rule = Rule("t", "time_to_accuracy", "a", "b", "ratio", "below", 1.0, target=0.95,
                censored=True)
    a = [_run(12.0, 4.0), _run(6.0, None), _run(5.0, None)]
    b = [_run(10.0, None), _run(9.0, 2.0), _run(8.0, 7.0)]
    out = decide_rule(_claim(rule), rule, a, b)
    assert out.values == pytest.approx((0.4, 3.0, 1.0))
    uncensored = Rule("t", "time_to_accuracy", "a", "b", "ratio", "below", 1.0, target=0.95)
    assert decide_rule(_claim(uncensored), uncensored, a, b).verdict == "inconclusive"  # inf


def test_an_equivalence_rule_and_a_reported_one() -> None:
    same = Rule("m", "final_loss", "a", "b", "ratio", "below", 1.0, kind="equivalence",
                margin=(1 / 1.1, 1.1))
    fixed = Rule("bytes", "bytes_per_node", "a", "b", "ratio", "below", 1.0, kind="reported")
    a = [_run(1.0, None, loss) for loss in (0.100, 0.101, 0.099)]
    b = [_run(1.0, None, loss) for loss in (0.100, 0.100, 0.100)]
    claim = _claim(same, fixed)
    assert decide_rule(claim, same, a, b).verdict == "reproduced"
    far = [_run(1.0, None, loss) for loss in (0.2, 0.21, 0.19)]
    assert decide_rule(claim, same, far, b).verdict == "not reproduced"
    reported = decide_rule(claim, fixed, a, b)
    assert reported.verdict == "reported" and reported.values == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="every rule is reported"):
        _claim(fixed)
    with pytest.raises(ValueError, match="an equivalence rule needs a margin"):
        Rule("m", "final_loss", "a", "b", "ratio", "below", 1.0, kind="equivalence")
    with pytest.raises(ValueError, match="censored applies to the \\*_to_accuracy metrics"):
        Rule("m", "final_loss", "a", "b", "ratio", "below", 1.0, censored=True)


def test_v0_s_fingerprints_are_what_its_recorded_folders_hold() -> None:
    # the fields added for v1 count only where they are not their defaults
    from exogym.lab.claims import v0

    assert fingerprint(v0.CLAIMS[0]) == "5b3e8bc86ca8b3b8"
    assert fingerprint(replace(v0.CLAIMS[0], first_seed=10)) != "5b3e8bc86ca8b3b8"


def test_a_failed_control_withholds_every_verdict() -> None:
    from exogym.lab.claims.report import failed_controls, format_markdown, to_json
    rule = Rule("m", "final_loss", "a", "b", "ratio", "below", 1.0, kind="equivalence",
                margin=(0.9, 1.1))
    null = replace(_claim(rule), id="null-control", control="null")
    claim = replace(_claim(rule), id="a-claim")

    ok = [outcome(null, "reproduced"), outcome(claim, "reproduced")]
    assert failed_controls(ok) == [] and "**reproduced** |" in format_markdown(ok, "t")
    bad = [outcome(null, "inconclusive"), outcome(claim, "reproduced")]
    text = format_markdown(bad, "t")
    assert failed_controls(bad) == ["null-control"]
    assert text.index("## Controls") < text.index("| claim |")
    assert "| `a-claim`: c |" in text and "withheld (a control failed) |" in text
    assert to_json(bad, "t")["verdicts_published"] is False


def test_the_negative_control_sends_diloco_s_bytes_and_never_moves_the_model() -> None:
    import torch
    from support.runs import check_run

    from exogym.lab.check import TinyNet
    from exogym.strategy import make

    broken = check_run(make("exogym.lab.claims.controls:DiLoCoWithoutOuterStep", H=2))
    diloco = check_run(make("diloco", H=2))
    assert broken.bytes_sent == diloco.bytes_sent and len(broken.comm_log) == 3
    torch.manual_seed(1)
    initial = TinyNet().state_dict()
    assert all(torch.equal(broken.model.state_dict()[k], v) for k, v in initial.items())
    assert not all(torch.equal(diloco.model.state_dict()[k], v) for k, v in initial.items())


def test_every_v1_rule_can_fail_and_no_fixed_quantity_is_evidence() -> None:
    """For each evidence rule of the suite, per-seed values that reproduce it and values that
    do not: no rule is decided by its configuration alone; the bytes of a fixed schedule are
    only ever reported."""
    from exogym.lab.claims import SUITES

    fixed_by_config = {"bytes_per_node", "peak_bytes_per_step"}
    for claim in SUITES["claims-v1"] + SUITES["claims-v1-diagnostics"]:
        assert claim.interval == "t" and claim.first_seed >= 5  # apart from v0's seeds 0-4
        assert claim.seeds >= 3 and claim.pilot
        for rule in claim.rules:
            if rule.metric in fixed_by_config:
                assert rule.kind == "reported", (claim.id, rule.text)
            if not rule.evidence:
                continue
            assert rule.effect is not None, (claim.id, rule.text)
            spread = [-1e-4, 0.0, 1e-4, 0.0, 0.0]
            if rule.kind == "equivalence":
                low, high = rule.margin  # type: ignore[misc]
                inside, outside = (low + high) / 2, high + (high - low)
                values = ([inside + d for d in spread], [outside + d for d in spread])
                outcomes = [equivalence(v, low, high).verdict for v in values]
            else:
                sign = -1.0 if rule.side == "below" else 1.0
                step = max(abs(rule.threshold), 1.0)
                values = ([rule.threshold + sign * step + d for d in spread],
                          [rule.threshold - sign * step + d for d in spread])
                outcomes = [superiority(v, rule.side, rule.threshold).verdict for v in values]
            assert outcomes == ["reproduced", "not reproduced"], (claim.id, rule.text)


def test_scale_or_defect_is_concluded_by_the_rule_written_before_the_runs() -> None:
    from exogym.lab.claims.diagnostics import conclude

    identity = replace(_claim(_rule()), id="i", diagnoses="x", role="identity")
    explanation = replace(_claim(_rule()), id="e", diagnoses="x", role="explanation")
    assert conclude([(identity, "not reproduced"), (explanation, "reproduced")]) == "defect"
    assert conclude([(identity, "inconclusive"), (explanation, "reproduced")]) == "not decided"
    assert conclude([(identity, "reproduced"), (explanation, "reproduced")]) == "explained"
    assert conclude([(identity, "reproduced"), (explanation, "inconclusive")]) == "not explained"
    assert conclude([(explanation, "not reproduced")]) == "not explained"
    assert conclude([(identity, "not decided"), (explanation, "not decided")]) == "not decided"
    assert conclude([(explanation, "not decided")]) == "not decided"  # --quick: one seed


def test_each_claim_v1_did_not_reproduce_has_its_diagnostics() -> None:
    from exogym.lab.claims import SUITES, v1
    from exogym.lab.claims.diagnostics import ONE_REPLICA_SWEEP

    checks = SUITES["claims-v1-diagnostics"]
    not_reproduced = {"diloco-non-iid", "fedprox-stragglers", "async-local-sgd-dn-dylu",
                      "sparta-sparse-averaging", "sparseloco-muloco-beat-diloco",
                      "diloco-one-replica-beats-dp"}  # claims-v1's record (docs/claims.md)
    assert {c.diagnoses for c in checks} == not_reproduced
    assert {c.id for c in v1.CLAIMS} >= not_reproduced
    for target in not_reproduced:  # an explanation each; an identity each but the async one
        roles = {c.role for c in checks if c.diagnoses == target}
        assert roles == ({"explanation"} if target.startswith("async") else
                         {"identity", "explanation"}), target
    tuned = next(c for c in checks if c.id.endswith("well-tuned"))
    lrs = {cfg.sets.get("outer_lr") for cfg in tuned.configs if cfg.strategy == "diloco"}
    assert lrs == {str(v) for v in ONE_REPLICA_SWEEP["chosen"].values()}  # the sweep's choice
    for batch, chosen in ONE_REPLICA_SWEEP["chosen"].items():  # the rule's choice: least loss
        losses = ONE_REPLICA_SWEEP["pilot_loss"][batch]
        assert set(losses) == set(ONE_REPLICA_SWEEP["grid"])
        assert chosen == min(losses, key=losses.get)


def test_a_diagnostic_names_its_claim_and_role_together() -> None:
    with pytest.raises(ValueError, match="both or neither"):
        replace(_claim(_rule()), diagnoses="x")
    with pytest.raises(ValueError, match="both or neither"):
        replace(_claim(_rule()), diagnoses="x", role="guess")  # type: ignore[arg-type]
    plain = _claim(_rule())
    assert fingerprint(replace(plain, diagnoses="x", role="identity")) != fingerprint(plain)


def test_the_diagnostics_table_concludes_each_claim() -> None:
    from exogym.lab.claims.report import format_markdown

    base = _claim(_rule())
    text = format_markdown([
        outcome(replace(base, id="x--i", diagnoses="x", role="identity"), "not reproduced"),
        outcome(replace(base, id="x--e", diagnoses="x", role="explanation"), "reproduced"),
        outcome(replace(base, id="y--e", diagnoses="y", role="explanation"), "reproduced"),
    ], "t")
    assert "| `x` | `x--i`: c | identity | **not reproduced** | **defect** |" in text
    assert ("| `y` | `y--e`: c | explanation | **reproduced** | **explained (no identity "
            "check: a defect not ruled out)** |") in text


def test_a_pipe_in_a_paper_s_words_stays_in_its_cell() -> None:
    import re

    from exogym.lab.claims.report import format_markdown

    claim = replace(_claim(_rule()), paper_figure="'reduced by a factor of |p|/L'")
    text = format_markdown([outcome(claim, "reproduced")], "t")
    row = next(line for line in text.splitlines() if line.startswith("| `c`"))
    assert "\\|p\\|/L" in row and len(re.findall(r"(?<!\\)\|", row)) == 6  # five cells
