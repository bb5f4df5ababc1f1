"""The loop of one run: its state between two steps, who computes next, what a step costs.

- :mod:`~exogym.run.loop.run`: :class:`~exogym.run.loop.run.Run`, the run's parts and state
  between two steps (``train_step``, ``log``, ``finish``, ``state_dict``: the checkpoint);
- :mod:`~exogym.run.loop.drive`: the loop over it (train, log, checkpoint, stop cleanly on a
  signal: :class:`~exogym.run.loop.drive.RunInterrupted`);
- :mod:`~exogym.run.loop.schedule`: the schedulers' protocols, one per execution mode, and
  :class:`~exogym.run.loop.schedule.Lockstep`; :mod:`~exogym.run.loop.rounds` (a population's
  rounds), :mod:`~exogym.run.loop.timelines` with :mod:`~exogym.run.loop.events` (asynchronous
  strategies: per-node timelines and the parameter server); :mod:`~exogym.run.loop.modes`
  chooses the mode and builds its scheduler over the run's parts;
- :mod:`~exogym.run.loop.losses`: the step every scheduler computes, and the training loss;
  :mod:`~exogym.run.loop.world_step`: the world's say before a lockstep step (who computes,
  who recovers first, who is heard);
- :mod:`~exogym.run.loop.clocking`: the run's side of the simulated clock (what it is given and
  when); :mod:`~exogym.run.loop.evaluation`: the global model evaluated;
  :mod:`~exogym.run.loop.config`: ``config.json``; :mod:`~exogym.run.loop.rng`: the random
  generators' state.

Imports: :mod:`exogym.run.nodes`, :mod:`exogym.run.output`, :mod:`exogym.run.dist`,
:mod:`exogym.run.settings` and :mod:`exogym.run.options` below it in the run, the strategies and
the simulator. A scheduler never holds the run: it is built with the parts it drives.
"""
