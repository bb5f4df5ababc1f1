"""EXO Gym's path of the per-node collectives: ``from exogym.strategy.communicate import
all_reduce``: the functions of :mod:`exogym.strategy.per_node.collectives` (torch.distributed's
signatures; in a run, the simulated nodes meet and the run's communicator counts and times the
bytes).
"""

from exogym.strategy.per_node.collectives import ReduceOp, all_gather, all_reduce, broadcast

__all__ = ["ReduceOp", "all_gather", "all_reduce", "broadcast"]
