"""A ``--ft`` run's record: every replica's own files merged into the run's.

Each replica appends its rows, evaluations and events to ``replica{r}.rows.jsonl``,
``replica{r}.evals.jsonl`` and ``replica{r}.events.jsonl`` line by line (it can die at any
moment) and writes ``replica{r}.result.pt`` when it finishes; :func:`collect` merges them into
what a simulated run's folder has: ``metrics.jsonl`` (one row per step, with the evaluation made
after it, if any), ``events.jsonl`` (per node, in time order) and ``summary.json`` (a simulated
run's fields where they mean the same: samples, samples/s, bytes per node, the evaluation; and
its own: replicas, restarts, quorums, seconds); :func:`finish` adds the final evaluation on the
whole set and writes ``model.pt``.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from exogym.run.ft.replica import ReplicaSpec
from exogym.run.loop.evaluation import evaluate_model, load_state

__all__ = ["FTResult", "collect", "finish", "last_step", "read_jsonl"]


@dataclass
class FTResult:
    """What a ``--ft`` run ended with.

    Attributes:
        global_states: the global model of every replica alive at the end, by replica.
        syncs: synchronisations each of those committed (the same for all: none lost or doubled).
        trained: steps each replica took part in, over all its processes.
        restarts: per restart, the replica, the step it died at and the seconds from its new
            process's start to its heal (``back_s``; None if it never healed).
        rows: ``metrics.jsonl``'s rows; events: ``events.jsonl``'s; summary:
            ``summary.json``'s.
    """

    out_dir: Path
    global_states: dict[int, dict[str, Tensor]]
    syncs: dict[int, int]
    trained: dict[int, int]
    restarts: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)


def last_step(out: Path, r: int) -> int:
    """The last step replica ``r`` committed (-1: none), from its rows."""
    path = out / f"replica{r}.rows.jsonl"
    if not path.exists():
        return -1
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]
    return max(steps, default=-1)


def collect(spec: ReplicaSpec, strategy_id: str, events: Sequence[dict[str, Any]],
            restarts: list[dict[str, Any]]) -> FTResult:
    """Read every replica's result, rows and events in ``spec.out_dir``, with the launcher's
    own ``events`` (deaths) and ``restarts``; write the run's ``metrics.jsonl``,
    ``events.jsonl`` and ``summary.json`` (each by rename: a reader never sees half of one)."""
    out = Path(spec.out_dir)
    results = {r: torch.load(path, weights_only=False) for r in range(spec.replicas)
               if (path := out / f"replica{r}.result.pt").exists()}
    replica_events = [e for r in range(spec.replicas)
                      for e in read_jsonl(out / f"replica{r}.events.jsonl")]
    merged = _node_events([*events, *replica_events], spec.nodes_per_replica)
    rows_by_replica = {r: read_jsonl(out / f"replica{r}.rows.jsonl")
                       for r in range(spec.replicas)}
    rows = _merge_rows(rows_by_replica, [e for r in range(spec.replicas)
                                         for e in read_jsonl(out / f"replica{r}.evals.jsonl")])
    trained = {r: len(rs) for r, rs in rows_by_replica.items()}
    for restart in restarts:
        _time_restart(restart, replica_events)
    _write_jsonl(out / "metrics.jsonl", rows)
    _write_jsonl(out / "events.jsonl", merged)
    summary = {**_common_fields(spec, strategy_id, rows, results, replica_events),
               "replicas": spec.replicas, "nodes": spec.num_nodes, "trained": trained,
               "restarts": restarts, "quorums": sum(e["event"] == "quorum" for e in merged),
               "syncs": {r: v["syncs"] for r, v in results.items()}, "ft": True,
               "seconds": {r: v["seconds"] for r, v in results.items()},
               "wall_s": time.time() - spec.t0}
    _write_jsonl(out / "summary.json", [summary])
    return FTResult(out, {r: v["global_state"] for r, v in results.items()},
                    {r: v["syncs"] for r, v in results.items()}, trained, restarts, rows,
                    merged, summary["wall_s"], summary)


def _common_fields(spec: ReplicaSpec, strategy_id: str, rows: Sequence[dict[str, Any]],
                   results: dict[int, dict[str, Any]],
                   events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The fields a simulated run's ``summary.json`` has, as a real run measures them: the
    training time runs from the first process's loop start to the last committed step's row,
    less the evaluations during training (as a simulated run's; start-up, the final evaluation
    and the merge are outside it); bytes are counted per node by the process alive at the end
    (a restarted one from its heal)."""
    samples = len(rows) * spec.num_nodes * spec.batch_size
    starts = [e["time_s"] for e in events if e["event"] == "training"]
    ends = [r["wall_s"] for r in rows if "wall_s" in r]
    # one replica evaluates at a time (the first in the quorum); the evaluation after the last
    # step comes after its row, outside the span (subtracting it made a short run's training
    # time negative)
    evaluating = sum(v["seconds"].get("eval", 0.0) for v in results.values())
    train_s = max(ends) - min(starts) - evaluating if starts and ends else None
    sent = [0.0] * spec.num_nodes
    received = [0.0] * spec.num_nodes
    for r, v in results.items():  # each process counts per global node: its own are its
        for node in range(r * spec.nodes_per_replica, (r + 1) * spec.nodes_per_replica):
            sent[node], received[node] = v["bytes_sent"][node], v["bytes_received"][node]
    evals = [r for r in rows if "eval_loss" in r]
    return {"strategy": strategy_id, "num_nodes": spec.num_nodes, "steps": spec.max_steps,
            "batch_size_per_node": spec.batch_size, "samples": samples,
            "train_time_s": train_s,
            "samples_per_s": samples / train_s if train_s else None,
            "bytes_sent_per_node": sent, "bytes_received_per_node": received,
            "engine": "process", "seed": spec.seed, "out_dir": spec.out_dir,
            "eval_during_training": bool(evals),
            "final": {k: v for k, v in evals[-1].items() if k.startswith("eval_")}
            if evals else {}}


def finish(result: FTResult, model: nn.Module, eval_dataset: Dataset | None,
           batch_size: int = 1000) -> FTResult:
    """The final model (the global model of the lowest replica alive at the end; every
    replica's is the same) evaluated on the whole ``eval_dataset`` into ``summary.json``'s
    ``final`` and saved as ``model.pt``, as a simulated run's; nothing without an evaluation
    set or a finished replica."""
    if eval_dataset is None or not result.global_states:
        return result
    state = result.global_states[min(result.global_states)]
    module = copy.deepcopy(model).eval()
    final = evaluate_model(module, state, eval_dataset, batch_size, torch.device("cpu"))
    load_state(module, state)
    tmp = result.out_dir / f".model.pt.{os.getpid()}.tmp"
    torch.save(module.state_dict(), tmp)
    os.replace(tmp, result.out_dir / "model.pt")
    result.summary = {**result.summary, "final": final}
    _write_jsonl(result.out_dir / "summary.json", [result.summary])
    return result


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


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # replicas may write at once
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


def _merge_rows(by_replica: dict[int, list[dict[str, Any]]],
                evals: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """One row per step: the mean loss of the replicas that committed it, the wall time of the
    last, and the evaluation made after it (the first made, if two replicas made one)."""
    steps: dict[int, list[dict[str, Any]]] = {}
    for rows in by_replica.values():
        for row in rows:
            steps.setdefault(int(row["step"]), []).append(row)
    after: dict[int, dict[str, Any]] = {}
    for e in sorted(evals, key=lambda e: e["time_s"]):
        after.setdefault(int(e["step"]), {k: v for k, v in e.items() if k.startswith("eval_")})
    return [{"step": s, "train_loss": sum(r["loss"] for r in rs) / len(rs),
             "replicas": sorted(r["replica"] for r in rs),
             "quorum": max(r["quorum"] for r in rs),
             "wall_s": max(r["time_s"] for r in rs), **after.get(s, {})}
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

