"""Across real processes: the plumbing a run needs when its nodes are spread over OS processes
(``--engine process``, torchrun), below the loop that uses it.

- :mod:`~exogym.run.dist.ranks`: a process's place (:class:`RankContext`: its rank, its nodes'
  global ids), torchrun's rendezvous (:func:`torchrun_env`, :func:`join_torchrun`), the process
  group made and closed (:func:`init_group`, :func:`close_group`), :func:`keep_freed_memory`;
- :mod:`~exogym.run.dist.communicator`: :class:`DistributedCommunicator`, the simulator's
  communicator over ``torch.distributed`` (the same bytes and log), this process's rows of the
  data (:func:`local_batch`) and the global model gathered over the ranks
  (:func:`gather_global_state`);
- :mod:`~exogym.run.dist.calibrate`: a real network measured between ranks, fitted into a
  network file (``exogym calibrate``).

Spawning the processes and running a fit in each is :mod:`exogym.run.launch` (above the
trainer). This package imports :mod:`exogym.sim` only.
"""

from exogym.run.dist.communicator import (
    DistributedCommunicator,
    WallSpans,
    gather_all_nodes,
    gather_global_state,
    local_batch,
)
from exogym.run.dist.ranks import (
    COLLECTIVE_TIMEOUT_S,
    RankContext,
    TorchrunEnv,
    close_group,
    init_group,
    join_torchrun,
    keep_freed_memory,
    local_node_ids,
    torchrun_env,
)

__all__ = [
    "COLLECTIVE_TIMEOUT_S", "DistributedCommunicator", "RankContext", "TorchrunEnv", "WallSpans",
    "close_group", "gather_all_nodes", "gather_global_state", "init_group", "join_torchrun",
    "keep_freed_memory", "local_batch", "local_node_ids", "torchrun_env",
]
