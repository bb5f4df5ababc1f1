"""Fitting the network model to measured transfers: what ``exogym calibrate`` writes.

Pure arithmetic on measurements (no ``torch.distributed``; the measuring is
:mod:`exogym.run.dist.calibrate`). Two kinds of :class:`Sample`:

- ``pingpong``: rank ``src`` sends ``S`` payload bytes to rank ``dst``, which answers with a
  4-byte message; the round trip is timed on ``src``'s own clock (no clock is shared between
  machines). Model: ``t = 8S / r_ij + 2 m``, ``r_ij`` the payload rate of one stream from ``i``
  to ``j`` and ``m`` the latency of one message (propagation plus both ends' software);
- ``all_reduce``: a ring all-reduce of ``S`` bytes per rank over all ``N`` ranks, the time from
  the last rank's arrival to the result (the clock's definition). Model, the ring formula of
  :mod:`exogym.sim.network`: ``t = 2(N-1)/N * 8S / R + 2(N-1) h``, ``R`` the payload rate the
  ring reaches and ``h`` the latency of one hop.

The fit (:func:`fit_network`), each step a line through the medians of the repeats, its slope
from the largest sizes and its intercept from the smallest (:func:`fit_line`):

1. per directed pair: ``r_ij`` and ``m_ij`` from its ping-pong line;
2. per node, the link rates: the model's per-node ``up_i`` / ``down_j`` with ``r_ij =
   p * min(up_i, down_j)``, ``p = 1448 / 1514`` the payload share of one TCP stream's Ethernet
   frames (:data:`STREAM_EFFICIENCY`; only the product ``p * rate`` is observed, so the rates are
   what the links carry in frames). Estimate: ``up_i = max_j r_ij / p``, ``down_j = max_i r_ij /
   p``, exact when every transfer is limited by one end, as in a star of access links; a node's
   rate above all its peers' is not observable and shows as theirs (a lower bound);
3. the ring: ``R`` and ``h`` from the all-reduce line; ``efficiency = R / min_i min(up_i,
   down_i)`` (or, for a network with one rate for all nodes, ``R / min(median up, median
   down)``, see ``per_node`` of :func:`fit_network`): what the ring reaches of its slowest
   link, which holds the ACKs sharing each uplink, the congestion control (a loss-based one,
   Reno or CUBIC, keeps a link busy; BBR's window, sized from the minimum RTT, leaves part of
   a low-delay link unused) and what the ring loses beyond its slowest link; capped at 1
   (reported);
4. the ramp: where the all-reduce's bandwidth regime (its largest sizes) meets ``S = 0`` above
   the latency ``2(N-1) h``, by more than :data:`RAMP_MIN_SHARE` of its smaller size's time, large
   transfers pay a fixed cost small ones do not: ``ramp_s`` (per collective, from
   ``ramp_bytes``, the smaller of the two sizes; :attr:`~exogym.sim.network.Network.ramp_s`).
   Looked for because BBR's raw all-reduces on low-delay links sometimes show one; none of the
   calibrations of docs/benchmarks/clock-fidelity-cpu2-202611.md found one;
5. latencies: ``latency_s = min(m, h)`` (``m`` the median over pairs) and ``hop_latency_s = h -
   latency_s``, so that ``L = latency + hop_latency = h``, the measured per-hop cost of the
   collective the clock prices most.

:func:`fit_network` returns a :class:`Fit`: the :class:`~exogym.sim.network.Network`, every
fitted number, and every sample's prediction and residual (``(predicted - measured) /
measured``), for the report ``exogym calibrate`` prints and keeps in the network file.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from exogym.sim.network import (
    TCP_FRAME_BYTES,
    TCP_PAYLOAD_BYTES,
    Network,
    format_duration,
    format_rate,
)

__all__ = ["STREAM_EFFICIENCY", "Fit", "Line", "Sample", "fit_line", "fit_network",
           "format_fit"]

#: Payload share of one TCP stream's frames on an Ethernet link (MTU 1500, timestamps):
#: 1448 / 1514. Its ACKs travel the other way, so a one-way transfer reaches this share of the
#: rate with a loss-based congestion control.
STREAM_EFFICIENCY = TCP_PAYLOAD_BYTES / TCP_FRAME_BYTES
#: :func:`fit_line` takes a line's slope from the sizes within this factor of the largest
#: (with ``exogym calibrate``'s sizes, 4x apart: the two largest).
BANDWIDTH_RANGE = 4
#: :func:`fit_network` fits a ramp (:attr:`Network.ramp_s`) when the all-reduce's bandwidth
#: regime meets ``x = 0`` above its latency by this share of the time of its smaller size:
#: beyond the secant's noise (2% of that time for a 1% noise on each of the two sizes, 4x
#: apart).
RAMP_MIN_SHARE = 0.05
#: :func:`fit_network` lists every node's rates when the fastest is this much (relative) above
#: the slowest: beyond the measurements' own spread (a few percent), a slower link.
PER_NODE_SPREAD = 0.10

Op = Literal["pingpong", "all_reduce"]


@dataclass(frozen=True)
class Sample:
    """One measured case: its repeats, seconds each.

    Attributes:
        op: ``pingpong`` (``src`` -> ``dst`` and a 4-byte answer back, timed on ``src``) or
            ``all_reduce`` (ring over all ``nodes`` ranks).
        nodes: ranks in the run (N).
        payload_bytes: ``S``, bytes sent (ping-pong) or contributed by each rank (all-reduce).
        seconds: the repeats' times (the fit takes their median).
        src: the sending rank of a ping-pong (None for an all-reduce).
        dst: its receiving rank (None for an all-reduce).
    """

    op: Op
    nodes: int
    payload_bytes: int
    seconds: tuple[float, ...]
    src: int | None = None
    dst: int | None = None

    def __post_init__(self) -> None:
        if self.op not in ("pingpong", "all_reduce"):
            raise ValueError(f"op must be 'pingpong' or 'all_reduce', got {self.op!r}")
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 2:
            raise ValueError(f"nodes must be an integer >= 2, got {self.nodes!r}")
        if not self.payload_bytes >= 0:
            raise ValueError(f"payload_bytes must be >= 0, got {self.payload_bytes!r}")
        secs = tuple(float(s) for s in self.seconds)
        if not secs or not all(math.isfinite(s) and s > 0 for s in secs):
            raise ValueError(f"seconds must be a non-empty list of times > 0, got {secs!r}")
        object.__setattr__(self, "seconds", secs)
        pair = (self.src, self.dst)
        if self.op == "pingpong":
            if not all(isinstance(r, int) and 0 <= r < self.nodes for r in pair) or (
                    self.src == self.dst):
                raise ValueError(f"a ping-pong needs two different ranks src, dst in [0, "
                                 f"{self.nodes}), got {pair!r}")
        elif pair != (None, None):
            raise ValueError(f"an all-reduce has no src/dst, got {pair!r}")

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def spread(self) -> float:
        """``(max - min) / median`` of the repeats."""
        return (max(self.seconds) - min(self.seconds)) / self.median_s

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["seconds"] = list(self.seconds)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        return cls(**{**data, "seconds": tuple(data["seconds"])})


@dataclass(frozen=True)
class Line:
    """``t = slope * x + intercept`` through ``(x, t)`` points, and which were used.

    Attributes:
        slope: the fitted line's slope (>= 0).
        intercept: its intercept (>= 0).
        kept: for every input point, whether the fit used it (False: a size between the
            regimes, predicted only).
        high_intercept: where the bandwidth regime's line meets ``x = 0``, ``median(t - a
            x)`` over its sizes: above ``intercept`` when large transfers pay a fixed cost that
            small ones do not (a congestion control's ramp).
    """

    slope: float
    intercept: float
    kept: tuple[bool, ...]
    high_intercept: float = 0.0

    def __call__(self, x: float) -> float:
        return self.slope * x + self.intercept


def _theil_sen(xs: Sequence[float], ts: Sequence[float]) -> float:
    """The median of the slopes between every two points of different ``x`` (Theil and Sen):
    one bad point of three moves it less than least squares would."""
    slopes = [(ts[m] - ts[k]) / (xs[m] - xs[k]) for k in range(len(xs))
              for m in range(k + 1, len(xs)) if xs[m] != xs[k]]
    return statistics.median(slopes)


def fit_line(xs: Sequence[float], ts: Sequence[float]) -> Line:
    """``t = a x + b`` in two regimes (Hockney's model): the slope ``a`` from the largest
    transfers, those of at least ``1 /`` :data:`BANDWIDTH_RANGE` of the largest (at least two
    sizes; the Theil-Sen slope), where the link's rate dominates; the intercept ``b`` from the
    smallest, ``median(t - a x)`` at the smallest size (the latency regime). The sizes between
    are predicted, not fitted: there a shaper's bucket, TCP's slow start or its delayed ACKs bend
    the line, which a least-squares fit through every size would pass on to the rate (measured
    on tbf links: a 4-rank ring's rate 7% high). Where the two sizes' times do not grow (noise
    above their difference), the slope is every size's but the smallest's. ``a, b >= 0``.
    Needs 2 or more distinct ``x``."""
    if len(xs) != len(ts) or len(set(xs)) < 2:
        raise ValueError(f"a line needs points at 2 or more different sizes, got x = {list(xs)}")
    if not all(t > 0 for t in ts):
        raise ValueError(f"times must be > 0, got {list(ts)}")
    sizes = sorted(set(xs))
    low = min(sizes[-2], sizes[-1] / BANDWIDTH_RANGE)
    big = [k for k in range(len(xs)) if xs[k] >= low]
    a = _theil_sen([xs[k] for k in big], [ts[k] for k in big])
    if a <= 0 and len(sizes) > 2:  # noise larger than the two sizes' difference: widen
        big = [k for k in range(len(xs)) if xs[k] > sizes[0]]
        a = _theil_sen([xs[k] for k in big], [ts[k] for k in big])
    a = max(a, 0.0)
    small = [k for k in range(len(xs)) if xs[k] == sizes[0] and k not in big]
    high = statistics.median(ts[k] - a * xs[k] for k in big)
    b = max(statistics.median(ts[k] - a * xs[k] for k in small), 0.0) if small else max(high, 0)
    return Line(a, b, tuple(k in big or k in small for k in range(len(xs))), high)


@dataclass(frozen=True)
class Fit:
    """What :func:`fit_network` found.

    Attributes:
        network: the fitted network (per-node rates, efficiency, latencies).
        pair_rate_bps: ``{(i, j): r_ij}``, payload bits/s of one stream ``i -> j``.
        pair_latency_s: ``{(i, j): m_ij}``, one message's latency (half the ping-pong's
            intercept).
        ring_rate_bps: ``R``, payload bits/s of the ring all-reduce.
        hop_s: ``h``, seconds per ring hop.
        raw_efficiency: ``R / slowest link`` before the cap at 1.
        node_up_bps: every node's fitted upload rate (in the network only where it is per
            node).
        node_down_bps: every node's fitted download rate (likewise).
        residuals: per sample, ``(sample, predicted seconds, (predicted - measured) /
            measured, used by the fit)``; a ping-pong is predicted from the node rates
            (``8S / (p min(up_i, down_j)) + 2 m_ij``), an all-reduce by ``network``.
    """

    network: Network
    pair_rate_bps: dict[tuple[int, int], float]
    pair_latency_s: dict[tuple[int, int], float]
    ring_rate_bps: float
    hop_s: float
    raw_efficiency: float
    node_up_bps: tuple[float, ...]
    node_down_bps: tuple[float, ...]
    residuals: list[tuple[Sample, float, float, bool]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: what the network file keeps under ``"calibration"``."""
        return {
            "pair_rate_bps": {f"{i}->{j}": r for (i, j), r in self.pair_rate_bps.items()},
            "pair_latency_s": {f"{i}->{j}": m for (i, j), m in self.pair_latency_s.items()},
            "ring_rate_bps": self.ring_rate_bps, "hop_s": self.hop_s,
            "raw_efficiency": self.raw_efficiency, "node_up_bps": list(self.node_up_bps),
            "node_down_bps": list(self.node_down_bps),
            "samples": [{**s.to_dict(), "median_s": s.median_s, "predicted_s": p,
                         "residual": r, "used": u} for s, p, r, u in self.residuals],
        }


def _sig(value: float, digits: int = 6) -> float:
    """``value`` to ``digits`` significant digits: what :meth:`Network.spec` writes (``:g``),
    so that a run's recorded spec re-parses to exactly the fitted network."""
    return float(f"{value:.{digits}g}")


def _pair_lines(samples: Sequence[Sample]) -> dict[tuple[int, int], tuple[Line, list[Sample]]]:
    pairs: dict[tuple[int, int], list[Sample]] = {}
    for s in samples:
        if s.op == "pingpong":
            pairs.setdefault((s.src, s.dst), []).append(s)  # type: ignore[arg-type]
    out = {}
    for pair, group in sorted(pairs.items()):
        group.sort(key=lambda s: s.payload_bytes)
        out[pair] = (fit_line([s.payload_bytes for s in group], [s.median_s for s in group]),
                     group)
    return out


def fit_network(samples: Sequence[Sample], *, name: str = "calibrated",
                description: str = "", per_node: bool | None = None) -> Fit:
    """Fit the network model to ``samples`` (see the module docstring for the steps).

    ``per_node``: True writes every node's rates (``node_up_bps``, ``node_down_bps``: the
    network then fits runs of exactly ``N`` nodes); False one upload and one download rate for
    all, the medians over the nodes, with the efficiency relative to them (the ring's measured
    rate is kept, and the network fits runs of any size); None (default): per node when the
    nodes' rates differ by more than :data:`PER_NODE_SPREAD`.

    Needs, for one ``N``: an all-reduce at 2 or more sizes, and a ping-pong at 2 or more sizes
    for every ordered pair of ranks (``N (N-1)`` pairs), so that every node's upload and
    download is seen.

    Raises:
        ValueError: samples of different ``N``, or a pair or the all-reduce missing.
    """
    sizes = {s.nodes for s in samples}
    if len(sizes) != 1:
        raise ValueError(f"the samples must come from one run of N ranks, got N = {sorted(sizes)}")
    n = sizes.pop()
    lines = _pair_lines(samples)
    missing = [(i, j) for i in range(n) for j in range(n) if i != j and (i, j) not in lines]
    if missing:
        raise ValueError(f"no ping-pong measured for the rank pairs {missing}: every ordered "
                         f"pair of the {n} ranks is needed to see each node's up and down link")
    ring = sorted((s for s in samples if s.op == "all_reduce"), key=lambda s: s.payload_bytes)
    if len({s.payload_bytes for s in ring}) < 2:
        raise ValueError("the all-reduce must be measured at 2 or more sizes")
    rate = {p: 8.0 / line.slope if line.slope > 0 else math.inf
            for p, (line, _) in lines.items()}
    if not all(math.isfinite(r) for r in rate.values()):
        bad = [p for p, r in rate.items() if not math.isfinite(r)]
        raise ValueError(f"the ping-pong times of pairs {bad} do not grow with the size: measure "
                         "larger transfers (a higher --target-time)")
    msg = {p: line.intercept / 2 for p, (line, _) in lines.items()}
    up = tuple(_sig(max(rate[(i, j)] for j in range(n) if j != i) / STREAM_EFFICIENCY)
               for i in range(n))
    down = tuple(_sig(max(rate[(i, j)] for i in range(n) if i != j) / STREAM_EFFICIENCY)
                 for j in range(n))
    ring_line = fit_line([s.payload_bytes for s in ring], [s.median_s for s in ring])
    if ring_line.slope <= 0:
        raise ValueError("the all-reduce times do not grow with the size: measure larger "
                         "transfers (a higher --target-time)")
    ring_rate = 8.0 * 2 * (n - 1) / n / ring_line.slope
    hop = ring_line.intercept / (2 * (n - 1))
    big = [s for s, used in zip(ring, ring_line.kept, strict=True)
           if used and s.payload_bytes > ring[0].payload_bytes]
    big_sizes = sorted({s.payload_bytes for s in big})
    ramp = ring_line.high_intercept - ring_line.intercept
    if not big or ramp <= RAMP_MIN_SHARE * min(s.median_s for s in big):
        ramp = 0.0
    if per_node is None:
        per_node = max(*up, *down) / min(*up, *down) > 1 + PER_NODE_SPREAD
    if per_node:
        raw_eff = ring_rate / min(min(up), min(down))
        rates: dict[str, Any] = {"up_bps": min(up), "down_bps": min(down), "node_up_bps": up,
                                 "node_down_bps": down}
    else:
        med_up, med_down = _sig(statistics.median(up)), _sig(statistics.median(down))
        raw_eff = ring_rate / min(med_up, med_down)
        rates = {"up_bps": med_up, "down_bps": med_down}
    latency = _sig(min(statistics.median(msg.values()), hop))
    net = Network(name=name, **rates, latency_s=latency, efficiency=min(raw_eff, 1.0),
                  hop_latency_s=max(_sig(hop) - latency, 0.0), ramp_s=_sig(ramp),
                  ramp_bytes=float(big_sizes[0]) if ramp else 0.0,  # a ramp: big sizes
                  description=description)
    residuals = []
    for line, group in lines.values():
        for s, used in zip(group, line.kept, strict=True):
            pred = (8 * s.payload_bytes / (STREAM_EFFICIENCY * min(up[s.src], down[s.dst]))
                    + 2 * msg[(s.src, s.dst)])  # type: ignore[index]
            residuals.append((s, pred, (pred - s.median_s) / s.median_s, used))
    for s, used in zip(ring, ring_line.kept, strict=True):
        pred = net.collective_time("all_reduce", s.payload_bytes, n)
        residuals.append((s, pred, (pred - s.median_s) / s.median_s, used))
    return Fit(network=net, pair_rate_bps=rate, pair_latency_s=msg, ring_rate_bps=ring_rate,
               hop_s=hop, raw_efficiency=raw_eff, node_up_bps=up, node_down_bps=down,
               residuals=residuals)


def format_fit(fit: Fit) -> str:
    """The report ``exogym calibrate`` prints: the fitted parameters, each ping-pong pair's
    rate, message latency and worst residual, and every all-reduce size with its prediction and
    residual (``*``: a size between the regimes, predicted, not fitted)."""
    net = fit.network
    lines = ["fitted network: " + net.describe(),
             f"  {'node':>4}  {'up':>13}  {'down':>13}   (link rates, in frames)",
             *(f"  {i:>4}  {format_rate(u):>13}  {format_rate(d):>13}"
               for i, (u, d) in enumerate(zip(fit.node_up_bps, fit.node_down_bps,
                                              strict=True))),
             "  the file lists every node (runs of exactly this N)" if net.node_up_bps else
             "  the file has one rate for all nodes, the medians (runs of any N)",
             f"  ring all-reduce: {format_rate(fit.ring_rate_bps)} of payload = efficiency "
             f"{fit.raw_efficiency:.4f} x "
             + ("the slowest link" if net.node_up_bps else "min(up, down)")
             + (" (capped at 1)" if fit.raw_efficiency > 1 else ""),
             f"  per hop {format_duration(fit.hop_s)} = latency {format_duration(net.latency_s)}"
             f" + hop latency {format_duration(net.hop_latency_s)}",
             f"  ramp: {format_duration(net.ramp_s)} per collective from {net.ramp_bytes:,.0f} "
             "bytes per node" if net.ramp_s else "  ramp: none (large transfers pay no fixed "
             "cost beyond the latency)",
             "", f"{'ping-pong':<10} {'payload rate':>13} {'message':>9} {'sizes':>6} "
                 f"{'spread':>7} {'worst residual':>15}"]
    pairs: dict[tuple[int, int], list[tuple[Sample, float, float, bool]]] = {}
    for row in fit.residuals:
        if row[0].op == "pingpong":
            pairs.setdefault((row[0].src, row[0].dst), []).append(row)  # type: ignore[arg-type]
    for (i, j), rows in pairs.items():
        worst = max((r for _, _, r, _ in rows), key=abs)
        lines.append(f"{f'{i} -> {j}':<10} {format_rate(fit.pair_rate_bps[(i, j)]):>13} "
                     f"{format_duration(fit.pair_latency_s[(i, j)]):>9} {len(rows):>6} "
                     f"{100 * max(s.spread for s, *_ in rows):>6.1f}% {100 * worst:>+14.2f}%")
    lines += ["", f"{'all-reduce':<10} {'bytes':>13} {'measured':>10} {'spread':>7} "
                  f"{'predicted':>10} {'residual':>9}"]
    for s, pred, res, used in fit.residuals:
        if s.op == "all_reduce":
            lines.append(f"{f'N = {s.nodes}':<10} {s.payload_bytes:>13,} "
                         f"{format_duration(s.median_s):>10} {100 * s.spread:>6.1f}% "
                         f"{format_duration(pred):>10} {100 * res:>+8.2f}%"
                         + ("" if used else " *"))
    worst = max((abs(r) for _, _, r, _ in fit.residuals), default=0.0)
    lines.append(f"worst residual: {100 * worst:.2f}% (* predicted, not fitted: a size between "
                 "the latency and the bandwidth regimes)")
    return "\n".join(lines)
