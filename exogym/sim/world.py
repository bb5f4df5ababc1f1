"""The world a run trains in: how fast each node computes, when it is up, which messages get lost,
and the rules of the run (a quorum).

Its design: docs/design/world.md. A perfect world (the
default, :data:`PERFECT`) has every node up at speed 1 and loses nothing: a run in it gives exactly
the numbers of a run without a world. Any other world changes the training, not only the bill: a
node that is down computes nothing and sends nothing, a lost message is missing from the average,
and the strategies define what that means (each in its module docstring).

Availability is decided per node on the node's own simulated clock (:class:`~exogym.sim.clock.
SimClock`): a node is down at time ``t`` of its clock if

- ``mtbf``/``mttr`` are set and ``t`` falls in one of its down periods: starting up at 0, each
  node alternates up periods ~ Exponential(mean ``mtbf``) and down periods ~ Exponential(mean
  ``mttr``), drawn from a generator seeded by ``(seed, node)`` (a node's draws do not depend on
  N or on the other nodes);
- a trace (``trace:FILE.json``) says it is not in one of its up intervals;
- an explicit event says so: ``fail=NODE@WHEN`` ... ``rejoin=NODE@WHEN``, ``WHEN`` a step of the
  run (``fail=2@300``: from the 300th step on, a 0-based step index) or a simulated time with a
  unit (``fail=2@10min``). Without a ``rejoin`` the node stays down.

Time-based availability is checked when a node is about to start a step: a node that fails
during a step finishes nothing of it (the step is lost with the rest of what it had not sent).

Client session durations ``duration=halfnormal:SD[:MIN]`` (and FLSim's other distributions,
:mod:`exogym.sim.durations`): a population's client trains its round in a drawn number of
seconds, drawn afresh per session, instead of the device's step time.

Message loss ``drop=p``: each node's contribution to each synchronisation is lost independently
with probability ``p``, drawn from a generator seeded by ``(seed, the synchronisation's index)``,
so every process of a multi-process run draws the same.

Trace files (JSON), either exogym's own, with up intervals in seconds per node (``null``: up to
the end of time)::

    {"format": "exogym-availability-v1",
     "nodes": [[[0, 3600], [4200, null]], [[0, null]], ...]}

or FedScale's ``client_behave_trace`` shape, a mapping of client id to ``{"active": [t, ...],
"inactive": [t, ...], "finish_time": T}`` (up from ``active[j]`` to ``inactive[j]``, repeating
with period ``finish_time``, as FedScale's ``ClientSim.is_active`` reads it); clients are taken
in the order of their ids, node ``i`` being the ``i``-th. FedScale ships the trace as a pickle:
load it in Python and ``json.dump`` it (exogym never unpickles a file).

The spec string follows ``--network``'s conventions (comma-separated ``key=value`` items, units
required, a bad item an error listing what is allowed)::

    parse_world("speed=1:1:0.5:0.25,mtbf=30min,mttr=5min,seed=3")
    parse_world("fail=2@300,rejoin=2@700,drop=0.05")
    parse_world("trace:availability.json,min_nodes=2")
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from exogym.sim.availability import Diurnal
from exogym.sim.durations import Durations, parse_durations
from exogym.sim.network import format_duration, parse_duration

__all__ = ["PERFECT", "Event", "Trace", "World", "parse_world", "speeds_of"]

_AVAILABILITY_STREAM = 0xA7A1  # separates the seed streams of availability, loss and speed
_LOSS_STREAM = 0x1055
_SPEED_STREAM = 0x5EED


@dataclass(frozen=True)
class Event:
    """A node fails or rejoins at a step of the run (``step``) or a simulated time (``time_s``)."""

    kind: Literal["fail", "rejoin"]
    node: int
    step: int | None = None
    time_s: float | None = None

    def spec(self) -> str:
        when = str(self.step) if self.step is not None else f"{self.time_s!r}s"
        return f"{self.kind}={self.node}@{when}"


@dataclass(frozen=True)
class Trace:
    """Up intervals per node, seconds (``end`` may be ``inf``), optionally repeating with a
    period (FedScale's ``finish_time``)."""

    up: tuple[tuple[tuple[float, float], ...], ...]
    period_s: tuple[float | None, ...]
    source: str = ""

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read a trace file (exogym's format or FedScale's shape, see the module docstring).

        Raises:
            ValueError: naming the file and what is wrong (unreadable JSON, a bad interval,
                intervals that overlap or are out of order).
        """
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"availability trace {str(path)!r} cannot be read: {err}") from None
        where = f"availability trace {str(path)!r}"
        if isinstance(data, dict) and data.get("format") == "exogym-availability-v1":
            nodes = data.get("nodes")
            if not isinstance(nodes, list) or not nodes:
                raise ValueError(f"{where}: 'nodes' must be a non-empty list (one list of up "
                                 "intervals per node)")
            up = tuple(_intervals(n, f"{where}, node {i}") for i, n in enumerate(nodes))
            return cls(up, (None,) * len(up), str(path))
        if isinstance(data, dict) and data and all(isinstance(v, dict) for v in data.values()):
            clients = sorted(data, key=_client_order)
            up, periods = [], []
            for i, cid in enumerate(clients):
                c = data[cid]
                what = f"{where}, client {cid!r} (node {i})"
                active, inactive = c.get("active"), c.get("inactive")
                if not isinstance(active, list) or not isinstance(inactive, list) or len(
                        active) != len(inactive):
                    raise ValueError(f"{what}: FedScale's shape needs 'active' and 'inactive' "
                                     "lists of the same length")
                period = c.get("finish_time")
                if period is not None and not (isinstance(period, (int, float)) and period > 0):
                    raise ValueError(f"{what}: finish_time must be a number > 0, got {period!r}")
                up.append(_intervals([[a, b] for a, b in zip(active, inactive, strict=True)],
                                     what))
                periods.append(float(period) if period is not None else None)
            return cls(tuple(up), tuple(periods), str(path))
        raise ValueError(f"{where}: expected {{'format': 'exogym-availability-v1', 'nodes': "
                         "[...]}} or FedScale's client_behave_trace shape ({client id: "
                         "{'active': [...], 'inactive': [...], 'finish_time': T}})")

    def is_up(self, node: int, t: float) -> bool:
        """Whether ``node`` is up at ``t``; node ``i`` follows the trace's node ``i mod T`` (a
        population larger than the trace)."""
        node %= len(self.up)
        intervals, period = self.up[node], self.period_s[node]
        if period is not None:
            t = math.fmod(t, period)
        starts = [a for a, _ in intervals]
        k = bisect.bisect_right(starts, t) - 1
        return k >= 0 and t <= intervals[k][1]

    def next_up(self, node: int, t: float) -> float | None:
        """The first time ``>= t`` at which the node is up (None: never)."""
        if self.is_up(node, t):
            return t
        node %= len(self.up)
        intervals, period = self.up[node], self.period_s[node]
        base = 0.0
        if period is not None:
            base = t - math.fmod(t, period)
            t = math.fmod(t, period)
        for a, _b in intervals:
            if a >= t:
                return base + a
        if period is not None and intervals:
            return base + period + intervals[0][0]
        return None


def _client_order(cid: str) -> tuple[int, int | str]:
    return (0, int(cid)) if str(cid).lstrip("-").isdigit() else (1, str(cid))


def _intervals(items: Any, where: str) -> tuple[tuple[float, float], ...]:
    if not isinstance(items, list):
        raise ValueError(f"{where}: a list of [start, end] up intervals, got {items!r}")
    out: list[tuple[float, float]] = []
    for item in items:
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            raise ValueError(f"{where}: an interval is [start, end] in seconds, got {item!r}")
        a, b = item
        b = math.inf if b is None else b
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)) \
                or not (math.isfinite(a) and a >= 0 and b > a):
            raise ValueError(f"{where}: interval {item!r} must have 0 <= start < end (end null "
                             "for 'up to the end')")
        if out and a < out[-1][1]:
            raise ValueError(f"{where}: intervals {list(out[-1])} and {item!r} overlap or are "
                             "out of order (sort them by start, without overlap)")
        out.append((float(a), float(b)))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class World:
    """Per-node speed and availability, message loss and the run's quorum (module docstring).

    Attributes:
        speed: each node's relative compute speed (1 = the measured or given step time, 0.25 =
            four times slower); None: all 1.
        speed_sigma: random spread instead: speeds ``exp(speed_sigma * z)``, ``z ~ N(0, 1)``
            seeded by ``seed``.
        speed_halfnormal: ``(SD, MIN)``: or each node's step takes ``d`` times the step time,
            ``d = MIN + |N(0, SD)|`` seeded by ``seed`` (speed ``1 / d``): FedBuff's client
            training durations (FLSim's ``PerUserHalfNormalDurationDistribution``, its sent140
            configuration: SD 1, MIN 0).
        duration: a population's client sessions last a drawn number of seconds
            (:mod:`exogym.sim.durations`, FLSim's distributions), instead of the step time.
        mtbf_s: mean time between failures (seconds) of every node, exponential draws; with
            ``mttr_s`` (both or neither).
        mttr_s: mean time to repair (seconds) of every node, exponential draws.
        events: explicit failures and rejoins (by step or simulated time).
        trace: per-node up intervals from a file (node ``i`` follows its node ``i mod T``).
        online: a share of the nodes online that follows the simulated day
            (:class:`~exogym.sim.availability.Diurnal`: a volunteer population).
        drop: probability that a node's contribution to a synchronisation is lost.
        min_nodes: the quorum: with fewer nodes up the run waits (its clock advances) until
            enough return.
        max_wait_s: how long the run waits for a quorum before giving up with an error.
        seed: seeds the failures, the losses and ``speed_sigma``.
    """

    speed: tuple[float, ...] | None = None
    speed_sigma: float = 0.0
    speed_halfnormal: tuple[float, float] | None = None
    duration: Durations | None = None
    mtbf_s: float | None = None
    mttr_s: float | None = None
    events: tuple[Event, ...] = ()
    trace: Trace | None = None
    online: Diurnal | None = None
    drop: float = 0.0
    min_nodes: int = 1
    max_wait_s: float = 86400.0
    seed: int = 0
    # Each node's MTBF/MTTR draws so far: (its generator, the times its state flips), drawn
    # lazily and deterministically (a cache: not part of what the world is).
    _draws: dict[int, tuple[np.random.Generator, list[float]]] = field(
        default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.speed is not None:
            values = tuple(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool)
                           else math.nan for v in self.speed)
            if not values or not all(math.isfinite(v) and v > 0 for v in values):
                raise ValueError(f"speed must list numbers > 0 (one per node), got "
                                 f"{self.speed!r}")
            object.__setattr__(self, "speed", values)
        _finite("speed_sigma", self.speed_sigma, 0.0)
        if self.speed is not None and self.speed_sigma:
            raise ValueError("give speed (per node) or speed_sigma (random), not both")
        if self.speed_halfnormal is not None:
            sd, least = self.speed_halfnormal
            _finite("speed=halfnormal SD", sd, 0.0, open_lo=True)
            _finite("speed=halfnormal MIN", least, 0.0)
            if self.speed is not None or self.speed_sigma:
                raise ValueError("give one of speed (per node), speed_sigma and "
                                 "speed=halfnormal:SD[:MIN]")
        if self.duration is not None and (self.speed is not None or self.speed_sigma
                                          or self.speed_halfnormal is not None):
            raise ValueError(f"world duration={self.duration.spec()} draws each client "
                             "session's time, which replaces speeds: give duration= or a "
                             "speed, not both")
        if (self.mtbf_s is None) != (self.mttr_s is None):
            raise ValueError(f"mtbf and mttr go together (the mean up and down durations), got "
                             f"mtbf={self.mtbf_s!r}, mttr={self.mttr_s!r}")
        for name in ("mtbf_s", "mttr_s"):
            value = getattr(self, name)
            if value is not None:
                _finite(name.removesuffix("_s"), value, 0.0, open_lo=True)
        _finite("drop", self.drop, 0.0, 1.0, open_hi=True)
        if isinstance(self.min_nodes, bool) or not isinstance(self.min_nodes, int) \
                or self.min_nodes < 1:
            raise ValueError(f"min_nodes must be an integer >= 1, got {self.min_nodes!r}")
        _finite("max_wait", self.max_wait_s, 0.0, open_lo=True)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        for e in self.events:
            if e.kind not in ("fail", "rejoin") or (e.step is None) == (e.time_s is None):
                raise ValueError(f"bad event {e!r}")
        for e in self.events:  # a rejoin ends a failure given in its own unit (step or time)
            by_step = e.step is not None
            if e.kind == "rejoin" and not any(
                    f.kind == "fail" and f.node == e.node and (f.step is not None) == by_step
                    for f in self.events):
                other = list(dict.fromkeys(f.spec() for f in self.events
                                           if f.kind == "fail" and f.node == e.node))
                raise ValueError(
                    f"{e.spec()} ends no failure of node {e.node} given by "
                    f"{'step' if by_step else 'time'}"
                    + (f" (its failure {', '.join(other)} is by "
                       f"{'time' if by_step else 'step'}: give both as steps or both as "
                       "times)" if other else ""))

    # -- what the run asks -----------------------------------------------------------------
    @property
    def perfect(self) -> bool:
        """Every node up at speed 1, nothing lost: a run gives the numbers of no world."""
        return (self.speed is None or all(s == 1.0 for s in self.speed)) and not (
            self.speed_sigma or self.speed_halfnormal or self.duration or self.mtbf_s
            or self.events
            or self.trace or self.drop or self.online)

    @property
    def availability_varies(self) -> bool:
        """Whether some node is ever down."""
        return bool(self.mtbf_s or self.events or self.trace or self.online)

    @property
    def time_dependent(self) -> bool:
        """Whether who is up depends on simulated time (then re-costing a run on another
        network would change its participants: it needs retraining)."""
        return bool(self.mtbf_s or self.trace or self.online
                    or any(e.time_s is not None for e in self.events))

    def check_nodes(self, num_nodes: int) -> None:
        """Raise ValueError, before a run starts, if a per-node setting does not fit N."""
        if self.speed is not None and len(self.speed) != num_nodes:
            raise ValueError(f"world speed lists {len(self.speed)} values but the run has "
                             f"{num_nodes} nodes: give exactly one value per node")
        for e in self.events:
            if not 0 <= e.node < num_nodes:
                raise ValueError(f"world event {e.spec()} names node {e.node}, but the run's "
                                 f"nodes are 0..{num_nodes - 1}")
        if self.min_nodes > num_nodes:
            raise ValueError(f"min_nodes={self.min_nodes} is more than the run's {num_nodes} "
                             "nodes")

    def speeds(self, num_nodes: int) -> tuple[float, ...]:
        if self.speed is not None:
            return self.speed
        drawn = self.client_speeds(num_nodes)
        if drawn is not None:
            return tuple(float(v) for v in drawn)
        return (1.0,) * num_nodes

    def client_speeds(self, num_nodes: int) -> np.ndarray | None:
        """Every node's speed as one array (a population's clients: built once, vectorized),
        the values of :meth:`speeds`; None when all are 1."""
        if self.speed is None and not self.speed_sigma and self.speed_halfnormal is None:
            return None
        if self.speed is not None:
            return np.asarray(self.speed, dtype=np.float64)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, _SPEED_STREAM]))
        if self.speed_halfnormal is not None:
            sd, least = self.speed_halfnormal
            durations = least + np.abs(sd * rng.standard_normal(num_nodes))
            return 1.0 / np.maximum(durations, 1e-9)
        return np.exp(self.speed_sigma * rng.standard_normal(num_nodes))

    def availability(self, t: float) -> Callable[[np.ndarray], np.ndarray] | None:
        """Which of an array of node ids are up at time ``t`` by the world's availability
        (a trace, ``online``, vectorized; ``mtbf`` failures, each id's own draws): for drawing
        a population's clients without listing them. None: every node is."""
        if self.trace is None and self.online is None and self.mtbf_s is None:
            return None
        trace, online, mtbf = self.trace, self.online, self.mtbf_s is not None

        known: dict[int, bool] = {}  # trace node -> up at t (each tested once per draw)
        every: list[np.ndarray] = []  # all T trace nodes' states, once a draw asks for many

        def traced(nodes: np.ndarray) -> np.ndarray:
            assert trace is not None
            if every:
                return every[0][nodes]
            if len(nodes) > len(trace.up) // 4:  # most of the trace: test every node once
                every.append(np.array([trace.is_up(j, t) for j in range(len(trace.up))]))
                return every[0][nodes]
            for j in set(nodes.tolist()) - set(known):
                known[j] = trace.is_up(j, t)
            return np.array([known[j] for j in nodes.tolist()], dtype=bool)

        def up(ids: np.ndarray) -> np.ndarray:
            ids = np.asarray(ids, dtype=np.int64)
            ok = online.up(ids, t) if online is not None else np.ones(len(ids), dtype=bool)
            if trace is not None and ok.any():
                ok[ok] = traced(ids[ok] % len(trace.up))
            if mtbf and ok.any():
                ok[ok] = [self._next_up_random(int(i), t) == t for i in ids[ok].tolist()]
            return ok

        return up

    def next_availability_change(self, t: float) -> float | None:
        """The first time after ``t`` at which the availability of some node may change: the
        next ``online`` session, the next start or end of a trace interval (None: it never
        changes again)."""
        times = []
        if self.online is not None:
            times.append((math.floor(t / self.online.session_s) + 1) * self.online.session_s)
        if self.trace is not None:
            for intervals, period in zip(self.trace.up, self.trace.period_s, strict=True):
                base, local = (0.0, t) if period is None else (t - math.fmod(t, period),
                                                              math.fmod(t, period))
                edges = [e for a, b in intervals for e in (a, b) if e > local and e != math.inf]
                if edges:
                    times.append(base + min(edges))
                elif period is not None and intervals:
                    times.append(base + period + intervals[0][0])
        return min(times) if times else None

    def is_up(self, node: int, t: float, step: int) -> bool:
        """Whether ``node`` is up when its clock reads ``t`` before step ``step`` (0-based)."""
        return self.next_up(node, t, step) == t

    def next_up(self, node: int, t: float, step: int) -> float | None:
        """The first time ``>= t`` at which ``node`` is up, considering only what time decides
        (a step-based failure holds until its step-based rejoin: then ``t`` if the steps say
        up, else None); None also when time says never."""
        if self._down_by_steps(node, step):
            return None
        u = t
        for _ in range(10_000):  # alternate until every time-based source agrees
            before = u
            u = self._next_up_random(node, u)
            for source in (self.trace, self.online):
                if source is not None:
                    nxt = source.next_up(node, u)
                    if nxt is None:
                        return None
                    u = nxt
            timed = self._next_up_events(node, u)
            if timed is None:
                return None
            u = timed
            if u == before:
                return u
        raise RuntimeError(f"node {node}'s availability does not settle after time {t}")

    def lost(self, index: int, num_nodes: int) -> list[bool]:
        """Which nodes' contributions to synchronisation number ``index`` are lost."""
        if not self.drop:
            return [False] * num_nodes
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, _LOSS_STREAM, index]))
        return [bool(u < self.drop) for u in rng.random(num_nodes)]

    # -- text ------------------------------------------------------------------------------
    def spec(self) -> str:
        """A string :func:`parse_world` turns back into this world (``perfect`` if it is)."""
        items = []
        if self.speed is not None:
            items.append("speed=" + ":".join(f"{v:g}" for v in self.speed))
        if self.speed_sigma:
            items.append(f"speed_sigma={self.speed_sigma:g}")
        if self.speed_halfnormal is not None:
            items.append("speed=halfnormal:{:g}:{:g}".format(*self.speed_halfnormal))
        if self.duration is not None:
            items.append(f"duration={self.duration.spec()}")
        if self.mtbf_s is not None:
            items.append(f"mtbf={self.mtbf_s:g}s,mttr={self.mttr_s:g}s")
        items += [e.spec() for e in self.events]
        if self.trace is not None:
            items.append(f"trace={self.trace.source}")
        if self.online is not None:
            items.append(self.online.spec())
        if self.drop:
            items.append(f"drop={self.drop:g}")
        if self.min_nodes != 1:
            items.append(f"min_nodes={self.min_nodes}")
        if self.max_wait_s != 86400.0:
            items.append(f"max_wait={self.max_wait_s:g}s")
        if self.seed:
            items.append(f"seed={self.seed}")
        return ",".join(items) or "perfect"

    def describe(self) -> str:
        """One line for a run's summary."""
        parts = []
        if self.speed is not None:
            parts.append("speeds " + ":".join(f"{v:g}" for v in self.speed))
        if self.speed_sigma:
            parts.append(f"speed spread {self.speed_sigma:g}")
        if self.speed_halfnormal is not None:
            parts.append("step times {1:g} + |N(0, {0:g})| x the step".format(
                *self.speed_halfnormal))
        if self.duration is not None:
            parts.append(self.duration.describe())
        if self.mtbf_s is not None:
            parts.append(f"MTBF {format_duration(self.mtbf_s)}, MTTR "
                         f"{format_duration(self.mttr_s or 0.0)}")
        if self.events:
            parts.append(", ".join(e.spec() for e in self.events))
        if self.trace is not None:
            parts.append(f"trace {self.trace.source} ({len(self.trace.up):,} nodes; node i "
                         "follows i mod that)")
        if self.online is not None:
            o = self.online
            parts.append(f"{100 * o.low:g}% to {100 * o.high:g}% online over a "
                         f"{format_duration(o.day_s)} day, sessions of "
                         f"{format_duration(o.session_s)}")
        if self.drop:
            parts.append(f"{100 * self.drop:g}% messages lost")
        if self.min_nodes != 1:
            parts.append(f"quorum {self.min_nodes}")
        return "; ".join(parts) or "perfect"

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec(), "perfect": self.perfect, "speed": self.speed,
                "speed_sigma": self.speed_sigma, "speed_halfnormal": self.speed_halfnormal,
                "duration": None if self.duration is None else self.duration.spec(),
                "mtbf_s": self.mtbf_s, "mttr_s": self.mttr_s,
                "events": [e.spec() for e in self.events],
                "trace": self.trace.source if self.trace is not None else None,
                "online": self.online.spec() if self.online is not None else None,
                "drop": self.drop, "min_nodes": self.min_nodes, "max_wait_s": self.max_wait_s,
                "seed": self.seed}

    # -- internals -------------------------------------------------------------------------
    def _down_by_steps(self, node: int, step: int) -> bool:
        down = False
        for e in sorted((e for e in self.events if e.node == node and e.step is not None),
                        key=lambda e: (e.step, e.kind == "fail")):
            assert e.step is not None
            if e.step <= step:
                down = e.kind == "fail"
        return down

    def _next_up_events(self, node: int, t: float) -> float | None:
        """Time-based events: the first time >= t the node is not failed by them."""
        timed = sorted((e for e in self.events if e.node == node and e.time_s is not None),
                       key=lambda e: (e.time_s, e.kind == "fail"))
        down_from = None
        for e in timed:
            assert e.time_s is not None
            if e.kind == "fail" and down_from is None:
                down_from = e.time_s
            elif e.kind == "rejoin" and down_from is not None:
                if down_from <= t < e.time_s:
                    return e.time_s
                down_from = None
        if down_from is not None and t >= down_from:
            return None
        return t

    def _next_up_random(self, node: int, t: float) -> float:
        """MTBF/MTTR draws: the first time >= t the node is up (t itself if up)."""
        if self.mtbf_s is None or self.mttr_s is None:
            return t
        if node not in self._draws:
            self._draws[node] = (np.random.default_rng(
                np.random.SeedSequence([self.seed, _AVAILABILITY_STREAM, node])), [])
        gen, edges = self._draws[node]  # up [0, e0), down [e0, e1), up [e1, e2), ...
        while not edges or edges[-1] <= t:
            last = edges[-1] if edges else 0.0
            mean = self.mtbf_s if len(edges) % 2 == 0 else self.mttr_s
            edges.append(last + float(gen.exponential(mean)))
        k = bisect.bisect_right(edges, t)  # edges[k-1] <= t < edges[k]
        return t if k % 2 == 0 else edges[k]

    def down_periods(self, node: int, until_s: float) -> list[tuple[float, float]]:
        """The MTBF/MTTR down periods of ``node`` that start before ``until_s`` (for logs and
        tests)."""
        if self.mtbf_s is None:
            return []
        self._next_up_random(node, until_s)
        _, edges = self._draws[node]
        return [(edges[k], edges[k + 1]) for k in range(0, len(edges) - 1, 2)
                if edges[k] < until_s]


def _finite(name: str, value: Any, lo: float = -math.inf, hi: float = math.inf, *,
            open_lo: bool = False, open_hi: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > lo if open_lo else value >= lo) and (value < hi if open_hi else
                                                              value <= hi)
    if not ok:
        lb, rb = "(" if open_lo else "[", ")" if open_hi else "]"
        raise ValueError(f"world {name} must be a finite number in {lb}{lo:g}, {hi:g}{rb}, got "
                         f"{value!r}")


_KEYS = ("speed", "speed_sigma", "duration", "mtbf", "mttr", "fail", "rejoin", "trace", "online",
         "day", "session", "drop", "min_nodes", "max_wait", "seed")


def parse_world(spec: str | World | None = None) -> World:
    """A :class:`World` from a spec string (module docstring), ``"perfect"`` or None (perfect),
    or ``"trace:FILE.json[,key=value...]"``.

    Raises:
        ValueError: an unknown key (listing the allowed ones), a bad value, a trace that cannot
            be read.
    """
    if spec is None:
        return PERFECT
    if isinstance(spec, World):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"a world is key=value items or 'perfect', got {spec!r}; keys: "
                         f"{', '.join(_KEYS)}")
    items = [s.strip() for s in spec.split(",") if s.strip()]
    values: dict[str, Any] = {}
    events: list[Event] = []
    for item in items:
        if item == "perfect":
            continue
        if item.startswith("trace:"):
            item = "trace=" + item.removeprefix("trace:")
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep:
            raise ValueError(f"expected key=value in world spec {spec!r}, got {item!r}; keys: "
                             f"{', '.join(_KEYS)}")
        if key not in _KEYS:
            raise ValueError(f"unknown world key {key!r} in {spec!r}; allowed: "
                             f"{', '.join(_KEYS)}")
        try:
            if key in ("fail", "rejoin"):
                events += [_event(key, part) for part in value.split(":")]
                continue
            if key in values:
                raise ValueError("given twice")
            values[key] = _value(key, value)
        except ValueError as err:
            raise ValueError(f"world {key}={value}: {err}") from None
    kwargs: dict[str, Any] = {}
    renames = {"mtbf": "mtbf_s", "mttr": "mttr_s", "max_wait": "max_wait_s"}
    day = {k: values.pop(k) for k in ("online", "day", "session") if k in values}
    if day:
        if "online" not in day:
            raise ValueError(f"world {spec!r}: day= and session= shape online=LOW:HIGH; give it")
        low, high = day["online"]
        kwargs["online"] = Diurnal(low, high, day.get("day", 86400.0),
                                   day.get("session", 3600.0), seed=values.get("seed", 0))
    speed = values.get("speed")
    if speed and speed[0] == "halfnormal":
        kwargs["speed_halfnormal"] = tuple(values.pop("speed")[1:])
    for key, value in values.items():
        kwargs[renames.get(key, key)] = value
    return World(events=tuple(events), **kwargs)


def _value(key: str, text: str) -> Any:
    if key == "speed":
        if text.startswith("halfnormal"):
            parts = text.split(":")[1:]
            if not 1 <= len(parts) <= 2:
                raise ValueError(f"takes halfnormal:SD[:MIN] (step-time multipliers MIN + "
                                 f"|N(0, SD)|), got {text!r}")
            return ("halfnormal", _number(parts[0]), _number(parts[1]) if len(parts) > 1
                    else 0.0)
        return tuple(_number(v) for v in text.split(":"))
    if key in ("speed_sigma", "drop"):
        return _number(text)
    if key == "duration":
        return parse_durations(text)
    if key in ("mtbf", "mttr", "max_wait", "day", "session"):
        return parse_duration(text)
    if key == "online":
        low, sep, high = text.partition(":")
        if not sep:
            raise ValueError(f"takes LOW:HIGH, the shares online at the day's trough and peak "
                             f"(e.g. 0.05:0.3), got {text!r}")
        return (_number(low), _number(high))
    if key in ("min_nodes", "seed"):
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"takes an integer, got {text!r}") from None
    if key == "trace":
        return Trace.load(text)
    raise AssertionError(key)


def _event(kind: str, text: str) -> Event:
    node_text, at, when = text.partition("@")
    try:
        node = int(node_text)
    except ValueError:
        node = -1
    if not at or node < 0:
        raise ValueError(f"expected NODE@STEP or NODE@TIME, e.g. 2@300 or 2@10min, got {text!r}")
    if when.strip().isdigit():
        return Event(kind, node, step=int(when))  # type: ignore[arg-type]
    return Event(kind, node, time_s=parse_duration(when))  # type: ignore[arg-type]


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"takes a plain number, got {text!r}") from None


def speeds_of(world: World, network_speeds: Sequence[float],
              devices: Sequence[float] | None = None) -> tuple[float, ...]:
    """The compute speeds of a run: the world's, or the network's ``node_speed`` (kept for
    compatibility) when the world sets none (both set is an error), times each node's
    device's speed (``devices``, relative to the reference device; None: all 1)."""
    mine = world.speed is not None or world.speed_sigma or world.speed_halfnormal is not None
    theirs = any(s != 1.0 for s in network_speeds)
    if mine and theirs:
        raise ValueError("node speeds are given twice (the world's speed and the network's "
                         "node_speed/speed_sigma): give them once, in --world")
    speeds = world.speeds(len(network_speeds)) if mine else tuple(network_speeds)
    if devices is None:
        return speeds
    return tuple(float(s) * float(d) for s, d in zip(speeds, devices, strict=True))


PERFECT = World()
"""Every node up at speed 1, nothing lost."""
