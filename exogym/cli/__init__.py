"""The ``exogym`` command line: ``run``, ``compare``, ``sweep``, ``bench``, ``sample``,
``strategies``, ``tasks``, ``networks``, ``check``, ``recost``, ``trace``, ``estimate``,
``calibrate``; one module each, :mod:`exogym.cli.app` the command itself (:func:`main`).

A thin layer over :class:`exogym.Trainer`, the task registry and the strategy registry: every
strategy hyperparameter is reachable with ``--set KEY=VALUE`` and checked against the strategy's
fields, so a typo is an error, never a silently ignored option; ``exogym run``'s other options
are the run settings' declarations (:mod:`exogym.run.options`). ``run`` under ``torchrun`` runs
as one rank of a multi-process job (:meth:`exogym.Trainer.fit` joins torchrun's group);
``compare`` runs several strategies on one task (:mod:`exogym.lab.compare`); ``sample`` prints text
from a language-model run (:mod:`exogym.lab.sample`); ``recost`` replays a finished run's recorded
collectives on other networks (:mod:`exogym.sim.clock`); ``trace`` writes a finished run's timeline
as a Chrome trace (:mod:`exogym.run.output.trace`); ``estimate`` is the analytic calculator of
:mod:`exogym.lab.estimate`.

Importing this package imports no torch (only the standard library and torch-free exogym
modules): :func:`main` handles SIGINT / SIGTERM before anything heavy is imported, so a signal in
the seconds torch takes to import ends the command with a message and status 130 too. Everything
else is imported inside the function that needs it.
"""

from __future__ import annotations

from exogym.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
