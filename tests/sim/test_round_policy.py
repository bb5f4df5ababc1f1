"""A round's rules (exogym.sim.round_policy): over-selection, the deadline, the minimum of
reports and dropouts decided on report times worked by hand; the spec and its errors."""

from __future__ import annotations

import pytest

from exogym.sim.participation import Participation
from exogym.sim.round_policy import RoundPolicy, decide, parse_round_policy

# three seats report at 3 s, 1 s and 2 s after a round that started at 0
REPORTS = {0: 3.0, 1: 1.0, 2: 2.0}


def test_the_first_k_reports_are_kept_and_the_rest_discarded() -> None:
    out = decide(RoundPolicy(over_selection=1.5), 2, 0.0, REPORTS, set())
    assert out.kept == [1, 2] and out.fates == {0: "discarded"} and out.release == 2.0


def test_a_deadline_cuts_late_reports_and_too_few_abandon_the_round() -> None:
    # deadline 1.5 s: seat 0 (3 s) and seat 2 (2 s) are late; seat 1 alone is kept
    out = decide(RoundPolicy(deadline_s=1.5), 2, 0.0, REPORTS, set())
    assert out.kept == [1] and out.fates == {0: "late", 2: "late"} and out.release == 1.0
    # ... which is fewer than min_reports=2: the round is abandoned
    out = decide(RoundPolicy(deadline_s=1.5, min_reports=2), 2, 0.0, REPORTS, set())
    assert out.abandoned and out.fates == {0: "late", 1: "abandoned", 2: "late"}
    # the deadline counts from the round's start
    assert decide(RoundPolicy(deadline_s=1.5), 2, 1.0, REPORTS, set()).kept == [1, 2]


def test_a_client_that_drops_out_never_reports() -> None:
    out = decide(RoundPolicy(over_selection=1.5), 2, 0.0, REPORTS, {1})
    assert out.kept == [0, 2] and out.fates == {1: "dropout"} and out.release == 3.0


def test_ties_go_to_the_lower_seat() -> None:
    out = decide(RoundPolicy(), 1, 0.0, {0: 1.0, 1: 1.0}, set())
    assert out.kept == [0] and out.fates == {1: "discarded"}


def test_over_selection_draws_ceil_r_k() -> None:
    assert Participation(count=10, over_selection=1.3).per_round(100) == 13
    assert Participation(count=10, over_selection=1.3).reports(100) == 10
    assert Participation(count=3, over_selection=1.3).per_round(100) == 4  # ceil(3.9)
    assert Participation(count=10, over_selection=1.3).per_round(12) == 12  # at most N
    assert RoundPolicy(over_selection=1.3).drawn(10) == 13


def test_the_spec_reads_back_and_bad_items_are_named() -> None:
    p = parse_round_policy("over_selection=1.3,deadline=1min,min_reports=8,dropouts=off")
    assert p == RoundPolicy(1.3, 60.0, 8, False) and parse_round_policy(p.spec()) == p
    assert parse_round_policy(None) is None and parse_round_policy(p) is p
    for spec, match in [
        ("over=1.3", r"keys over_selection, deadline, min_reports, dropouts; got 'over=1.3'"),
        ("over_selection=0.5", r"over_selection must be a number in \[1, 10\] .*got 0.5"),
        # huge but finite: ceil(r K) overflowed
        ("over_selection=1e300", r"over_selection must be a number in \[1, 10\] .*got 1e\+300"),
        ("deadline=1e300s", r"deadline must be a duration in \(0, 1e\+07\] seconds"),
        ("deadline=-1s", "deadline"),
        ("min_reports=0", r"min_reports must be an integer >= 1, got 0"),
        ("dropouts=yes", r"dropouts=yes: takes on or off, got 'yes'"),
        ("min_reports=2,min_reports=3", "min_reports given twice"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse_round_policy(spec)
    with pytest.raises(ValueError, match="min_reports=5 is more than the 4 reports"):
        RoundPolicy(min_reports=5).check(4)
