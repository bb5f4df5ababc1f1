"""One training run: the trainer, its loop, where its nodes live, what it writes, real processes.

The room's map (each package's ``__init__`` has its own; docs/design.md, "Modules"):

- :mod:`exogym.run.trainer`: :class:`Trainer` (``exogym.Trainer``): ``fit`` checks its
  arguments, builds the run, drives it (one process, or one rank of many);
- :mod:`exogym.run.options`: :class:`FitOptions`, every setting of a run declared once (its
  default, help, validation, CLI flag, where it is recorded); :mod:`exogym.run.resolve`: the
  checks that need the model, data and strategy, and the resume rules;
  :mod:`exogym.run.settings`: :class:`~exogym.run.settings.RunSettings`, the resolved settings;
- :mod:`exogym.run.launch`: the same ``fit`` on real local processes (:func:`fit_processes`);
- :mod:`exogym.run.loop`: the loop of one run: :class:`~exogym.run.loop.run.Run` (the state
  between two steps), the schedulers (lockstep, a population's rounds, per-node timelines), the
  clock's feed and the evaluation;
- :mod:`exogym.run.nodes`: where the nodes live: in memory, paged groups, a population's seats;
- :mod:`exogym.run.output`: what a run writes: the result, metrics rows and sinks, checkpoints,
  the timeline;
- :mod:`exogym.run.dist`: across real processes: ranks, torchrun, the distributed communicator;
- :mod:`exogym.run.ft`: real failures survived on torchft (``--ft``).

Imports go down this list's layers, never up: ``launch`` and ``ft`` > ``trainer`` > ``resolve``,
``loop`` > ``options``, ``nodes`` > ``output``, ``dist``, ``settings`` (import-linter's acyclic
contract checks it; the packages' maps say what each may import).

The public names, imported on first use: ``from exogym.run import Trainer, FitResult, ...``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exogym.utils.lazy import lazy_exports

if TYPE_CHECKING:
    from exogym.run.dist import DistributedCommunicator
    from exogym.run.launch import fit_processes
    from exogym.run.loop.drive import RunInterrupted
    from exogym.run.options import FitOptions
    from exogym.run.output.checkpoint import CheckpointError
    from exogym.run.output.result import FitResult, NonFiniteLossError
    from exogym.run.output.sinks import CSVSink, MultiSink, Sink, TensorBoardSink, WandbSink
    from exogym.run.trainer import Trainer

__all__ = ["CSVSink", "CheckpointError", "DistributedCommunicator", "FitOptions", "FitResult",
           "MultiSink", "NonFiniteLossError", "RunInterrupted", "Sink", "TensorBoardSink",
           "Trainer", "WandbSink", "fit_processes"]

_EXPORTS = {
    "CSVSink": "exogym.run.output.sinks", "CheckpointError": "exogym.run.output.checkpoint",
    "DistributedCommunicator": "exogym.run.dist", "FitOptions": "exogym.run.options",
    "FitResult": "exogym.run.output.result", "MultiSink": "exogym.run.output.sinks",
    "NonFiniteLossError": "exogym.run.output.result", "RunInterrupted": "exogym.run.loop.drive",
    "Sink": "exogym.run.output.sinks", "TensorBoardSink": "exogym.run.output.sinks",
    "Trainer": "exogym.run.trainer", "WandbSink": "exogym.run.output.sinks",
    "fit_processes": "exogym.run.launch",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
