"""The claims suite: published results reproduced at small scale, each decided by a rule written
before its first run (docs/claims.md).

- :mod:`~exogym.lab.claims.spec`: a claim as data (:class:`Claim`, :class:`Config`,
  :class:`Rule`, :class:`Paper`).
- :mod:`~exogym.lab.claims.v1`: the suite ``claims-v1`` (:data:`CLAIMS`, the default), with
  its controls (:mod:`~exogym.lab.claims.controls`); :mod:`~exogym.lab.claims.v0`: ``claims-v0``,
  superseded, kept as it was recorded; :mod:`~exogym.lab.claims.diagnostics`:
  ``claims-v1-diagnostics``, scale or defect for each claim ``claims-v1`` did not reproduce
  (:data:`SUITES` names all three).
- :mod:`~exogym.lab.claims.intervals`: ``claims-v1``'s t-intervals, equivalence, seeds by power;
  :mod:`~exogym.lab.claims.provenance`: what produced a results folder.
- :mod:`~exogym.lab.claims.measure`: a claim's quantities read from a run's folder.
- :mod:`~exogym.lab.claims.stats`: per-seed statistics, the bootstrap CI, the verdicts.
- :mod:`~exogym.lab.claims.suite`: :func:`run_claims`, resumable.
- :mod:`~exogym.lab.claims.report`: ``claims.json``, ``claims.md``, a plot per claim.

>>> from exogym.lab.claims import CLAIMS, SUITE, run_claims, select, write_report
>>> outcomes = run_claims(select(CLAIMS, ["diloco-matches-ddp"]), "runs/claims", suite=SUITE)
>>> write_report(outcomes, "runs/claims", SUITE)
"""

from exogym.lab.claims import diagnostics, v0, v1
from exogym.lab.claims.report import write_report
from exogym.lab.claims.spec import Claim, Config, Paper, Rule
from exogym.lab.claims.suite import ClaimOutcome, run_claims, select
from exogym.lab.claims.v1 import CLAIMS, SUITE

SUITES: dict[str, tuple[Claim, ...]] = {v0.SUITE: v0.CLAIMS, v1.SUITE: v1.CLAIMS,
                                        diagnostics.SUITE: diagnostics.CLAIMS}
"""Every suite by name; :data:`SUITE` (``claims-v1``) is the default;
``claims-v1-diagnostics`` tells scale from defect for the claims it did not reproduce."""

__all__ = ["CLAIMS", "SUITE", "SUITES", "Claim", "ClaimOutcome", "Config", "Paper", "Rule",
           "run_claims", "select", "write_report"]
