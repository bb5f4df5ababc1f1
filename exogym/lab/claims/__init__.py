"""The claims suite: published results reproduced at small scale, each decided by a rule written
before its first run (docs/claims.md).

- :mod:`~exogym.lab.claims.spec`: a claim as data (:class:`Claim`, :class:`Config`,
  :class:`Rule`, :class:`Paper`).
- :mod:`~exogym.lab.claims.v0`: the suite ``claims-v0`` (:data:`CLAIMS`).
- :mod:`~exogym.lab.claims.measure`: a claim's quantities read from a run's folder.
- :mod:`~exogym.lab.claims.stats`: per-seed statistics, the bootstrap CI, the verdicts.
- :mod:`~exogym.lab.claims.suite`: :func:`run_claims`, resumable.
- :mod:`~exogym.lab.claims.report`: ``claims.json``, ``claims.md``, a plot per claim.

>>> from exogym.lab.claims import CLAIMS, SUITE, run_claims, select, write_report
>>> outcomes = run_claims(select(CLAIMS, ["diloco-matches-ddp"]), "runs/claims", suite=SUITE)
>>> write_report(outcomes, "runs/claims", SUITE)
"""

from exogym.lab.claims.report import write_report
from exogym.lab.claims.spec import Claim, Config, Paper, Rule
from exogym.lab.claims.suite import ClaimOutcome, run_claims, select
from exogym.lab.claims.v0 import CLAIMS, SUITE

__all__ = ["CLAIMS", "SUITE", "Claim", "ClaimOutcome", "Config", "Paper", "Rule", "run_claims",
           "select", "write_report"]
