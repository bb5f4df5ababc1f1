"""A ``--ft`` run on this machine: a Lighthouse, one process per torchft replica, restarts.

:func:`fit_ft` starts a torchft Lighthouse in this process (bound to 127.0.0.1), spawns one
process per replica (:func:`exogym.run.ft_replica.run_replica`) and watches them: a replica
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

import json
import multiprocessing as mp
import os
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from exogym.run.ft import KillPoint, check_ft_strategy, require_torchft
from exogym.run.ft_replica import ReplicaSpec, run_replica
from exogym.sim.engine import EngineName
from exogym.sim.sharding import DatasetFactory
from exogym.strategy.base import Strategy

__all__ = ["FTError", "FTResult", "Kill", "fit_ft"]


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


@dataclass
class FTResult:
    """What a ``--ft`` run ended with.

    Attributes:
        global_states: the global model of every replica alive at the end, by replica.
        syncs: synchronisations each of those committed (the same for all: none lost or doubled).
        trained: steps each replica took part in, over all its processes.
        restarts: per restart, the replica, the step it died at and the seconds from its new
            process's start to its heal (``back_s``; None if it never healed).
        rows: ``metrics.jsonl``'s rows; events: ``events.jsonl``'s.
    """

    out_dir: Path
    global_states: dict[int, dict[str, Tensor]]
    syncs: dict[int, int]
    trained: dict[int, int]
    restarts: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0


def _entry(spec: ReplicaSpec, model: nn.Module, data: Dataset | DatasetFactory,
           strategy: Strategy) -> None:
    try:
        run_replica(spec, model, data, strategy)
    except BaseException:
        Path(spec.out_dir, f"replica{spec.replica}.error").write_text(traceback.format_exc())
        raise


def _spare(conn: Any, model: nn.Module, data: Dataset | DatasetFactory,
           strategy: Strategy) -> None:
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
    _entry(spec, model, data, strategy)


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
                 strategy: Strategy, kills: Sequence[Kill], max_restarts: int,
                 spares: int) -> None:
        self.spec, self.model, self.data, self.strategy = spec, model, data, strategy
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
                                 args=(receive, self.model, self.data, self.strategy))
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
                                            args=(spec, self.model, self.data, self.strategy))
            life.process.start()
        for restart in self.restarts:
            if restart["replica"] == r and restart["generation"] == life.generation:
                restart["start_s"] = life.started - self.spec.t0

    def _died(self, r: int, code: int) -> None:
        life = self.lives[r]
        error = Path(self.spec.out_dir, f"replica{r}.error")
        if error.exists():
            raise FTError(f"replica {r} failed (exit code {code}):\n{error.read_text()}")
        step = _last_step(Path(self.spec.out_dir), r) + 1
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


def _last_step(out: Path, r: int) -> int:
    """The last step replica ``r`` committed (-1: none), from its rows."""
    path = out / f"replica{r}.rows.jsonl"
    if not path.exists():
        return -1
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]
    return max(steps, default=-1)


def _check(replicas: int, nodes_per_replica: int, max_steps: int, kills: Sequence[Kill]) -> None:
    for name, value in (("replicas", replicas), ("nodes_per_replica", nodes_per_replica),
                        ("max_steps", max_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    for k in kills:
        if not 0 <= k.replica < replicas:
            raise ValueError(f"a kill names replica {k.replica}; the run has replicas "
                             f"0..{replicas - 1}")
        if not 0 <= k.step < max_steps:
            raise ValueError(f"a kill at step {k.step}: steps are 0..{max_steps - 1}")
        k.point()  # checks ``at``
        if k.restart_after_s is not None and not k.restart_after_s >= 0:
            raise ValueError(f"restart_after_s must be >= 0 or None (never), got "
                             f"{k.restart_after_s!r}")


def fit_ft(
    model: nn.Module, train_dataset: Dataset | DatasetFactory, strategy: Strategy, *,
    replicas: int, max_steps: int, batch_size: int, out_dir: str | Path,
    nodes_per_replica: int = 1, seed: int = 0, kills: Sequence[Kill] = (),
    max_restarts: int = 3, checkpoint_every: int | None = None, resume: bool = False,
    min_replicas: int = 1, spares: int = 1,
    engine: EngineName = "loop", threads: int = 1, timeout_s: float = 10.0,
    quorum_timeout_s: float = 60.0, heartbeat_timeout_s: float = 1.0,
    deadline_s: float = 600.0,
) -> FTResult:
    """Train ``strategy`` on ``replicas`` torchft replicas (processes) of ``nodes_per_replica``
    nodes each, surviving the deaths of replicas (module docstring).

    Args:
        kills: the chaos plan (:class:`Kill`); replicas that die of anything else are
            restarted at once, up to ``max_restarts`` times each.
        checkpoint_every / resume: replicas write ``ckpt/replica{r}.pt`` every this many steps;
            a run with ``resume=True`` starts from the newest of them.
        min_replicas: a step commits only with at least this many replicas in its quorum
            (torchft's ``min_replica_size``; fewer: the step is discarded and tried again,
            so the run waits for restarts instead of going on smaller).
        spares: warm processes kept waiting to replace a dead replica (imports done: a
            restart skips about 2.7 s of start-up here); 0: a restart spawns a new process.
        timeout_s: torchft's collective timeout; heartbeat_timeout_s: how long the Lighthouse
            waits for a silent replica before a quorum forms without it.
        deadline_s: the whole run's bound; past it every replica is killed and
            :class:`FTError` says so (a hang is an error, never a wait).

    Raises:
        FTUnavailable: torchft is not installed. ValueError: a strategy --ft does not take
        (named, with the reason), or bad arguments. FTError: a replica raised, or the deadline.
    """
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's Rust side logs every quorum at info
    require_torchft()
    from torchft.coordination import LighthouseServer

    check_ft_strategy(strategy)
    _check(replicas, nodes_per_replica, max_steps, kills)
    if isinstance(min_replicas, bool) or not isinstance(min_replicas, int) or not (
            1 <= min_replicas <= replicas):
        raise ValueError(f"min_replicas must be an integer in [1, replicas={replicas}], got "
                         f"{min_replicas!r}")
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
        engine=engine, threads=threads)
    sup = _Supervisor(spec, model, train_dataset, strategy, kills, max_restarts, spares)
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
    return _collect(out, sup, t0, nodes_per_replica, strategy)


def _collect(out: Path, sup: _Supervisor, t0: float, n_local: int,
             strategy: Strategy) -> FTResult:
    """Read every replica's results, rows and events; write the run's files."""
    results = {r: torch.load(path, weights_only=False) for r in range(sup.spec.replicas)
               if (path := out / f"replica{r}.result.pt").exists()}
    replica_events = [e for r in range(sup.spec.replicas)
                      for e in _read_jsonl(out / f"replica{r}.events.jsonl")]
    events = _node_events(sup.events + replica_events, n_local)
    rows_by_replica = {r: _read_jsonl(out / f"replica{r}.rows.jsonl")
                       for r in range(sup.spec.replicas)}
    rows = _merge_rows(rows_by_replica)
    trained = {r: len(rs) for r, rs in rows_by_replica.items()}
    for restart in sup.restarts:
        _time_restart(restart, replica_events)
    _write_jsonl(out / "metrics.jsonl", rows)
    _write_jsonl(out / "events.jsonl", events)
    summary = {"strategy": strategy.id, "replicas": sup.spec.replicas, "nodes": sup.spec.num_nodes,
               "steps": sup.spec.max_steps, "trained": trained, "restarts": sup.restarts,
               "syncs": {r: v["syncs"] for r, v in results.items()}, "ft": True,
               "seconds": {r: v["seconds"] for r, v in results.items()},
               "wall_s": time.time() - t0}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return FTResult(out, {r: v["global_state"] for r, v in results.items()},
                    {r: v["syncs"] for r, v in results.items()}, trained, sup.restarts, rows,
                    events, summary["wall_s"])


def _time_restart(restart: dict[str, Any], events: Sequence[dict[str, Any]]) -> None:
    """A restart's times (seconds): ``up_s`` from its process's start to its loop's start
    (spawn, imports, nodes and data order built), ``back_s`` to its heal (a live peer's state
    loaded: back in training; None if it never healed)."""
    mine = [e for e in events if e["replica"] == restart["replica"]
            and e["generation"] == restart["generation"]]
    started = [e["time_s"] for e in mine if e["event"] == "started"]
    healed = [e["time_s"] for e in mine if e["event"] == "recovery"]
    start = restart.get("start_s")
    restart["up_s"] = started[0] - start if started and start is not None else None
    restart["back_s"] = healed[0] - start if healed and start is not None else None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


def _merge_rows(by_replica: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per step: the mean loss of the replicas that committed it."""
    steps: dict[int, list[dict[str, Any]]] = {}
    for rows in by_replica.values():
        for row in rows:
            steps.setdefault(int(row["step"]), []).append(row)
    return [{"step": s, "train_loss": sum(r["loss"] for r in rs) / len(rs),
             "replicas": sorted(r["replica"] for r in rs),
             "quorum": max(r["quorum"] for r in rs)}
            for s, rs in sorted(steps.items())]


def _node_events(events: list[dict[str, Any]], n_local: int) -> list[dict[str, Any]]:
    """Replica events as the simulated world's: one per node (``node``; a heal's ``donor`` the
    donor replica's node in the same row), in time order; ``started``/``resumed`` kept once."""
    out = []
    for e in sorted(events, key=lambda e: e["time_s"]):
        r = e["replica"]
        if e["event"] in ("started", "quorum", "resumed", "not_restarted", "discarded",
                          "no_peer"):
            out.append(e)
            continue
        for i in range(n_local):
            node = {**e, "node": r * n_local + i}
            if e["event"] == "recovery":
                node["donor"] = e["donor_replica"] * n_local + i
                out.append({**node, "event": "rejoin"})
            out.append(node)
    return out

