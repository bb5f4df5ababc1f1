"""Where a run's nodes live: the holders, one interface for every way of keeping them.

- :mod:`~exogym.run.nodes.holders`: the interface the loop asks
  (:class:`~exogym.run.nodes.holders.Holder`, a protocol) and the choice among the holders
  (:func:`~exogym.run.nodes.holders.hold`, by the run's settings);
- :mod:`~exogym.run.nodes.memory`: :class:`~exogym.run.nodes.memory.InMemory`, every node (or a
  process's share) as node-stacked tensors;
- :mod:`~exogym.run.nodes.paged` with :mod:`~exogym.run.nodes.paging`: virtual nodes, groups of
  ``K`` paged in and out, the in-memory numbers bit for bit;
- :mod:`~exogym.run.nodes.seats` with :mod:`~exogym.run.nodes.population` and
  :mod:`~exogym.run.nodes.client_store`: a population of ``N`` clients in ``K`` seats, a round
  (or an asynchronous server's clients in flight) at the cost of its participants.

Imports: :mod:`exogym.run.dist` (a process's share of the nodes), :mod:`exogym.run.output`
(checkpoint parts), :mod:`exogym.run.settings`, the strategies and the simulator; never the
loop (a holder tells the clock of a step through :class:`~exogym.run.nodes.holders.StepClock`).
"""
