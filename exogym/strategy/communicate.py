"""EXO Gym's path of the per-node collectives: ``from exogym.strategy.communicate import
all_reduce``.

The functions are :mod:`exogym.compat.exo_gym.communicate`'s (torch.distributed's signatures;
in a run, the simulated nodes meet and the run's communicator counts and times the bytes).
"""

from exogym.compat.exo_gym.communicate import ReduceOp, all_gather, all_reduce, broadcast

__all__ = ["ReduceOp", "all_gather", "all_reduce", "broadcast"]
