"""A process's place in a run over real processes: its rank, its nodes, torchrun's rendezvous,
and the ``torch.distributed`` process group (created with a collective timeout, closed cleanly).

Each OS process (rank ``r`` of ``R``) holds ``n_local`` node-stacked nodes, the same number in
every process; its global node ids are ``r * n_local + i`` for ``i < n_local``, so
``N = R * n_local`` (2 processes x 4 nodes = an 8-node run).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = [
    "COLLECTIVE_TIMEOUT_S", "RankContext", "TorchrunEnv", "close_group", "init_group",
    "join_torchrun", "keep_freed_memory", "local_node_ids", "torchrun_env",
]

#: Collective timeout of a process group exogym initialises (a rank waiting on a dead peer fails
#: after this instead of hanging; torchrun's agent usually ends the job sooner).
COLLECTIVE_TIMEOUT_S = 300.0


def local_node_ids(rank: int, nodes_per_process: int) -> list[int]:
    """The global ids of the nodes of process ``rank``: ``rank * n_local + i``."""
    return list(range(rank * nodes_per_process, (rank + 1) * nodes_per_process))


@dataclass(frozen=True)
class RankContext:
    """What a process knows about its place in a multi-process run.

    Attributes:
        rank: this process's rank; world_size: the number of processes.
        nodes_per_process: ``n_local``, simulated nodes stacked in each process.
        device: where this process computes (``cuda:LOCAL_RANK`` with nccl, else cpu).
    """

    rank: int
    world_size: int
    nodes_per_process: int
    device: str

    @property
    def node_ids(self) -> list[int]:
        return local_node_ids(self.rank, self.nodes_per_process)

    @property
    def num_nodes(self) -> int:
        return self.world_size * self.nodes_per_process


@dataclass(frozen=True)
class TorchrunEnv:
    """The rendezvous ``torchrun`` (``torch.distributed.run``) puts in each worker's environment.

    Attributes:
        rank: ``RANK``, this process among all; world_size: ``WORLD_SIZE``.
        local_rank: ``LOCAL_RANK``, this process among those on its machine (its GPU index).
        master_addr: ``MASTER_ADDR``, the host where rank 0 listens.
        master_port: ``MASTER_PORT``, its port.
    """

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


_TORCHRUN_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def torchrun_env(environ: dict[str, str] | None = None) -> TorchrunEnv | None:
    """The rendezvous in the environment, or None when this process was not launched by torchrun
    (none of ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` set).

    Raises:
        ValueError: some but not all of them are set, or one is not a valid number.
    """
    env = os.environ if environ is None else environ
    present = [k for k in _TORCHRUN_KEYS if k in env]
    if not present:
        return None
    missing = [k for k in _TORCHRUN_KEYS if k not in env]
    if missing:
        raise ValueError(
            f"the environment has {', '.join(present)} but not {', '.join(missing)}: launch with "
            "torchrun (which sets all of RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) "
            "or unset them to simulate in one process"
        )
    values = {}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        try:
            values[key] = int(env[key])
        except ValueError:
            raise ValueError(f"{key}={env[key]!r} in the environment is not an integer") from None
    if not 0 <= values["RANK"] < values["WORLD_SIZE"]:
        raise ValueError(f"RANK={values['RANK']} must be in [0, WORLD_SIZE={values['WORLD_SIZE']})")
    return TorchrunEnv(values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"],
                       env["MASTER_ADDR"], values["MASTER_PORT"])


def init_group(backend: str, init_method: str, rank: int, world_size: int,
               timeout_s: float = COLLECTIVE_TIMEOUT_S) -> None:
    """``torch.distributed.init_process_group`` with a collective timeout of ``timeout_s``
    seconds (default :data:`COLLECTIVE_TIMEOUT_S`), after importing ``torch._dynamo``.

    Why the import first: the first ``torch.optim`` optimizer imports ``torch._dynamo``, and
    that import, made while a default group exists, keeps the group alive after
    ``destroy_process_group`` (torch 2.13: the group outlived a fit() that built an AdamW,
    and not one that had imported ``torch._dynamo`` before the group). A group that lives on
    is destroyed during interpreter shutdown, where its gloo threads occasionally abort the
    process ("terminate called without an active exception", SIGABRT after a clean run, about
    one torchrun test in 15 under load). Imported before the group exists, nothing holds it
    and ``destroy_process_group`` frees it while Python is alive."""
    import torch._dynamo  # noqa: F401  (see above)

    dist.init_process_group(backend, init_method=init_method, rank=rank,
                            world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))


def close_group(*, clean: bool) -> None:
    """Destroy this process's default group. ``clean`` (the rank's work ended without an
    error): meet the other ranks at a barrier first, so that no rank closes its connections
    while a peer is still reading its last message (gloo aborts that peer: "terminate called
    without an active exception"). After an error there is no barrier (the peers may never
    reach it)."""
    if clean:
        dist.barrier()
    dist.destroy_process_group()


def keep_freed_memory() -> bool:
    """Let this worker process keep the memory a training step frees for the next step (glibc's
    ``mallopt``: no trimming, no mmap below 32 MB); whether it could. By default glibc gives
    large freed blocks back to the operating system and the next step faults them in again:
    3-4 ms of kernel time per MNIST-CNN node-step in a process per node (measured: process
    engine 11.3 ms a node-step against 9.4 ms in one process, 9.3 ms with this), time the
    simulated clock would price as the node's compute. Called in exogym's worker processes and
    in a torchrun rank when exogym joins its group (a process that exists to train), not in a
    simulated run in the user's own process."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if sys.platform != "linux" or name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_trim_threshold, 2**31 - 1)
                    and libc.mallopt(m_mmap_threshold, 32 * 2**20))
    except (OSError, AttributeError):
        return False


def join_torchrun(env: TorchrunEnv, device: torch.device) -> torch.device:
    """Join torchrun's process group (``env://`` rendezvous) and return this rank's device.

    A CUDA ``device`` without an index becomes ``cuda:LOCAL_RANK`` (one GPU per process, the
    torchrun convention) and the backend is nccl; otherwise gloo. The group's collective timeout
    is :data:`COLLECTIVE_TIMEOUT_S`.
    """
    keep_freed_memory()  # a torchrun rank is a worker of its own
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        backend = "gloo"
    init_group(backend, "env://", env.rank, env.world_size)
    return device
