"""Real runs that survive real failures: exogym's strategies on torchft (``--ft``).

Each real process is one **torchft replica** (:class:`torchft.Manager`; a replica group of one
process) holding ``n_local`` simulated nodes, as a process of ``--engine process`` does. What
torchft gives (read in torchft 0.2.0's ``manager.py``, ``local_sgd.py`` and
``manager_integ_test.py``; quorum, healing and the process group are torchft's, not
re-implemented here):

- **quorum**: before a step that may communicate (:meth:`StackedStrategy.communicates` is not False)
  the replica asks the Lighthouse for a quorum (``start_quorum``, synchronous); a replica that
  died leaves the quorum once its heartbeats stop, and the others go on without it;
- **collectives**: :class:`FTCommunicator` runs the strategy's all-reduces through
  ``Manager.allreduce`` over the quorum's Gloo process group (which torchft reconfigures at
  every new quorum); an error (a peer died mid-collective) does not end the run, it marks the
  step as failed;
- **commit**: after the step, ``should_commit``; if any error happened, the step is
  **discarded**: the replica restores the state it had before the step (data position and
  random state included) and does the step again with the next quorum. So no synchronisation
  is applied twice or lost;
- **healing**: a replica behind the quorum (restarted, or left out of a quorum) receives the
  state of a live peer, served by torchft's HTTP checkpoint transport: the peer's state at the
  start of the step the quorum is for (:func:`replica_state`: nodes, the strategy's
  ``state_dict`` with its outer optimizer, global copy, residuals and counters, the data
  position, the step). Then, as a simulated node that recovers (:meth:`StackedStrategy.recover`),
  its nodes take the strategy's global model (DiLoCo's ``theta``, FedAvg's server model; DDP's
  identical replicas) and keep the donor's inner optimizer state (``recovery="copy"``); what
  the dead replica had computed since its last synchronisation is lost.

A step that certainly makes no collective (DiLoCo's inner steps) runs without a quorum, as
torchft's own DiLoCo does; a restarted replica therefore waits for the others' next
synchronisation to heal. Every replica records its quorums, heals and discarded steps
(:class:`ReplicaLog`); :mod:`exogym.run.ft.launch` merges them into the run's events.

Strategies: those whose collectives are all-reduces among all nodes and whose nodes, after a
synchronisation, hold one global model (:data:`FT_STRATEGIES`); the others are refused by name
with the reason (:func:`check_ft_strategy`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from exogym.run.dist.communicator import accumulator_dtype, dtype_groups
from exogym.run.output.checkpoint import to_host
from exogym.sim.codecs import Codec
from exogym.sim.comm import (
    Communicator,
    ReduceOp,
    all_gather_bytes,
    all_reduce_bytes,
    payload_bytes,
)
from exogym.sim.engine import NodeStack
from exogym.sim.sharding import NodeBatches
from exogym.strategy.base import StackedStrategy
from exogym.strategy.server import ServerStrategy

__all__ = [
    "FT_STRATEGIES", "FTCommunicator", "FTUnavailable", "KillPoint", "ReplicaLog",
    "check_ft_strategy", "checkpoint_transport", "load_replica_state", "replica_state",
    "require_torchft",
]

#: Strategies that run under ``--ft``: their collectives are all-reduces among all nodes, and
#: their nodes hold one global model after a synchronisation (DDP: identical replicas).
FT_STRATEGIES = ("ddp", "fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad",
                 "diloco", "muloco", "streaming_diloco")

_GOSSIP = ("point-to-point transfers between chosen nodes; torchft's Manager carries "
           "all-reduces among the quorum only")
_GATHER = ("an all-gather of compressed components; torchft's Manager carries all-reduces "
           "among the quorum only")
_MEAN = ("its nodes never hold one model (the global model is the nodes' mean), so a replica "
         "healed from one peer would not hold what the dead replica's nodes held")
_REFUSED = {
    "demo": _GATHER, "sparseloco": _GATHER, "noloco": _GOSSIP,
    "sparta": _MEAN, "sparta_diloco": _MEAN, "desloc": _MEAN,
    "diloco_eager": ("its outer update is applied one round late, overlapping the next round's "
                     "compute: a discarded synchronisation would leave half an update applied"),
}


class FTUnavailable(ImportError):
    """torchft is not installed, or has no wheel for this platform."""


def require_torchft() -> Any:
    """The ``torchft`` module, or :class:`FTUnavailable` saying how to get it."""
    try:
        import torchft
    except ImportError as err:
        raise FTUnavailable(
            "--ft runs on torchft, which is not installed: pip install 'exogym[ft]' (torchft "
            "publishes wheels for Linux x86-64 and Python 3.9-3.13 only; elsewhere build it "
            f"from https://github.com/pytorch/torchft) [{err}]") from None
    return torchft


def checkpoint_transport(timeout: timedelta) -> Any:
    """torchft's HTTP checkpoint transport, as its ``Manager`` builds it by default, without
    the access log line that :mod:`http.server` writes to stderr (into the run's output) for
    every heal it serves (``::ffff:127.0.0.1 - - [date] "GET /checkpoint/2/full HTTP/1.1" 200
    -``): the line goes to the ``torchft`` logger at DEBUG, which a replica sets to ERROR
    (:func:`~exogym.run.ft.replica.run_replica`); the server's error lines stay on stderr."""
    from torchft.checkpointing import HTTPTransport

    transport = HTTPTransport(timeout=timeout, num_chunks=0)
    server = getattr(transport, "_server", None)  # its handler: a class made inside __init__
    if server is None or not hasattr(server, "RequestHandlerClass"):
        return transport  # another torchft: its log line stays
    logger = logging.getLogger("torchft.checkpointing.http_transport")

    class QuietHandler(server.RequestHandlerClass):  # type: ignore[name-defined,misc]
        def log_request(self, code: Any = "-", size: Any = "-") -> None:
            logger.debug('%s "%s" %s %s', self.address_string(), self.requestline, code, size)

    server.RequestHandlerClass = QuietHandler  # read per request by the serving thread
    return transport


def check_ft_strategy(strategy: StackedStrategy) -> None:
    """Refuse, naming it and why, a strategy that cannot run as torchft replicas."""
    sid = getattr(strategy, "id", type(strategy).__name__)
    if sid in FT_STRATEGIES:
        return
    if isinstance(strategy, ServerStrategy):
        reason = ("it is asynchronous: its parameter server and per-node timelines run in one "
                  "process")
    else:
        reason = _REFUSED.get(sid, "it is not one of the strategies checked under --ft")
    raise ValueError(f"--ft does not take {sid}: {reason}; --ft takes "
                     f"{', '.join(FT_STRATEGIES)}")


@dataclass(frozen=True)
class KillPoint:
    """Where a chaos harness kills a replica with SIGKILL (:mod:`exogym.run.ft.launch`).

    Attributes:
        step: the training step at which it dies.
        at: ``"step"`` (before the step computes), ``"collective"`` (inside its first
            collective, before the data moves), ``"heal"`` (while it loads a peer's state: only
            a restarted replica heals), ``"serve"`` (while it serves its state to a healing
            peer) or ``"checkpoint"`` (half way through writing its checkpoint: the file
            written, not yet renamed into place).
    """

    step: int
    at: str = "step"

    POINTS = ("step", "collective", "heal", "serve", "checkpoint")

    def __post_init__(self) -> None:
        if self.at not in self.POINTS:
            raise ValueError(f"a kill point is one of {', '.join(self.POINTS)}, got {self.at!r}")
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise ValueError(f"a kill step must be an integer >= 0, got {self.step!r}")

    def due(self, step: int, at: str) -> bool:
        return self.step == step and self.at == at


def die() -> None:
    """SIGKILL this process (a real, unannounced death: no handler, no clean-up)."""
    os.kill(os.getpid(), signal.SIGKILL)


class ReplicaLog:
    """A replica's own record, appended and flushed line by line (a replica can die at any
    moment): ``rows`` (one per committed step: its nodes' mean loss and the quorum's size),
    ``evals`` (the global model's evaluations, when this replica makes them) and ``events``
    (quorum changes, heals, discarded steps), JSON lines in ``out_dir``."""

    def __init__(self, out_dir: Path, replica: int, t0: float, generation: int = 0) -> None:
        self.replica, self.t0, self.generation = replica, t0, generation
        self._rows = (out_dir / f"replica{replica}.rows.jsonl").open("a", encoding="utf-8")
        self._events = (out_dir / f"replica{replica}.events.jsonl").open("a", encoding="utf-8")
        self._dir = out_dir
        self._evals: Any = None  # opened at the first evaluation

    def now(self) -> float:
        return time.time() - self.t0

    def row(self, step: int, loss: float, quorum: int) -> None:
        self._write(self._rows, {"step": step, "loss": loss, "quorum": quorum,
                                 "replica": self.replica, "time_s": self.now()})

    def evaluation(self, step: int, metrics: dict[str, float]) -> None:
        """The global model's evaluation after ``step`` (``eval_*`` metrics)."""
        if self._evals is None:
            path = self._dir / f"replica{self.replica}.evals.jsonl"
            self._evals = path.open("a", encoding="utf-8")
        self._write(self._evals, {"step": step, "time_s": self.now(), "replica": self.replica,
                                  **metrics})

    def event(self, kind: str, step: int, **extra: Any) -> None:
        self._write(self._events, {"step": step, "time_s": self.now(), "event": kind,
                                   "replica": self.replica, "generation": self.generation,
                                   **extra})

    @staticmethod
    def _write(f: Any, record: dict[str, Any]) -> None:
        f.write(json.dumps(record) + "\n")
        f.flush()

    def close(self) -> None:
        self._rows.close()
        self._events.close()
        if self._evals is not None:
            self._evals.close()


class FTCommunicator(Communicator):
    """The strategy's collectives over a torchft quorum (``Manager.allreduce``).

    Args:
        manager: this replica's :class:`torchft.Manager`.
        num_nodes: ``N``, nodes of the whole run (every replica holds ``n_local`` of them).
        node_ids: this replica's nodes, ``replica * n_local + i``.
        before_collective: called before each collective (the chaos harness's hook).

    An all-reduce sums this replica's rows (fp32 accumulation for 16-bit floats, as in one
    process), then sums across the quorum's replicas; a mean divides by the nodes of the quorum
    (``participants * n_local``): a dead replica's nodes are not in the mean, as torchft's
    average leaves out replicas outside the quorum. Bytes: a ring over the quorum's nodes,
    credited to this replica's nodes (another replica's counters are its own). A broadcast
    sends the first node of the quorum's first replica (DDP's buffers: node 0's in a run with
    no failure). All-gathers are refused (:data:`FT_STRATEGIES` make none).
    """

    def __init__(self, manager: Any, num_nodes: int, node_ids: Sequence[int],
                 before_collective: Callable[[], None] | None = None) -> None:
        super().__init__(num_nodes, node_ids)
        self.manager = manager
        self.before_collective = before_collective

    def quorum_nodes(self) -> int:
        """Nodes in the current quorum: its replicas times this replica's ``n_local``."""
        return max(self.manager.num_participants(), 1) * self.n_local

    def _account_reduce(self, tensors: list[Tensor], tag: str, overlap: bool,
                        codec: Codec | None) -> None:
        payload, m = payload_bytes(tensors, codec), self.quorum_nodes()
        if codec is not None and codec.sparse:
            op, s = "all_gather", all_gather_bytes(payload, m)
        else:
            op, s = "all_reduce", all_reduce_bytes(payload, m)
        mine = [0.0] * self.num_nodes
        for i in self.node_ids:
            mine[i] = s
        self._account(op, tensors, tag, overlap, sent=mine, received=list(mine), codec=codec)

    def _sum_across(self, flat: Tensor) -> Tensor:
        from torch.distributed import ReduceOp as DistOp

        if self.before_collective is not None:
            self.before_collective()
        start = time.perf_counter()
        self.manager.allreduce(flat, reduce_op=DistOp.SUM).wait()
        self.transport_s += time.perf_counter() - start
        return flat

    def _all_reduce(self, tensors: list[Tensor], op: ReduceOp) -> list[Tensor]:
        accs = [accumulator_dtype(t.dtype) for t in tensors]
        sums = [t.sum(0, dtype=acc) for t, acc in zip(tensors, accs, strict=True)]
        for idx in dtype_groups(accs).values():
            flat = self._sum_across(torch.cat([sums[j].reshape(-1) for j in idx]))
            for j, piece in zip(idx, flat.split([sums[j].numel() for j in idx]), strict=True):
                sums[j] = piece.view(sums[j].shape)
        m = self.quorum_nodes()
        out = []
        for t, s in zip(tensors, sums, strict=True):
            if op == "mean":
                s = s / m if s.is_floating_point() else torch.div(s, m, rounding_mode="trunc")
            out.append(s.to(t.dtype))
        return out

    def _all_gather(self, tensors: list[Tensor]) -> list[Tensor]:
        raise RuntimeError("an all-gather under --ft: torchft's Manager carries all-reduces only "
                           f"(--ft takes {', '.join(FT_STRATEGIES)})")

    def _broadcast(self, tensors: list[Tensor], src: int) -> list[Tensor]:
        first = self.manager.participating_rank() == 0
        out: list[Tensor | None] = [None] * len(tensors)
        for idx in dtype_groups([t.dtype for t in tensors]).values():
            flat = torch.cat([tensors[j][0].reshape(-1) for j in idx])
            if not first:
                flat = torch.zeros_like(flat)
            flat = self._sum_across(flat)
            for j, piece in zip(idx, flat.split([tensors[j][0].numel() for j in idx]),
                                strict=True):
                out[j] = piece.view(tensors[j].shape[1:]).clone()
        return [t for t in out if t is not None]


def replica_state(strategy: StackedStrategy, nodes: NodeStack, batches: NodeBatches,
                  step: int, syncs: int, replica: int) -> dict[str, Any]:
    """A host copy of everything a replica is between two steps: what a healing peer receives,
    what a discarded step restores, what a checkpoint holds. ``syncs``: the synchronisations
    committed so far (counted, to check that none is applied twice or lost)."""
    return to_host({
        "step": step, "syncs": syncs, "replica": replica,
        "params": dict(nodes.params), "buffers": dict(nodes.buffers),
        "strategy": strategy.state_dict(), "data": batches.state_dict(),
        "rng": torch.get_rng_state(),
    })


@torch.no_grad()
def load_replica_state(state: dict[str, Any], strategy: StackedStrategy, nodes: NodeStack,
                       batches: NodeBatches, *, own: bool) -> None:
    """Restore :func:`replica_state`. ``own``: this replica's own state (a discarded step, its
    own checkpoint): restored exactly. Otherwise a peer's (a heal): its nodes then take the
    strategy's global model, as a simulated node that recovers from a live peer does."""
    for name, t in nodes.params.items():
        t.copy_(state["params"][name])
    for name, t in nodes.buffers.items():
        t.copy_(state["buffers"][name])
    strategy.load_state_dict(state["strategy"])
    batches.load_state_dict(state["data"])
    torch.set_rng_state(state["rng"])
    if own:
        return
    model = strategy.global_state()
    for name, t in nodes.params.items():
        t.copy_(model[name].unsqueeze(0).expand_as(t))
    for name, t in nodes.float_buffers.items():
        t.copy_(model[name].unsqueeze(0).expand_as(t))


def state_bytes(state: Any) -> int:
    """Bytes of the tensors in a (nested) state: what a heal moves."""
    if isinstance(state, Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0
