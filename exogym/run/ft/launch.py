"""A ``--ft`` run on this machine: a Lighthouse, one process per torchft replica, restarts.

:func:`fit_ft` starts a torchft Lighthouse in this process (bound to 127.0.0.1), spawns one
process per replica (:func:`exogym.run.ft.replica.run_replica`) and watches them: a replica
that dies is recorded (``fail``, at the step after its last committed one) and started again
(a new generation, which heals from a live peer) after its restart delay, up to
``max_restarts`` times; no replica is restarted once another has finished (no peer would be
left to heal from). The chaos harness's plan (:class:`Kill`: a replica, a step, a point in the
step, a restart delay or none) is given to the replicas, which SIGKILL themselves at that point:
a real, unannounced death at a chosen place.

The run's folder gets what a simulated run's has, from every replica's own record:
``metrics.jsonl`` (one row per step: the mean loss of the replicas that committed it, how many
did), ``events.jsonl`` (per node, as the simulated world writes them: ``fail``, ``rejoin``,
``recovery`` with its donor node, bytes and seconds, ``quorum``, ``discarded``), and
``summary.json`` (the steps each replica took part in, restarts and how long each took to be
back in training). What is not survived: the Lighthouse is one process (this one); if it dies,
the replicas' next quorum fails after ``quorum_timeout_s`` and the run ends with their errors.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from exogym.run.ft.manager import KillPoint, ReplicaLog, check_ft_strategy, require_torchft
from exogym.run.ft.record import FTResult, collect, finish, last_step, read_jsonl
from exogym.run.ft.replica import ReplicaSpec, run_replica
from exogym.sim.engine import EngineName
from exogym.sim.sharding import DatasetFactory
from exogym.strategy.base import StackedStrategy

__all__ = ["FTError", "FTResult", "Kill", "fit_ft", "fit_ft_torchrun"]


class FTError(RuntimeError):
    """A replica raised (not a death: a bug), or the run did not end within its deadline."""


@dataclass(frozen=True)
class Kill:
    """One death of the chaos harness: ``replica`` SIGKILLs itself at ``step`` (at ``at``, a
    :class:`KillPoint` point) and is started again ``restart_after_s`` seconds later (None:
    never). A replica's kills apply to its lives in the order given: the first to its first
    process, the second to the process that replaced it, and so on."""

    replica: int
    step: int
    at: str = "step"
    restart_after_s: float | None = 0.0

    def point(self) -> KillPoint:
        return KillPoint(self.step, self.at)

    def __str__(self) -> str:
        """As ``--kill`` writes it: ``REPLICA@STEP[:POINT][+SECONDS|+never]``."""
        at = "" if self.at == "step" else f":{self.at}"
        after = ("+never" if self.restart_after_s is None
                 else f"+{self.restart_after_s:g}" if self.restart_after_s else "")
        return f"{self.replica}@{self.step}{at}{after}"

    def never_fires(self, replicas: int, max_steps: int, checkpoint_every: int | None = None,
                    commit_every: int = 1) -> str | None:
        """Why this kill can never fire in a run of ``replicas`` replicas and ``max_steps``
        steps (its replica or step out of range; a ``checkpoint`` kill without checkpoints, or
        at a step after which none is written), or None where it can."""
        if not 0 <= self.replica < replicas:
            return f"replica {self.replica} does not exist (replicas are 0..{replicas - 1})"
        if not 0 <= self.step < max_steps:
            return f"step {self.step} never comes (steps are 0..{max_steps - 1})"
        if self.at != "checkpoint":
            return None
        if not checkpoint_every:
            return "no checkpoint is written without checkpoint_every (--checkpoint-every)"
        if commit_every == 1 and (self.step == 0 or self.step % checkpoint_every):
            # written at a commit, once `checkpoint_every` more steps are done
            k = checkpoint_every
            return (f"checkpoints are written when steps {k}, {2 * k}, ... are done "
                    f"(checkpoint_every={k}), never at step {self.step}")
        return None


def _entry(spec: ReplicaSpec, model: nn.Module, data: Dataset | DatasetFactory,
           strategy: StackedStrategy, eval_data: Dataset | None = None) -> None:
    try:
        run_replica(spec, model, data, strategy, eval_data)
    except BaseException:
        Path(spec.out_dir, f"replica{spec.replica}.error").write_text(traceback.format_exc())
        raise


def _spare(conn: Any, model: nn.Module, data: Dataset | DatasetFactory,
           strategy: StackedStrategy, eval_data: Dataset | None = None) -> None:
    """A warm spare: a process that has imported and warmed up everything a replica needs
    (torch, torchft, ``torch._dynamo``, which the first optimizer imports, about 1.3 s here) and
    waits for the spec of a replica to replace; the parent closing the pipe ends it."""
    import torch._dynamo  # (see above)
    import torchft  # noqa: F401

    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])  # the optimizers' lazy imports
    try:
        spec = conn.recv()
    except EOFError:
        return
    _entry(spec, model, data, strategy, eval_data)


@dataclass
class _Life:
    """A replica's current process and its history."""

    process: Any = None
    generation: int = 0
    started: float = 0.0
    restart_at: float | None = None  # when to start the next process (None: not planned)
    done: bool = False


class _Supervisor:
    def __init__(self, spec: ReplicaSpec, model: nn.Module, data: Dataset | DatasetFactory,
                 strategy: StackedStrategy, kills: Sequence[Kill], max_restarts: int,
                 spares: int, eval_data: Dataset | None = None) -> None:
        self.spec, self.model, self.data, self.strategy = spec, model, data, strategy
        self.eval_data = eval_data
        self.kills = {r: [k for k in kills if k.replica == r] for r in range(spec.replicas)}
        self.max_restarts = max_restarts
        self.lives = [_Life() for _ in range(spec.replicas)]
        self.events: list[dict[str, Any]] = []
        self.restarts: list[dict[str, Any]] = []
        self.ctx = mp.get_context("spawn")
        self.spares = spares
        self.waiting: list[tuple[Any, Any]] = []  # warm spares: (process, the pipe's end)

    def _warm(self) -> None:
        """Start spares until ``spares`` wait."""
        while len(self.waiting) < self.spares:
            receive, send = self.ctx.Pipe(duplex=False)
            p = self.ctx.Process(target=_spare, name="exogym-ft-spare",
                                 args=(receive, self.model, self.data, self.strategy,
                                       self.eval_data))
            p.start()
            receive.close()
            self.waiting.append((p, send))

    def start(self, r: int) -> None:
        """Start replica ``r``'s next process: a fresh one for the run's first processes, a
        warm spare (when one waits) for a restart."""
        life = self.lives[r]
        plan = self.kills[r][life.generation:life.generation + 1]
        spec = replace(self.spec, replica=r, generation=life.generation,
                       kills=tuple(k.point() for k in plan),
                       resume=self.spec.resume and life.generation == 0)
        life.started, life.restart_at = time.time(), None
        alive = [w for w in self.waiting if w[0].is_alive()]
        if life.generation > 0 and alive:
            self.waiting = alive[1:]
            life.process, send = alive[0]
            send.send(spec)
            send.close()
        else:
            life.process = self.ctx.Process(target=_entry, name=f"exogym-ft-replica{r}",
                                            args=(spec, self.model, self.data, self.strategy,
                                                  self.eval_data))
            life.process.start()
        for restart in self.restarts:
            if restart["replica"] == r and restart["generation"] == life.generation:
                restart["start_s"] = life.started - self.spec.t0

    def _died(self, r: int, code: int) -> None:
        life = self.lives[r]
        error = Path(self.spec.out_dir, f"replica{r}.error")
        if error.exists():
            raise FTError(f"replica {r} failed (exit code {code}):\n{error.read_text()}")
        step = last_step(Path(self.spec.out_dir), r) + 1
        self.events.append({"step": step, "time_s": time.time() - self.spec.t0,
                            "event": "fail", "replica": r, "exit_code": code})
        plan = self.kills[r][life.generation:life.generation + 1]
        delay = plan[0].restart_after_s if plan else 0.0
        life.generation += 1
        if delay is not None and life.generation <= self.max_restarts:
            life.restart_at = time.time() + delay
            self.restarts.append({"replica": r, "died_at_step": step, "generation":
                                  life.generation, "delay_s": delay})
        life.process = None

    def poll(self) -> bool:
        """One look at the processes; whether every replica is finished or gone for good."""
        for r, life in enumerate(self.lives):
            p = life.process
            if p is not None and not p.is_alive():
                p.join()
                if p.exitcode == 0:
                    life.done, life.process = True, None
                else:
                    self._died(r, p.exitcode)
        finished = any(life.done for life in self.lives)
        if not finished:
            self._warm()
        for r, life in enumerate(self.lives):
            if life.restart_at is not None and finished:
                life.restart_at = None  # no live peer would be left to heal from
                self.events.append({"step": self.spec.max_steps, "time_s": time.time() -
                                    self.spec.t0, "event": "not_restarted", "replica": r})
            elif life.restart_at is not None and time.time() >= life.restart_at:
                self.start(r)
        return all(life.process is None and life.restart_at is None for life in self.lives)

    def stop(self) -> None:
        for p, send in self.waiting:
            send.close()  # the spare's recv ends: it leaves
            p.join(timeout=5.0)
            if p.is_alive():
                p.kill()
                p.join()
        self.waiting = []
        for life in self.lives:
            if life.process is not None and life.process.is_alive():
                life.process.kill()
                life.process.join()


def _check(replicas: int, nodes_per_replica: int, max_steps: int, kills: Sequence[Kill], *,
           checkpoint_every: int | None, commit_every: int, min_replicas: int) -> None:
    for name, value in (("replicas", replicas), ("nodes_per_replica", nodes_per_replica),
                        ("max_steps", max_steps), ("commit_every", commit_every)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if isinstance(min_replicas, bool) or not isinstance(min_replicas, int) or not (
            1 <= min_replicas <= replicas):
        raise ValueError(f"min_replicas must be an integer in [1, replicas={replicas}], got "
                         f"{min_replicas!r}")
    for k in kills:
        k.point()  # checks ``at`` and the step's type
        why = k.never_fires(replicas, max_steps, checkpoint_every, commit_every)
        if why is not None:
            raise ValueError(f"the kill {k} can never fire: {why}")
        if k.restart_after_s is not None and not k.restart_after_s >= 0:
            raise ValueError(f"restart_after_s must be >= 0 or None (never), got "
                             f"{k.restart_after_s!r}")


def fit_ft(
    model: nn.Module, train_dataset: Dataset | DatasetFactory, strategy: StackedStrategy, *,
    replicas: int, max_steps: int, batch_size: int, out_dir: str | Path,
    nodes_per_replica: int = 1, seed: int = 0, kills: Sequence[Kill] = (),
    max_restarts: int = 3, checkpoint_every: int | None = None, resume: bool = False,
    min_replicas: int = 1, spares: int = 1, commit_every: int = 1,
    engine: EngineName = "loop", threads: int = 1, timeout_s: float = 10.0,
    quorum_timeout_s: float = 60.0, heartbeat_timeout_s: float = 1.0,
    deadline_s: float = 600.0, eval_dataset: Dataset | None = None,
    eval_interval: int | None = None, eval_samples: int | None = 2000,
) -> FTResult:
    """Train ``strategy`` on ``replicas`` torchft replicas (processes) of ``nodes_per_replica``
    nodes each, surviving the deaths of replicas (module docstring).

    Args:
        kills: the chaos plan (:class:`Kill`; one that can never fire is refused); replicas
            that die of anything else are restarted at once, up to ``max_restarts`` times each.
        checkpoint_every: write ``ckpt/replica{r}.pt`` every this many steps; resume: from it.
        min_replicas: a step commits only with at least this many replicas in its quorum
            (torchft's ``min_replica_size``; fewer: the step is discarded and tried again,
            so the run waits for restarts instead of going on smaller).
        commit_every: steps that communicate per quorum and commit (one transaction; a
            failure redoes up to this many): fewer RPCs for a method that communicates every
            step (DDP).
        spares: warm processes kept waiting to replace a dead replica (imports done: a
            restart skips about 2.7 s of start-up here); 0: a restart spawns a new process.
        timeout_s: torchft's collective timeout; heartbeat_timeout_s: how long the Lighthouse
            waits for a silent replica before a quorum forms without it.
        deadline_s: the whole run's bound; past it every replica is killed and
            :class:`FTError` says so (a hang is an error, never a wait).
        eval_dataset: evaluated at the end (the whole set: ``summary.json``'s ``final``) and,
            with ``eval_interval``, during training: after every ``eval_interval`` steps (and
            the last) the replica ranked first in the quorum evaluates its global model on a
            fixed subset of ``eval_samples`` (None: the whole set), written to
            ``metrics.jsonl`` as the simulator's evaluations are.

    Raises:
        FTUnavailable: torchft is not installed. ValueError: a strategy --ft does not take
        (named, with the reason), or bad arguments. FTError: a replica raised, or the deadline.
    """
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's Rust side logs every quorum at info
    require_torchft()
    from torchft.coordination import LighthouseServer

    check_ft_strategy(strategy)
    _check(replicas, nodes_per_replica, max_steps, kills, checkpoint_every=checkpoint_every,
           commit_every=commit_every, min_replicas=min_replicas)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        for stale in [*out.glob("replica*.jsonl"), *out.glob("replica*.result.pt"),
                      *out.glob("replica*.error")]:
            stale.unlink()
    lighthouse = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=int(timeout_s * 1000),
        heartbeat_timeout_ms=int(heartbeat_timeout_s * 1000))
    port = lighthouse.address().rsplit(":", 1)[1]
    t0 = time.time()
    spec = ReplicaSpec(
        replica=0, replicas=replicas, nodes_per_replica=nodes_per_replica, max_steps=max_steps,
        batch_size=batch_size, seed=seed, out_dir=str(out), lighthouse=f"http://127.0.0.1:{port}",
        t0=t0, timeout_s=timeout_s, quorum_timeout_s=quorum_timeout_s,
        checkpoint_every=checkpoint_every, resume=resume, min_replicas=min_replicas,
        commit_every=commit_every, engine=engine, threads=threads,
        eval_interval=eval_interval if eval_dataset is not None else None,
        eval_samples=eval_samples)
    sup = _Supervisor(spec, model, train_dataset, strategy, kills, max_restarts, spares,
                      eval_dataset)
    try:
        for r in range(replicas):
            sup.start(r)
        while not sup.poll():
            if time.time() - t0 > deadline_s:
                raise FTError(f"the run did not end within deadline_s={deadline_s} s "
                              f"(replicas: {[life.process for life in sup.lives]})")
            time.sleep(0.02)
    finally:
        sup.stop()
        lighthouse.shutdown()
    return finish(collect(spec, strategy.id, sup.events, sup.restarts), model, eval_dataset)




def _shared_t0(out: Path) -> float:
    """The run's start, shared by replicas started separately (torchrun groups): the first to
    come writes it (``.t0``, created exclusively), the others read it."""
    path = out / ".t0"
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        for _ in range(100):  # written right after it is created
            text = path.read_text()
            if text:
                return float(text)
            time.sleep(0.01)
        raise FTError(f"{path} stays empty: remove it (a run that died as it started)") from None
    now = time.time()
    with os.fdopen(fd, "w") as f:
        f.write(repr(now))
    return now


def _await_peers(out: Path, replicas: int, quiet_s: float = 2.0, most_s: float = 10.0) -> None:
    """Wait (at most ``most_s``) until every replica that is still writing its rows has
    finished, so that the record merged here is whole; a replica silent for ``quiet_s`` is
    dead or waiting for a peer, and is not waited for."""
    deadline = time.time() + most_s
    while time.time() < deadline:
        busy = [r for r in range(replicas)
                if not (out / f"replica{r}.result.pt").exists()
                and (rows := out / f"replica{r}.rows.jsonl").exists()
                and time.time() - rows.stat().st_mtime < quiet_s]
        if not busy:
            return
        time.sleep(0.05)


def fit_ft_torchrun(
    model: nn.Module, train_dataset: Dataset | DatasetFactory, strategy: StackedStrategy, *,
    replicas: int, max_steps: int, batch_size: int, out_dir: str | Path, seed: int = 0,
    kills: Sequence[Kill] = (), checkpoint_every: int | None = None, resume: bool = False,
    min_replicas: int = 1, commit_every: int = 1, timeout_s: float = 10.0,
    quorum_timeout_s: float = 60.0, environ: dict[str, str] | None = None,
    eval_dataset: Dataset | None = None, eval_interval: int | None = None,
    eval_samples: int | None = 2000,
) -> FTResult | None:
    """This process as one torchft replica of a run launched by ``torchrun`` groups (one group
    standing for one machine; torchrun's ``--max-restarts`` restarts a group's workers, which
    heal from a live peer). The environment gives: ``TORCHFT_LIGHTHOUSE`` (the Lighthouse's
    address, e.g. ``http://HOST:29510``; start one with ``torchft_lighthouse --min_replicas 1``),
    ``REPLICA_GROUP_ID`` (this group's index, default 0), torchrun's ``RANK`` and ``WORLD_SIZE``
    (this process in its group: replica ``group * WORLD_SIZE + RANK`` of ``replicas``) and
    ``TORCHELASTIC_RESTART_COUNT`` (its group's restarts: this process's generation, whose
    entry of ``kills`` applies). Every replica writes its files in ``out_dir`` (one folder
    seen by all, as on one machine) and merges the run's when it finishes; returns the run's
    result, or None for a restarted replica that found no peer to heal from. Evaluation as
    :func:`fit_ft`'s.
    """
    env = os.environ if environ is None else environ
    require_torchft()
    check_ft_strategy(strategy)
    _check(replicas, 1, max_steps, kills, checkpoint_every=checkpoint_every,
           commit_every=commit_every, min_replicas=min_replicas)
    lighthouse = env.get("TORCHFT_LIGHTHOUSE")
    if not lighthouse:
        raise ValueError("--ft under torchrun needs a Lighthouse: start one (torchft_lighthouse "
                         "--min_replicas 1 --bind HOST:29510) and set TORCHFT_LIGHTHOUSE="
                         "http://HOST:29510 for every torchrun group")
    try:
        group, rank = int(env.get("REPLICA_GROUP_ID", "0")), int(env["RANK"])
        size, generation = int(env["WORLD_SIZE"]), int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except (KeyError, ValueError) as err:
        raise ValueError(f"--ft under torchrun reads REPLICA_GROUP_ID, RANK, WORLD_SIZE and "
                         f"TORCHELASTIC_RESTART_COUNT as integers: {err}") from None
    replica = group * size + rank
    if replicas % size or not 0 <= replica < replicas:
        raise ValueError(f"--nodes {replicas} replicas in torchrun groups of WORLD_SIZE={size}: "
                         f"REPLICA_GROUP_ID={group} gives replica {replica}, outside 0.."
                         f"{replicas - 1} (groups 0..{replicas // size - 1})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan = [k for k in kills if k.replica == replica][generation:generation + 1]
    spec = ReplicaSpec(
        replica=replica, replicas=replicas, nodes_per_replica=1, max_steps=max_steps,
        batch_size=batch_size, seed=seed, out_dir=str(out), lighthouse=lighthouse,
        t0=_shared_t0(out), generation=generation, kills=tuple(k.point() for k in plan),
        hostname=env.get("EXOGYM_FT_HOSTNAME", socket.gethostname()), timeout_s=timeout_s,
        quorum_timeout_s=quorum_timeout_s, checkpoint_every=checkpoint_every,
        resume=resume and generation == 0, min_replicas=min_replicas, commit_every=commit_every,
        threads=torch.get_num_threads(),
        eval_interval=eval_interval if eval_dataset is not None else None,
        eval_samples=eval_samples)
    if generation > 0:  # torchrun restarted this group: its previous process died
        log = ReplicaLog(out, replica, spec.t0, generation - 1)
        log.event("fail", last_step(out, replica) + 1)
        log.close()
    run_replica(spec, model, train_dataset, strategy, eval_dataset)
    _await_peers(out, replicas)
    restarts = [{"replica": e["replica"], "generation": e["generation"], "start_s": e["time_s"],
                 "died_at_step": e["step"]}
                for r in range(replicas) for e in read_jsonl(out / f"replica{r}.events.jsonl")
                if e["event"] == "fail"]
    for r in restarts:
        r["generation"] += 1  # the life that replaced the one that died
    result = collect(spec, strategy.id, [], restarts)
    if replica not in result.global_states:
        return None
    return finish(result, model, eval_dataset)
