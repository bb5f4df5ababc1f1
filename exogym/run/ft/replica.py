"""One torchft replica's training loop (a process of a ``--ft`` run; :mod:`exogym.run.ft.manager`).

:func:`run_replica` builds the replica's nodes, data order and strategy exactly as a process of
``--engine process`` does (the run's :class:`NodeBatches` over all ``N`` nodes with the run's
seed, only this replica's rows fetched), joins the quorum through a :class:`torchft.Manager`
and trains:

- a step that certainly makes no collective runs on its own;
- any other step is a transaction: the replica keeps its state (:func:`replica_state`, also
  what it serves to a healing peer), asks for a quorum (which heals it if it is behind),
  computes, and commits only if torchft says every collective of the step succeeded; otherwise
  it restores the kept state and does the step again with the next quorum.

The quorum is asked for on a thread of its own while the step's forward and backward run (the
RPCs to torchft's manager and Lighthouse hidden behind them, as torchft's DDP hides them with its
asynchronous quorum); the step's collectives wait for it. A heal still lands at a step boundary:
the peer's state arrives on the quorum's thread, is loaded on the training thread once the
quorum is in, and the step's forward and backward are computed again from it (a heal is rare:
it follows a failure). torchft's own asynchronous mode would instead let a healing replica's
first step contribute zeros, its update applied after the heal, which exogym's strategies (their
update made inside ``step``) cannot take. Likewise the commit is asked for on that thread while
the training thread copies the state the next transaction starts from (kept only if torchft
commits).

A replica started after a death (``generation > 0``) asks for a quorum before its first step:
it is behind (the others committed their first quorum when the run started), so torchft heals
it from a live peer, and it trains on from the peer's step in that quorum.
"""

from __future__ import annotations

import copy
import logging
import os
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from exogym.run.dist.communicator import local_batch
from exogym.run.dist.ranks import keep_freed_memory, local_node_ids
from exogym.run.ft.manager import (
    FTCommunicator,
    KillPoint,
    ReplicaLog,
    checkpoint_transport,
    die,
    load_replica_state,
    replica_state,
    require_torchft,
    state_bytes,
)
from exogym.run.loop.evaluation import EvalTimes, Evaluation
from exogym.sim.engine import EngineName, NodeStack
from exogym.sim.sharding import DatasetFactory, NodeBatches
from exogym.strategy.base import StackedStrategy

__all__ = ["ReplicaSpec", "checkpoint_path", "newest_checkpoint", "run_replica"]


@dataclass(frozen=True)
class ReplicaSpec:
    """What one replica process is told (picklable; :func:`exogym.run.ft.launch.fit_ft`).

    Attributes:
        replica: its index; replicas: how many the run has; nodes_per_replica: ``n_local``.
        generation: 0 for the run's first processes, ``g`` for the ``g``-th restart.
        kills: where this process SIGKILLs itself (the chaos harness's plan for this life).
        lighthouse: the Lighthouse's address (``http://HOST:PORT``); hostname: the address
            this replica's manager advertises to its peers (they fetch its state from it).
        timeout_s: torchft's collective and heal timeout; quorum_timeout_s: how long a
            replica waits for a quorum.
        checkpoint_every: write ``ckpt/replica{r}.pt`` after every this many steps (None: no
            checkpoints); resume: start from the newest checkpoint in ``out_dir/ckpt``.
        min_replicas: torchft's ``min_replica_size``: a step commits only with at least this
            many replicas in its quorum (fewer: it is discarded and tried again).
        commit_every: steps that communicate per transaction (one quorum, one commit): ``K``
            divides the quorum's and commit's cost by ``K``; a failure redoes up to ``K`` of
            them.
        eval_interval: evaluate the global model after every this many committed steps (and
            the last), on the replica ranked first in the quorum (None: not during training);
            eval_samples: the fixed subset evaluated (None: the whole set).
    """

    replica: int
    replicas: int
    nodes_per_replica: int
    max_steps: int
    batch_size: int
    seed: int
    out_dir: str
    lighthouse: str
    t0: float
    generation: int = 0
    kills: tuple[KillPoint, ...] = ()
    hostname: str = "127.0.0.1"
    timeout_s: float = 10.0
    quorum_timeout_s: float = 60.0
    checkpoint_every: int | None = None
    resume: bool = False
    min_replicas: int = 1
    commit_every: int = 1
    engine: EngineName = "loop"
    threads: int = 1
    eval_interval: int | None = None
    eval_samples: int | None = 2000

    @property
    def num_nodes(self) -> int:
        return self.replicas * self.nodes_per_replica


def checkpoint_path(out_dir: str | Path, replica: int) -> Path:
    return Path(out_dir) / "ckpt" / f"replica{replica}.pt"


def newest_checkpoint(out_dir: str | Path, replica: int) -> tuple[dict[str, Any], bool] | None:
    """The state to resume ``replica`` from: the newest step among the replicas' checkpoints;
    its own file when that is at the newest step (exact), else a peer's (healed from it).
    None when there is none."""
    found = []
    for path in sorted((Path(out_dir) / "ckpt").glob("replica*.pt")):
        state = torch.load(path, weights_only=False)
        found.append((int(state["step"]), int(state["replica"]) == replica, state))
    if not found:
        return None
    _, own, state = max(found, key=lambda f: (f[0], f[1]))
    return state, own


class _Replica:
    """The loop's state: the step, committed synchronisations, the kept state."""

    def __init__(self, spec: ReplicaSpec, model: nn.Module, data: Dataset | DatasetFactory,
                 strategy: StackedStrategy, eval_data: Dataset | None = None) -> None:
        self.spec = spec
        self.log = ReplicaLog(Path(spec.out_dir), spec.replica, spec.t0, spec.generation)
        self.log.event("started", 0)
        self.batches = NodeBatches(data, spec.num_nodes, spec.batch_size, seed=spec.seed)
        self.nodes = NodeStack(model, spec.nodes_per_replica, device="cpu", engine=spec.engine)
        self.node_ids = local_node_ids(spec.replica, spec.nodes_per_replica)
        self.manager = self._manager()
        self.comm = FTCommunicator(self.manager, spec.num_nodes, self.node_ids,
                                   before_collective=lambda: self._kill("collective"))
        self.strategy = copy.deepcopy(strategy)
        self.strategy.setup(self.nodes, self.comm, spec.max_steps, seed=spec.seed)
        self.step = self.syncs = self.trained = 0
        self.kept: dict[str, Any] | None = None
        # the state after the last committed transaction, taken while its commit was awaited
        self.kept_ahead: dict[str, Any] | None = None
        self.heal_state: dict[str, Any] | None = None  # a peer's, received, not yet loaded
        # asks torchft for a quorum while this thread computes (one at a time)
        self.asking = ThreadPoolExecutor(1, thread_name_prefix="exogym-quorum")
        self.heals = 0
        self.quorum_id: Any = None
        # wall seconds in each part of a step: what --ft costs (the run's summary reports them)
        self.seconds = {"compute": 0.0, "keep": 0.0, "quorum": 0.0, "commit": 0.0,
                        "eval": 0.0, "eval_last": 0.0}
        evaluates = eval_data is not None and spec.eval_interval is not None
        self.evaluation = Evaluation(model, eval_data, spec.eval_samples, 1000,
                                     torch.device("cpu"), None) if evaluates else None
        self.eval_times = EvalTimes(spec.eval_interval or 1, spec.max_steps, evaluates)

    def _manager(self) -> Any:
        require_torchft()
        from torch.distributed import TCPStore
        from torchft import Manager, ProcessGroupGloo

        spec = self.spec
        # the replica group's store (a group of one process: this one hosts it)
        self.store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        timeout = timedelta(seconds=spec.timeout_s)
        return Manager(
            pg=ProcessGroupGloo(timeout=timeout), load_state_dict=self._load,
            state_dict=self._serve, min_replica_size=spec.min_replicas, use_async_quorum=False,
            timeout=timeout, quorum_timeout=timedelta(seconds=spec.quorum_timeout_s),
            connect_timeout=timeout, rank=0, world_size=1, store_addr="127.0.0.1",
            store_port=self.store.port, lighthouse_addr=spec.lighthouse,
            replica_id=f"replica{spec.replica}", hostname=spec.hostname,
            checkpoint_transport=checkpoint_transport(timeout),
            init_sync=False)  # every replica builds the same seeded model: no heal at step 0

    # -- torchft's callbacks -------------------------------------------------------------------
    def _serve(self) -> dict[str, Any]:
        """The state a healing peer receives: this replica's at the start of the step its quorum
        is for."""
        self._kill("serve")
        assert self.kept is not None, "a state is served only during a quorum"
        return self.kept

    def _load(self, state: dict[str, Any]) -> None:
        """A peer's state received in a quorum (on the quorum's thread): loaded by
        :meth:`_finish_quorum`, on the training thread, between two computations."""
        self._kill("heal")
        self.heal_state = state

    # -- the loop ------------------------------------------------------------------------------
    def _kill(self, at: str) -> None:
        if any(k.due(self.step, at) for k in self.spec.kills):
            die()

    def _keep(self) -> None:
        """Keep the state at the start of this step: the one taken while the last commit was
        awaited when nothing has changed since, else a copy now."""
        ahead, self.kept_ahead = self.kept_ahead, None
        if ahead is not None and ahead["step"] == self.step:
            self.kept = ahead
            return
        self.kept = self._state(self.syncs)

    def _state(self, syncs: int) -> dict[str, Any]:
        start = time.perf_counter()
        try:
            return replica_state(self.strategy, self.nodes, self.batches, self.step, syncs,
                                 self.spec.replica)
        finally:
            self.seconds["keep"] += time.perf_counter() - start

    def _quorum(self) -> None:
        """Keep the state, ask for a quorum and wait for it (a heal loads a peer's state)."""
        self._finish_quorum(self._ask_quorum())

    def _ask_quorum(self) -> tuple[Future[None], float]:
        """Keep the state and ask for a quorum on the quorum thread; with the time asked."""
        self._keep()
        return self.asking.submit(self.manager.start_quorum), time.perf_counter()

    def _finish_quorum(self, asking: tuple[Future[None], float]) -> bool:
        """Wait for the quorum asked for; load the peer's state it brought, if any (then keep
        that for a discarded step), and note changes. Whether it healed this replica."""
        future, asked = asking
        waited = time.perf_counter()
        future.result()  # torchft's own errors (a quorum timeout) end the run, as before
        self.seconds["quorum"] += time.perf_counter() - waited
        healed = self.heal_state is not None
        if self.heal_state is not None:
            state, self.heal_state = self.heal_state, None
            start = time.perf_counter()
            load_replica_state(state, self.strategy, self.nodes, self.batches, own=False)
            self.step, self.syncs = int(state["step"]), int(state["syncs"])
            loaded = time.perf_counter()
            self._keep()
            self.log.event("recovery", self.step, duration_s=loaded - asked,
                           donor_replica=int(state["replica"]), bytes=state_bytes(state),
                           load_s=loaded - start)
            self.heals += 1
        quorum = self.manager._quorum_id  # torchft keeps no public accessor for it
        if quorum != self.quorum_id:
            self.quorum_id = quorum
            self.log.event("quorum", self.step, replicas=self.manager.num_participants(),
                           quorum_id=quorum)
        return healed

    def _overlapped_quorum(self) -> Tensor | None:
        """Ask for the quorum of the step about to be taken and compute the step's forward and
        backward while torchft forms it (its collectives wait for it): torchft's RPCs hidden
        behind the computation, as its own DDP's asynchronous quorum hides them. The losses; or
        None, the gradient dropped, when the quorum healed this replica (the step is computed
        again from the peer's state: a heal still lands at a step boundary) or failed."""
        asking = self._ask_quorum()
        try:
            losses = self._forward_backward()
        finally:
            healed = self._finish_quorum(asking)
        if healed or self.manager.errored() is not None:
            self.nodes.zero_grad()
            return None
        return losses

    def _forward_backward(self) -> Tensor:
        start = time.perf_counter()
        try:
            batch = self.nodes.to_batch_device(local_batch(self.batches, self.node_ids))
            return self.nodes.forward_backward(batch)
        finally:
            self.seconds["compute"] += time.perf_counter() - start

    def _compute(self, losses: Tensor | None = None) -> float:
        """A training step (``losses``: its forward and backward, already computed)."""
        if losses is None:
            losses = self._forward_backward()
        start = time.perf_counter()
        try:
            self.comm.attendance.step = self.step
            self.strategy.step(self.step)
            self.nodes.zero_grad()
            return float(losses.mean())
        finally:
            self.seconds["compute"] += time.perf_counter() - start

    def _joined(self) -> bool:
        """Commit the first quorum after an all-reduce of one number (a barrier: a peer that
        heals in it has fetched its state before any replica commits, which ends serving)."""
        from torch.distributed import ReduceOp

        self.manager.allreduce(torch.zeros(1), reduce_op=ReduceOp.SUM).wait()
        return bool(self.manager.should_commit())

    def _transaction(self, asked: bool) -> None:
        """Steps from this one (which may communicate) up to ``commit_every`` of those that
        may, under one quorum and one commit: committed together, or restored together."""
        ahead = None if asked else self._overlapped_quorum()
        start_step, made = self.step, len(self.comm.log)
        counted = (list(self.comm.bytes_sent), list(self.comm.bytes_received))
        rows: list[tuple[int, float]] = []
        syncing = 0
        while self.step < self.spec.max_steps and syncing < self.spec.commit_every:
            may = not rows or self.strategy.communicates(self.step) is not False
            if rows:
                self._kill("step")
            if self.manager.errored() is not None:
                break  # a collective failed: the rest would be computed in vain
            try:
                loss, ahead = self._compute(ahead), None
            except Exception:
                if self.manager.errored() is None:
                    raise  # not a failed collective: a bug, not a failure to survive
                break
            rows.append((self.step, loss))
            self.step += 1
            syncing += may
        committed = self._commit(self.syncs + self._syncs_in(made))
        if committed:
            self.syncs += self._syncs_in(made)
            for step, loss in rows:
                self._row(step, loss)
            self._maybe_evaluate(start_step)
            self._maybe_checkpoint(start_step)
            return
        assert self.kept is not None
        self.log.event("discarded", start_step, steps=len(rows),
                       error=str(self.manager.errored() or ""))
        load_replica_state(self.kept, self.strategy, self.nodes, self.batches, own=True)
        self.nodes.zero_grad()  # a step stopped by an error inside it left its gradient
        self.step = start_step
        del self.comm.log[made:]
        self.comm.bytes_sent, self.comm.bytes_received = counted

    def _commit(self, syncs: int) -> bool:
        """Ask torchft whether to commit, on the quorum thread; meanwhile, when the next step
        starts a transaction, keep the state it starts from if this one commits (``syncs``: the
        count then), so that copying it costs no time of its own (before a local step, such as
        DiLoCo's inner ones, the state moves on and the copy would be wasted). Whether to
        commit."""
        committing = self.asking.submit(self.manager.should_commit)
        try:
            starts = (self.step < self.spec.max_steps
                      and self.strategy.communicates(self.step) is not False)
            ahead = self._state(syncs) if starts else None
        finally:
            waited = time.perf_counter()
            committed = bool(committing.result())
            self.seconds["commit"] += time.perf_counter() - waited
        self.kept_ahead = ahead if committed else None
        return committed

    def _syncs_in(self, made: int) -> int:
        """Synchronisations among the records since ``made``: steps that made a collective."""
        return len({r.step for r in self.comm.log[made:]})

    def _local_step(self) -> None:
        self.kept_ahead = None  # the state moves on
        made = len(self.comm.log)
        loss = self._compute()
        if len(self.comm.log) != made:
            raise RuntimeError(f"{self.strategy.id} said step {self.step} makes no collective "
                               "(communicates() is False) but made one")
        start_step = self.step
        self._row(self.step, loss)
        self.step += 1
        self._maybe_evaluate(start_step)
        self._maybe_checkpoint(start_step)

    def _row(self, step: int, loss: float) -> None:
        self.log.row(step, loss, self.manager.num_participants())
        self.trained += 1

    def _maybe_evaluate(self, since: int) -> None:
        """The global model evaluated if the steps committed since ``since`` passed an
        evaluation (every ``eval_interval`` steps and the last), by the replica ranked first in
        the quorum (one evaluation per step; a replica healing is not in it), recorded against
        the last step computed."""
        if not any(self.eval_times.due(done) for done in range(since + 1, self.step + 1)):
            return
        if self.evaluation is None or self.manager.participating_rank() != 0:
            return
        start = time.perf_counter()
        assert self.evaluation.during is not None
        metrics = self.evaluation(self.strategy.global_state(), self.evaluation.during)
        # the last step's evaluation follows its row: outside the training time's span
        last = self.step >= self.spec.max_steps
        self.seconds["eval_last" if last else "eval"] += time.perf_counter() - start
        self.log.evaluation(self.step - 1, metrics)

    def _maybe_checkpoint(self, since: int) -> None:
        """A checkpoint if the steps committed since ``since`` passed a multiple of
        ``checkpoint_every`` (written at the commit: a state never committed is never saved)."""
        every = self.spec.checkpoint_every
        if every and self.step // every > since // every:
            self._checkpoint()

    def _checkpoint(self) -> None:
        path = checkpoint_path(self.spec.out_dir, self.spec.replica)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(replica_state(self.strategy, self.nodes, self.batches, self.step,
                                 self.syncs, self.spec.replica), tmp)
        self._kill("checkpoint")  # written, not yet in place: the previous one stays whole
        os.replace(tmp, path)

    def run(self) -> dict[str, Any] | None:
        """Train to the last step; the result, or None for a restarted replica that found no
        live peer to heal from (the others had finished, or were all dead)."""
        spec = self.spec
        if spec.resume and (found := newest_checkpoint(spec.out_dir, spec.replica)):
            state, own = found
            load_replica_state(state, self.strategy, self.nodes, self.batches, own=own)
            self.step, self.syncs = int(state["step"]), int(state["syncs"])
            self.log.event("resumed", self.step, own=own, donor_replica=int(state["replica"]))
        self._quorum()
        if spec.generation == 0 and self.heals == 0:  # the run's first quorum, committed by
            while not self._joined():                 # every first process
                self._quorum()
                if self.heals:
                    break
        elif spec.generation > 0:
            while self.heals == 0 and self.manager.errored() is not None:
                self.manager.should_commit()  # a failed heal (its donor died serving): again
                self._quorum()
            if self.heals == 0:  # every first process committed a quorum: none is ahead of it
                self.log.event("no_peer", self.step)
                return None
        # healed (restarted, or started late by hand): the quorum is for this replica's next
        # step, which the others are taking
        pending = self.heals > 0
        self.log.event("training", self.step)
        while self.step < spec.max_steps:
            self._kill("step")
            if pending or self.strategy.communicates(self.step) is not False:
                self._transaction(asked=pending)
                pending = False
            else:
                self._local_step()
        return {"replica": spec.replica, "generation": spec.generation, "step": self.step,
                "syncs": self.syncs, "trained": self.trained, "seconds": dict(self.seconds),
                "bytes_sent": [float(b) for b in self.comm.bytes_sent],
                "bytes_received": [float(b) for b in self.comm.bytes_received],
                "global_state": {k: v.detach().cpu().clone()
                                 for k, v in self.strategy.global_state().items()}}


def run_replica(spec: ReplicaSpec, model: nn.Module, data: Dataset | DatasetFactory,
                strategy: StackedStrategy, eval_data: Dataset | None = None) -> None:
    """A replica process's body: train, then write ``replica{r}.result.pt`` (renamed into
    place: a death while writing leaves none) and leave the quorum."""
    keep_freed_memory()
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's Rust side logs every quorum at info
    logging.getLogger("torchft").setLevel(logging.ERROR)  # a warning per quorum (NCCL's recorder)
    # torchft's checkpoint transport reads a state from a read-only buffer it does not write
    warnings.filterwarnings("ignore", message="The given buffer is not writable")
    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    replica = _Replica(spec, model, data, strategy, eval_data)
    result = replica.run()
    if result is not None:
        out = Path(spec.out_dir)
        tmp = out / f".replica{spec.replica}.result.tmp"
        torch.save(result, tmp)
        os.replace(tmp, out / f"replica{spec.replica}.result.pt")
    replica.log.close()
    replica.asking.shutdown()
    replica.manager.shutdown(wait=False)
