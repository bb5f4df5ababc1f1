"""What a run produces: its metrics on disk as it goes, and a :class:`FitResult` at the end."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch import nn

from exogym.sim.clock import ClockReport, ClockTrace
from exogym.sim.comm import CommRecord
from exogym.sim.network import Network, format_duration, parse_network

__all__ = ["FitResult", "MetricsWriter", "NonFiniteLossError", "check_out_dir", "check_writable",
           "read_json"]


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or infinite loss (the run diverged); the message names the first
    step, the nodes and the strategy. Pass ``allow_nonfinite=True`` (``--allow-nonfinite``) to
    train on regardless."""


def read_json(path: str | Path, hint: str = "") -> dict[str, Any]:
    """A JSON object from a file a run wrote (``config.json``, ``summary.json``).

    Raises:
        FileNotFoundError: the file does not exist (``hint`` says what was expected).
        ValueError: it is not valid JSON (truncated, corrupted) or not an object, naming it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist" + (f": {hint}" if hint else ""))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON (truncated or corrupted?): {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def check_writable(path: str | Path, what: str = "output") -> Path:
    """``path`` (a file or folder that may not exist yet) can be created: something can really
    be created in its nearest existing ancestor (a probe folder, removed at once; permission
    bits alone do not tell, e.g. for root on a read-only or virtual file system). Raises
    OSError naming the path, before any work is done."""
    path = Path(path)
    if str(path) == "":
        raise ValueError(f"the {what} path is empty; give a folder or file name")
    ancestor = path.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    target = path if path.exists() else ancestor
    if not target.is_dir() and target == ancestor:
        raise NotADirectoryError(f"cannot create {what} {str(path)!r}: {str(ancestor)!r} is a "
                                 "file, not a folder")
    probe_in = target if target.is_dir() else target.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".exogym-probe-", dir=probe_in))
    except OSError as err:
        raise PermissionError(f"cannot write {what} {str(path)!r}: creating anything in "
                              f"{str(probe_in)!r} fails ({err.strerror})") from None
    return path


def check_out_dir(out_dir: str | Path) -> Path:
    """A run folder must not exist, or be an empty folder, and must be creatable: anything else
    is an error before any work (an existing run is continued only by an explicit resume).

    Raises:
        ValueError: an empty path.
        FileExistsError: the path exists and is a file or a non-empty folder.
        OSError: the folder cannot be created (the message names the path).
    """
    if str(out_dir) == "":
        raise ValueError("the output folder is empty (''): give a folder name, e.g. --out runs/a")
    path = Path(out_dir)
    if path.exists():
        if not path.is_dir():
            raise FileExistsError(f"output folder {str(path)!r} is an existing file; choose "
                                  "another (--out)")
        if any(path.iterdir()):
            raise FileExistsError(
                f"output folder {str(path)!r} already exists and is not empty; choose another "
                "(--out) or move it away (exogym never writes into a folder that holds files)")
    return check_writable(path, "output folder")


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    return value


class MetricsWriter:
    """A run folder: ``metrics.jsonl`` (one JSON object per logged step, flushed line by line so
    a crash keeps what was written), ``config.json``, ``summary.json`` and ``model.pt`` (the
    global model at the last evaluation and at the end).

    The folder must not exist or be empty (:func:`check_out_dir`): nothing a user put there is
    ever overwritten.
    """

    def __init__(self, out_dir: str | Path, config: dict[str, Any]) -> None:
        self.dir = check_out_dir(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        metrics = self.dir / "metrics.jsonl"
        self._events: IO[str] | None = None
        self._write_json("config.json", config)
        self._file: IO[str] = metrics.open("w", encoding="utf-8")

    @classmethod
    def resume(cls, out_dir: str | Path, config: dict[str, Any],
               rows: list[dict[str, Any]],
               events: list[dict[str, Any]] | None = None) -> MetricsWriter:
        """Continue a run folder from a checkpoint: ``metrics.jsonl`` becomes exactly ``rows``
        (the rows logged up to the checkpoint, rewritten atomically: rows a crash left after it
        are dropped, none is duplicated), ``config.json`` the run's config (its ``steps`` may
        have grown); new rows are appended."""
        self = cls.__new__(cls)
        self.dir = Path(out_dir)
        if not self.dir.is_dir():
            raise FileNotFoundError(f"run folder {self.dir} does not exist")
        self._write_json("config.json", config)
        metrics = self.dir / "metrics.jsonl"
        tmp = self.dir / ".metrics.jsonl.tmp"
        tmp.write_text("".join(_row_line(row) for row in rows), encoding="utf-8")
        tmp.replace(metrics)
        self._file = metrics.open("a", encoding="utf-8")
        self._events = None
        if events:
            tmp = self.dir / ".events.jsonl.tmp"
            tmp.write_text("".join(_row_line(e) for e in events), encoding="utf-8")
            tmp.replace(self.dir / "events.jsonl")
        elif (self.dir / "events.jsonl").exists():
            (self.dir / "events.jsonl").unlink()  # events after the checkpoint: not yet
        return self

    def write_event(self, event: dict[str, Any]) -> None:
        """One line of ``events.jsonl``: what the world did (a failure, a rejoin, a recovery, a
        lost message, a straggler cut), flushed at once."""
        if self._events is None:
            self._events = (self.dir / "events.jsonl").open("a", encoding="utf-8")
        self._events.write(_row_line(event))
        self._events.flush()

    def write(self, row: dict[str, Any]) -> None:
        self._file.write(_row_line(row))
        self._file.flush()

    def save_model(self, state: dict[str, Any]) -> None:
        """The global model's ``state_dict`` as ``model.pt`` (written to a temporary file, then
        renamed: a crash leaves the previous checkpoint whole)."""
        tmp = self.dir / ".model.pt.tmp"
        torch.save({k: v.detach().cpu() for k, v in state.items()}, tmp)
        tmp.replace(self.dir / "model.pt")

    def close(self, summary: dict[str, Any] | None = None) -> None:
        self._file.close()
        if self._events is not None:
            self._events.close()
        if summary is not None:
            self._write_json("summary.json", summary)

    def _write_json(self, name: str, obj: dict[str, Any]) -> None:
        tmp = self.dir / f".{name}.tmp"
        tmp.write_text(_dumps(obj) + "\n", encoding="utf-8")
        tmp.replace(self.dir / name)


def _row_line(row: dict[str, Any]) -> str:
    return json.dumps({k: _jsonable(v) for k, v in row.items()}) + "\n"


def _dumps(obj: Any, level: int = 0) -> str:
    """JSON, indented by 2, with lists of plain values on one line (per-node lists stay short)."""
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{json.dumps(str(k))}: {_dumps(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(obj, (list, tuple)):
        if all(not isinstance(v, (dict, list, tuple)) for v in obj):
            return json.dumps([_jsonable(v) for v in obj], default=_jsonable)
        return "[\n" + ",\n".join(inner + _dumps(v, level + 1) for v in obj) + f"\n{pad}]"
    return json.dumps(_jsonable(obj), default=_jsonable)


@dataclass
class FitResult:
    """The outcome of :meth:`exogym.Trainer.fit`.

    Attributes:
        model: the final global model (a fresh copy of the user's module with its weights).
        history: every logged row (``step``, ``train_loss``, ``lr``, ``bytes_sent``, eval metrics
            on evaluation steps, ...), as written to ``metrics.jsonl``.
        final: the last evaluation of the global model (``eval_loss``, ``eval_accuracy``, ...).
        strategy: the strategy's registry id; ``hyperparameters`` its fields.
        num_nodes: ``N``, the run's nodes.
        steps: the run's steps.
        batch_size: the batch size per node.
        samples: training samples processed, all nodes together.
        train_time_s: wall time of the training steps (evaluation excluded).
        wall_time_s: wall time of the whole fit. Both add up every session of a resumed run.
        resumed_from: ``{"step", "checkpoint"}`` where this session continued the run (None:
            it started here).
        bytes_sent: per node, cumulative.
        bytes_received: per node, cumulative.
        comm_log: every collective (for network models).
        engine: the engine the nodes computed with.
        device: where they computed.
        seed: the run's seed.
        out_dir: the run folder (None: none).
        processes: OS processes the nodes were spread over (1: simulated in one process).
        eval_set: the evaluation set of ``final`` (the whole set): its ``test_set`` attribute
            (CIFAR-10 reports whether the full or the partial test batch was used), else its
            size.
        eval_during_training: the fixed subset the rows' ``eval_*`` metrics were measured on
            during training, or None when every evaluation used the whole set.
        nonfinite: ``{"step": s, "nodes": [...]}`` where a loss first was NaN or infinite in a
            run allowed to go on (``allow_nonfinite=True``); None if it never was.
        world: the run's world (:mod:`exogym.sim.world`) and what happened in it: its spec and
            the counts of failures, rejoins, recoveries (their bytes and simulated seconds),
            lost messages, stragglers cut and quorum waits; None for a perfect world.
        events: the world's event log, as in ``events.jsonl`` (``step``, ``time_s``, ``node``,
            ``event``: fail, rejoin, recovery (with ``bytes``, ``duration_s``, ``donor``), lost,
            late, quorum_wait).
        asynchronous: an asynchronous strategy's per-node timelines: ``node_steps`` (steps each
            node took), ``updates`` applied by the server, their staleness (``staleness_mean``,
            ``staleness_max``, ``staleness_counts``: how many updates were ``k`` server
            versions old) and the server's bytes; None for a synchronous strategy.
        network: the simulated network of the run's clock (None: no clock).
        clock: the simulated time on it (:class:`exogym.sim.clock.ClockReport`): total, compute,
            communication, idle, utilization.
        trace: what re-costing needs (:meth:`recost`): compute per step and the collectives.
        compute: how the clock priced a step on the run's hardware (``compute="profile"``,
            :class:`exogym.sim.devices.Pricing`): the hardware, the counted step (FLOPs,
            bytes, kernels) and its seconds on each device; None for another price.
        population: a run holding its clients in seats (:mod:`exogym.run.nodes.population`): its
            clients, seats (``per_round``; an asynchronous server's clients in flight), client
            state, rounds, clients that trained, joins (their bytes and seconds) and the client
            store; None otherwise. ``bytes_sent``/``bytes_received`` are then per client, and
            ``comm_log`` is in seats (:func:`exogym.run.nodes.population.client_records` gives it in
            client ids).
        rounds: each round's clients, in seat order (an asynchronous server: its first
            clients, then each client drawn, one at a time); ``draw_seats``: the seat each of
            those took.
    """

    model: nn.Module
    history: list[dict[str, Any]]
    final: dict[str, float]
    strategy: str
    hyperparameters: dict[str, Any]
    num_nodes: int
    steps: int
    batch_size: int
    samples: int
    train_time_s: float
    wall_time_s: float
    bytes_sent: list[float]
    bytes_received: list[float]
    engine: str
    device: str
    seed: int
    out_dir: Path | None = None
    eval_set: str | None = None
    eval_during_training: str | None = None
    nonfinite: dict[str, Any] | None = None
    world: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list, repr=False)
    asynchronous: dict[str, Any] | None = None
    comm_log: list[CommRecord] = field(default_factory=list, repr=False)
    network: Network | None = None
    clock: ClockReport | None = None
    trace: ClockTrace | None = field(default=None, repr=False)
    compute: dict[str, Any] | None = field(default=None, repr=False)
    processes: int = 1
    resumed_from: dict[str, Any] | None = None
    paging: dict[str, Any] | None = None
    population: dict[str, Any] | None = None
    rounds: list[list[int]] | None = field(default=None, repr=False)
    draw_seats: list[int] | None = field(default=None, repr=False)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.train_time_s if self.train_time_s > 0 else float("nan")

    def recost(self, network: Network | str, step_time_s: float | None = None) -> ClockReport:
        """The simulated time of this run on another network (no retraining): the recorded
        collectives and compute per step replayed on ``network``, with ``step_time_s`` of
        compute per step per node instead of the recorded compute if given.

        Raises:
            ValueError: no simulated clock; or the run cannot be re-costed
                (``trace.not_recostable``: who took part was decided by simulated time) and
                ``network`` is another than its own or ``step_time_s`` is given (another compute
                time moves every event in time, and so who took part) — as ``exogym recost``.
        """
        if self.trace is None:
            raise ValueError("this run has no simulated clock (it ran with network=None)")
        net = parse_network(network)
        why = self.trace.not_recostable
        if step_time_s is not None and why is not None:
            raise ValueError(f"this run cannot be re-costed with another compute time per step: "
                             f"{why}; train it again with --step-time {step_time_s:g}s")
        if self.network is None or net.spec() != self.network.spec():
            self.trace.check_recostable(net)
        return self.trace.cost(net, step_time_s)

    def to_dict(self) -> dict[str, Any]:
        """The ``summary.json`` content."""
        return {
            "strategy": self.strategy,
            "hyperparameters": {k: _jsonable(v) for k, v in self.hyperparameters.items()},
            "num_nodes": self.num_nodes,
            "steps": self.steps,
            "batch_size_per_node": self.batch_size,
            "samples": self.samples,
            "final": self.final,
            "train_time_s": self.train_time_s,
            "wall_time_s": self.wall_time_s,
            "samples_per_s": self.samples_per_s,
            "bytes_sent_per_node": _per_node(self.bytes_sent),
            "bytes_received_per_node": _per_node(self.bytes_received),
            "collectives": len(self.comm_log),
            "engine": self.engine,
            "processes": self.processes,
            "resumed_from": self.resumed_from,
            "device": self.device,
            "seed": self.seed,
            "out_dir": str(self.out_dir) if self.out_dir else None,
            "eval_set": self.eval_set,
            "eval_during_training": self.eval_during_training,
            "nonfinite": self.nonfinite,
            "world": self.world,
            "asynchronous": self.asynchronous,
            **({} if self.paging is None else {"paging": self.paging}),
            **({} if self.population is None else {"population": self.population}),
            **self._clock_dict(),
        }

    def _clock_dict(self) -> dict[str, Any]:
        if self.clock is None or self.network is None or self.trace is None:
            return {"network": None}
        c = self.clock
        return {
            "network": self.network.to_dict(),
            "sim_time_s": c.total_s, "sim_compute_s": c.compute_s, "sim_comm_s": c.comm_s,
            "sim_idle_s": c.idle_s, "utilization": c.utilization,
            "step_time_s": c.step_time_s, "compute_source": c.compute_source,
            "compute_method": self.trace.compute_method,
            **({"compute": self.compute} if self.compute is not None else {}),
            "clock": {"report": c.to_dict(), "trace": self.trace.to_dict()},
        }

    def summary(self) -> str:
        """A short human-readable report."""
        lines = [f"strategy {self.strategy}  nodes {self.num_nodes}  steps {self.steps}  "
                 f"batch/node {self.batch_size}  engine {self.engine}  device {self.device}"
                 + (f"  processes {self.processes}" if self.processes > 1 else "")]
        if self.final:
            lines.append("final eval  " + "  ".join(
                f"{k.removeprefix('eval_')} {_fmt_metric(k, v)}" for k, v in self.final.items())
                + (f"  (on {self.eval_set})" if self.eval_set else ""))
        if self.nonfinite:
            lines.append(f"diverged    non-finite loss first at step {self.nonfinite['step']} on "
                         f"node(s) {', '.join(map(str, self.nonfinite['nodes']))}")
        sent, recv = self.bytes_sent, self.bytes_received
        if self.population is not None:
            p = self.population
            drawn = "drawn per round" if "reports_per_round" in p else "per round"
            lines.append(f"population  {p['clients']:,} clients, {p['per_round']:,} "
                         f"{'in flight' if p['asynchronous'] else drawn} "
                         f"({p['client_state']}): {p['clients_trained']:,} trained"
                         + ("" if p["asynchronous"] else f" in {p['rounds']:,} rounds"))
            if "abandoned_rounds" in p:  # a round policy's
                kept = p.get("reports_per_round", p["per_round"])
                lines.append(f"            round policy: first {kept:,} reports kept; "
                             f"{p['discarded']:,} discarded, {p['late']:,} late, "
                             f"{p['dropouts']:,} dropped out, {p['abandoned_rounds']:,} rounds "
                             "abandoned")
        lines.append(
            f"throughput  {self.samples_per_s:,.0f} samples/s  ({self.samples:,} samples in "
            f"{self.train_time_s:.1f} s of training, {self.wall_time_s:.1f} s in all)"
        )
        lines.append(f"traffic     {_traffic(sent, recv, len(self.comm_log), self.population)}")
        if self.paging is not None:
            p = self.paging
            lines.append(f"paged       {p['groups']} groups of {p['resident']} nodes on "
                         f"{p['offload']}: {_fmt_bytes(p['bytes_written'])} written, "
                         f"{_fmt_bytes(p['bytes_read'])} read, {p['seconds']:.1f} s")
        if self.resumed_from is not None:
            lines.append(f"resumed     at step {self.resumed_from['step']:,} from "
                         f"{self.resumed_from['checkpoint']} (times: every session together)")
        if self.world is not None:
            lines.append(f"world       {self.world['spec']}: "
                         f"{world_line(self.world, joins=self.population is not None)}")
        if self.asynchronous is not None:
            a = self.asynchronous
            steps = a["node_steps"]
            stale = ("" if a["staleness_mean"] is None else
                     f", staleness mean {a['staleness_mean']:.2f} max {a['staleness_max']}")
            period = "" if a.get("H") is None else f"H = {a['H']}, "
            lines.append(f"async       {period}{a['updates']} updates applied{stale}; steps per "
                         f"node {':'.join(map(str, steps))}")
        if self.clock is not None and self.network is not None:
            c = self.clock
            split = c.line() if self.population is None else (  # a seat hosts many clients
                f"{format_duration(c.total_s)}; per seat, its clients' time: compute "
                f"{format_duration(c.compute_s)}, comm {format_duration(c.comm_s)}, idle "
                f"{format_duration(c.idle_s)}")
            lines.append(f"sim clock   {self.network.name} ({self.network.describe()}): "
                         f"{split}")
            how = c.compute_source
            if self.trace is not None and self.trace.compute_method:
                how += f": {self.trace.compute_method}"
            lines.append(f"            compute {format_duration(c.step_time_s)} per step per node "
                         f"({how})")
            if self.trace is not None and self.trace.not_recostable is not None:
                lines.append(f"            cannot be re-costed by exogym recost: "
                             f"{self.trace.not_recostable}")
            elif self.out_dir:
                lines.append(f"            on another network: exogym recost {self.out_dir} "
                             "--network NAME")
            else:  # no folder to give the command: the result re-costs itself
                lines.append('            on another network: result.recost("NAME")')
        if self.out_dir:
            lines.append(f"written to  {self.out_dir}")
        return "\n".join(lines)


def _traffic(sent: Sequence[float], recv: Sequence[float], collectives: int,
             population: dict[str, Any] | None) -> str:
    """The summary's traffic line: the most any node sent and received; a population's, per
    client that took part (any traffic), on average and at most."""
    plural = f"collective{'s' * (collectives != 1)}"
    if population is None:
        return (f"per node sent {_fmt_bytes(float(max(sent)))}, received "
                f"{_fmt_bytes(float(max(recv)))} (max over nodes; {collectives} {plural})")
    up, down = np.asarray(sent, dtype=np.float64), np.asarray(recv, dtype=np.float64)
    took_part = (up != 0) | (down != 0)
    k = int(took_part.sum())
    if k == 0:
        return f"no client sent or received anything ({collectives} {plural})"
    return (f"per client sent {_fmt_bytes(float(up[took_part].mean()))}, received "
            f"{_fmt_bytes(float(down[took_part].mean()))} (mean over the {k:,} that took part; "
            f"max {_fmt_bytes(float(up.max()))}, {_fmt_bytes(float(down.max()))}; "
            f"{collectives} {plural})")


PER_NODE_LISTED = 10_000
"""Up to this many nodes, ``summary.json`` lists every node's bytes; a larger population gets
their maximum, mean and the number of clients with any."""


def _per_node(values: Sequence[float]) -> list[float] | dict[str, float]:
    """Per-node byte counters for ``summary.json`` (a list, or statistics past
    :data:`PER_NODE_LISTED` nodes)."""
    if len(values) <= PER_NODE_LISTED:
        return [float(v) for v in values]
    array = np.asarray(values, dtype=np.float64)
    return {"max": float(array.max()), "mean": float(array.mean()),
            "nodes_with_traffic": int(np.count_nonzero(array))}


def world_line(world: dict[str, Any], *, joins: bool = False) -> str:
    """``"3 failures, 3 recoveries (41 MB, 2.1 min), 12 messages lost, 5 stragglers cut"``;
    ``joins``: a population's (its recoveries are clients receiving the global model when
    drawn: ``"190 joins (164 MB, 0.2 s)"``)."""
    c = world
    parts = [f"{c['failures']} failure{'s' * (c['failures'] != 1)}"]
    n = c["recoveries"]
    recovered = (f"{n} join{'s' * (n != 1)}" if joins
                 else f"{n} recover{'ies' if n != 1 else 'y'}")
    if c["recoveries"]:
        recovered += (f" ({_fmt_bytes(c['recovery_bytes'])}, "
                      f"{format_duration(c['recovery_time_s'])})")
    parts.append(recovered)
    parts.append(f"{c['messages_lost']} message{'s' * (c['messages_lost'] != 1)} lost")
    cut = f"{c['stragglers_cut']} straggler{'s' * (c['stragglers_cut'] != 1)} cut"
    if c.get("late_steps"):
        cut += f" ({c['late_steps']} node-steps sat out)"
    parts.append(cut)
    if c.get("quorum_wait_s"):
        parts.append(f"waited {format_duration(c['quorum_wait_s'])} for a quorum")
    return ", ".join(parts)


def _fmt_metric(key: str, value: float) -> str:
    if "accuracy" in key:
        return f"{100 * value:.2f}%"
    return f"{value:.4f}"


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"
