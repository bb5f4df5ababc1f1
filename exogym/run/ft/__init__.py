"""Real runs that survive real failures: exogym's strategies on torchft (``--ft``).

- :mod:`~exogym.run.ft.manager`: what every replica shares: the communicator whose all-reduces
  go through torchft's ``Manager``, the strategies it takes, the state a heal carries, kill
  points and the replica's log;
- :mod:`~exogym.run.ft.replica`: one replica's training loop (quorum, commit, heal, redo);
- :mod:`~exogym.run.ft.launch`: a run on this machine (a Lighthouse, a process per replica,
  restarts; :func:`~exogym.run.ft.launch.fit_ft`) or under torchrun, and the chaos harness
  (:class:`~exogym.run.ft.launch.Kill`);
- :mod:`~exogym.run.ft.record`: the replicas' files merged into the run's;
- :mod:`~exogym.run.ft.replay`: a real run's failures replayed in the simulator
  (:func:`~exogym.run.ft.replay.world_of`) and the two compared.

Imports: :mod:`exogym.run.dist`, :mod:`exogym.run.output`, the strategies and the simulator;
torchft itself only when a run starts (:func:`~exogym.run.ft.manager.require_torchft`). The
public names, imported on first use: ``from exogym.run.ft import fit_ft, Kill, world_of``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exogym.utils.lazy import lazy_exports

if TYPE_CHECKING:
    from exogym.run.ft.launch import Kill, fit_ft, fit_ft_torchrun
    from exogym.run.ft.manager import FT_STRATEGIES, FTUnavailable, check_ft_strategy
    from exogym.run.ft.replay import compare, world_of

__all__ = ["FT_STRATEGIES", "FTUnavailable", "Kill", "check_ft_strategy", "compare", "fit_ft",
           "fit_ft_torchrun", "world_of"]

_EXPORTS = {
    "FT_STRATEGIES": "manager", "FTUnavailable": "manager", "Kill": "launch",
    "check_ft_strategy": "manager", "compare": "replay", "fit_ft": "launch",
    "fit_ft_torchrun": "launch", "world_of": "replay",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
