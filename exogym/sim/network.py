"""A simulated network: per-node bandwidth, latency, and the time each collective takes.

A :class:`Network` turns one collective of the communicator's log (``op``, ``S`` = the payload
bytes ONE node contributes, ``N`` nodes) into seconds. Each formula is the classic
latency-bandwidth (alpha-beta) cost of the algorithm, as tabulated by Thakur, Rabenseifner and
Gropp, "Optimization of Collective Communication Operations in MPICH" (IJHPCA 19(1), 2005) and, for
the ring all-reduce, Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations" (JPDC 69(2), 2009). With ``L`` the latency of one hop in seconds and ``B`` the
payload bandwidth in bits per second (``8 S / B`` seconds to move ``S`` bytes):

===============  ===========  =============================================================
collective       algorithm    time
===============  ===========  =============================================================
all_reduce       ``ring``     ``2(N-1)/N * 8S/B + 2(N-1) * L`` (reduce-scatter + all-gather)
all_reduce       ``tree``     ``2 ceil(log2 N) * (8S/B + L)`` (binomial reduce + broadcast)
all_reduce       ``star``     ``2 ((N-1) * 8S/B + L)`` (parameter server on node 0)
all_gather       ``ring``     ``(N-1) * (8S/B + L)``
broadcast        ``star``     ``(N-1) * 8S/B + L`` (the source sends to every other node)
broadcast        ``tree``     ``ceil(log2 N) * (8S/B + L)`` (binomial tree)
===============  ===========  =============================================================

Calibration (every profile's default; measured against real gloo traffic over Linux-shaped
links, ``bench/clock_fidelity.py``): ``B = efficiency * bits/s`` of the link, the payload share of
TCP over Ethernet in a ring, ``1448 / (1514 + 66 / 2) = 0.936`` (:data:`LINK_EFFICIENCY`: 1448
payload bytes per 1514-byte frame, plus half a 66-byte ACK per frame for the incoming stream);
``L = latency_s + hop_latency_s``, the network's one-way latency plus the software latency of one
message hop (:data:`HOP_LATENCY_S`). ``efficiency=1,hop_latency=0s`` gives the bare formulas.

With one node every collective takes 0 s. With per-node bandwidths, every synchronous step of a
ring or tree waits for its slowest transfer, so ``B`` is the slowest link of the run,
``min_i min(up_i, down_i)``; the star algorithms are limited by the centre node's own links and
by the slowest other node (see :func:`star_all_reduce_time`, :func:`star_broadcast_time`).
The network only turns bytes into time: the byte counters of a run are the communicator's
(ring formulas), whatever algorithm is chosen here.

Named profiles (:data:`PROFILES`) and custom networks are parsed from strings, with explicit
units (bits vs bytes, decimal prefixes)::

    parse_network("home-100mbps")
    parse_network("bw=1Gbps,latency=5ms")
    parse_network("home-100mbps,node_speed=1:1:1:0.5")       # node 3 computes at half speed
    parse_network("cloud-10g,bw_sigma=0.5,speed_sigma=0.2,seed=3")   # random heterogeneity
    parse_network("bw=100Mbps,latency=20ms,efficiency=1,hop_latency=0s")  # uncalibrated
    parse_network("mynet.json")               # a network file (``exogym calibrate`` writes one)
    parse_network("mynet.json,latency=20ms")  # a file plus changes, as a profile

A network file is JSON: ``{"format": "exogym-network", "version": 1, "network": {FIELD:
VALUE, ...}}`` with :class:`Network`'s fields (bits/s and seconds; per-node lists as arrays),
plus whatever else its writer keeps beside them (``exogym calibrate``: ``"calibration"``, the
measurements and the fit). :func:`write_network_file` writes one, :func:`load_network_file`
reads one; :meth:`Network.spec` of a loaded network is a full ``key=value`` spec, so a run's
``summary.json`` can be re-costed without the file.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

import torch

__all__ = [
    "COLLECTIVES",
    "PROFILES",
    "Network",
    "collective_time",
    "format_duration",
    "format_rate",
    "load_network_file",
    "parse_duration",
    "parse_network",
    "parse_rate",
    "ring_all_gather_time",
    "ring_all_reduce_time",
    "star_all_reduce_time",
    "star_broadcast_time",
    "tree_all_reduce_time",
    "tree_broadcast_time",
    "write_network_file",
]

Topology = Literal["peer", "server"]
TOPOLOGIES: tuple[str, ...] = ("peer", "server")
AllReduceAlgo = Literal["ring", "tree", "star"]
AllGatherAlgo = Literal["ring"]
BroadcastAlgo = Literal["star", "tree"]
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "star"),
    "all_gather": ("ring",),
    "broadcast": ("star", "tree"),
}
COLLECTIVES = tuple(ALGORITHMS)

# -- units -------------------------------------------------------------------------------------
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BIT_UNITS = ("bps", "bit/s", "b/s")  # lower-case b: bits
_BYTE_UNITS = ("Bps", "B/s", "byte/s")  # upper-case B: bytes
RATE_UNITS = (
    "bps, kbps, Mbps, Gbps, Tbps or bit/s, kbit/s, Mbit/s, Gbit/s, Tbit/s (bits per second); "
    "B/s, kB/s, MB/s, GB/s, TB/s or Bps, kBps, MBps, GBps (bytes per second); "
    "decimal prefixes, k/M/G/T in either case"
)
_DURATION = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0,
             "min": 60.0, "h": 3600.0, "hr": 3600.0, "d": 86400.0, "day": 86400.0,
             "days": 86400.0}
DURATION_UNITS = ", ".join(_DURATION)
_NUMBER_UNIT = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([^\s0-9].*?)?\s*$")


def _split(text: str, what: str, example: str, units: str) -> tuple[float, str]:
    match = _NUMBER_UNIT.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{what} must be a number with a unit, e.g. {example!r}, got {text!r}; "
                         f"units: {units}")
    return float(match.group(1)), match.group(2) or ""


def parse_rate(text: str) -> float:
    """A bandwidth string -> bits per second: ``"100Mbps"`` -> 1e8, ``"1.5GB/s"`` -> 1.2e10.

    The unit is required (a bare number could be bits or bytes). Lower-case ``b`` means bits,
    upper-case ``B`` bytes; prefixes are decimal (``k`` = 1e3 ... ``T`` = 1e12).
    """
    value, unit = _split(text, "a bandwidth", "100Mbps", RATE_UNITS)
    prefix, base = (unit[0], unit[1:]) if unit[:1].lower() in "kmgt" and unit[:1] else ("", unit)
    if base in _BIT_UNITS:
        scale = 1.0
    elif base in _BYTE_UNITS:
        scale = 8.0
    else:
        raise ValueError(f"unknown bandwidth unit {unit!r} in {text!r}; allowed: {RATE_UNITS}")
    rate = value * _PREFIX[prefix.lower()] * scale
    if not math.isfinite(rate):
        raise ValueError(f"a bandwidth must be a finite number of bits or bytes per second, "
                         f"got {text!r}")
    if not rate > 0 or not math.isfinite(rate):
        raise ValueError(f"a bandwidth must be > 0, got {text!r}")
    return rate


def parse_duration(text: str) -> float:
    """A duration string -> seconds: ``"20ms"`` -> 0.02, ``"1.5s"``, ``"10us"``, ``"1min"``.

    The unit is required; allowed: ns, us (or µs), ms, s (sec), min, h (hr), d (day, days).
    """
    value, unit = _split(text, "a duration", "20ms", DURATION_UNITS)
    if not unit:
        raise ValueError(f"a duration needs a unit: {text!r} could be seconds or milliseconds; "
                         f"write e.g. '{text.strip()}ms' or '{text.strip()}s' (units: "
                         f"{DURATION_UNITS})")
    if unit not in _DURATION:
        raise ValueError(f"unknown duration unit {unit!r} in {text!r}; allowed: {DURATION_UNITS}")
    if value < 0:
        raise ValueError(f"a duration must be >= 0, got {text!r}")
    return value * _DURATION[unit]


def format_rate(bps: float) -> str:
    """``1e8`` -> ``"100 Mbit/s"``."""
    for unit, scale in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.4g} {unit}"
    return f"{bps:.4g} bit/s"


def format_duration(seconds: float) -> str:
    """A short human duration: ``1e-5`` -> ``"10 us"``, ``0.56`` -> ``"0.56 s"``,
    ``1120`` -> ``"18.7 min"``, ``30280`` -> ``"505 min (8.4 h)"``, ``630000`` ->
    ``"10,500 min (7.3 days)"``."""
    if seconds == 0:
        return "0 s"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} us"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms" if seconds < 0.1 else f"{seconds:.2g} s"
    if seconds < 60:
        return f"{seconds:.3g} s"
    minutes = seconds / 60
    if minutes < 60:
        return f"{minutes:.3g} min"
    text = f"{minutes:,.0f} min" if minutes >= 100 else f"{minutes:.3g} min"
    hours = minutes / 60
    return f"{text} ({hours:.1f} h)" if hours < 48 else f"{text} ({hours / 24:.1f} days)"


# -- closed forms ------------------------------------------------------------------------------
def _check_args(payload_bytes: float, num_nodes: int) -> None:
    if not payload_bytes >= 0:
        raise ValueError(f"payload_bytes must be >= 0, got {payload_bytes!r}")
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes must be an integer >= 1, got {num_nodes!r}")


def ring_all_reduce_time(payload_bytes: float, num_nodes: int, bps: float, latency: float) -> float:
    """Ring all-reduce: ``2(N-1)/N * 8S/B + 2(N-1) * L``.

    A reduce-scatter then an all-gather, each ``N-1`` steps in which every node sends a chunk of
    ``S/N`` bytes to its neighbour; ``B`` is the slowest link of the ring.
    """
    _check_args(payload_bytes, num_nodes)
    n = num_nodes
    return 2 * (n - 1) * (8 * payload_bytes / n / bps + latency) if n > 1 else 0.0


def tree_all_reduce_time(payload_bytes: float, num_nodes: int, bps: float, latency: float) -> float:
    """Binomial-tree reduce to a root, then binomial-tree broadcast back:
    ``2 ceil(log2 N) * (8S/B + L)``; every round moves the whole payload once per pair."""
    _check_args(payload_bytes, num_nodes)
    rounds = math.ceil(math.log2(num_nodes)) if num_nodes > 1 else 0
    return 2 * rounds * (8 * payload_bytes / bps + latency)


def star_all_reduce_time(
    payload_bytes: float, up: Sequence[float], down: Sequence[float], latency: float
) -> float:
    """Parameter server (star) on node 0: every other node pushes ``S`` bytes, the server
    reduces and sends the result back to each of them.

    Push: ``max((N-1) * 8S / down_0, 8S / min_{i>0} up_i) + L``; pull: ``max((N-1) * 8S / up_0,
    8S / min_{i>0} down_i) + L``. With one bandwidth ``B`` for all: ``2 ((N-1) * 8S/B + L)``.
    """
    _check_args(payload_bytes, len(up))
    n = len(up)
    if n == 1:
        return 0.0
    bits = 8 * payload_bytes
    push = max((n - 1) * bits / down[0], bits / min(up[1:])) + latency
    pull = max((n - 1) * bits / up[0], bits / min(down[1:])) + latency
    return push + pull


def ring_all_gather_time(payload_bytes: float, num_nodes: int, bps: float, latency: float) -> float:
    """Ring all-gather of ``S`` bytes per node: ``(N-1) * (8S/B + L)`` (each of the ``N-1``
    steps forwards one node's ``S`` bytes to the next node)."""
    _check_args(payload_bytes, num_nodes)
    return (num_nodes - 1) * (8 * payload_bytes / bps + latency)


def star_broadcast_time(
    payload_bytes: float, up: Sequence[float], down: Sequence[float], latency: float,
    src: int = 0,
) -> float:
    """Star broadcast from ``src``: ``max((N-1) * 8S / up_src, 8S / min_{i != src} down_i) + L``
    (the source's uplink carries ``N-1`` copies; each receiver gets one)."""
    _check_args(payload_bytes, len(up))
    n = len(up)
    if n == 1:
        return 0.0
    bits = 8 * payload_bytes
    others = [d for i, d in enumerate(down) if i != src]
    return max((n - 1) * bits / up[src], bits / min(others)) + latency


def tree_broadcast_time(payload_bytes: float, num_nodes: int, bps: float, latency: float) -> float:
    """Binomial-tree broadcast: ``ceil(log2 N) * (8S/B + L)`` (the informed nodes double each
    round)."""
    _check_args(payload_bytes, num_nodes)
    rounds = math.ceil(math.log2(num_nodes)) if num_nodes > 1 else 0
    return rounds * (8 * payload_bytes / bps + latency)


# -- calibration -------------------------------------------------------------------------------
# Measured with real gloo processes over links shaped by Linux tbf (bench/clock_fidelity.py;
# docs/benchmarks/clock-fidelity-cpu2-202611.md). Every transfer is TCP over IPv4 over
# Ethernet with the default MTU of 1500 bytes.

#: Payload bytes of a full TCP segment: MTU 1500 - 20 (IPv4 header) - 20 (TCP header) - 12
#: (TCP timestamp option, on by default in Linux).
TCP_PAYLOAD_BYTES = 1448
#: Bytes a link carries for that segment: 1448 + 32 (TCP with timestamps) + 20 (IPv4) + 14
#: (Ethernet header), as a Linux shaper (tbf, htb) or a router's rate limit counts a frame.
TCP_FRAME_BYTES = 1514
#: A pure acknowledgement: 32 (TCP with timestamps) + 20 (IPv4) + 14 (Ethernet).
ACK_FRAME_BYTES = 66
#: Full segments acknowledged per pure ACK (Linux's delayed ACK acknowledges every second one;
#: measured: 1 pure ACK per 2.0 to 2.7 data segments on a ring's uplinks).
SEGMENTS_PER_ACK = 2
#: Fraction of a link's bandwidth that carries payload in a ring collective: every node's uplink
#: carries its outgoing stream's frames and the ACKs of its incoming stream,
#: ``1448 / (1514 + 66 / 2) = 1448 / 1547 = 0.93600``. Measured: each uplink carried 1.063 to
#: 1.069 bytes per payload byte (1 / 0.936 = 1.068), and a loss-free ring all-reduce (TCP Reno,
#: 50 and 100 Mbit/s) took 1.063 to 1.070 times the payload-only formula.
LINK_EFFICIENCY = TCP_PAYLOAD_BYTES / (TCP_FRAME_BYTES + ACK_FRAME_BYTES / SEGMENTS_PER_ACK)
#: Software latency of one message hop of a gloo collective (Python call, hand-off to gloo's
#: worker thread, the kernel's TCP stack on both ends), seconds: a 4-byte ring all-reduce over
#: unshaped links takes ``2(N-1)`` of them (measured at N = 2 and 4).
HOP_LATENCY_S = 150e-6


# -- the network -------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Network:
    """Bandwidth, latency, collective algorithms and per-node heterogeneity of a cluster.

    Attributes:
        name: the profile name (``custom`` for hand-made networks).
        up_bps: upload bandwidth of every node, bits per second.
        down_bps: download bandwidth of every node, bits per second (None: same as ``up_bps``).
        latency_s: one-way latency of one message, seconds (``L`` in the formulas).
        all_reduce: ``ring``, ``tree`` or ``star`` (parameter server on node 0).
        all_gather: ``ring``.
        broadcast: ``star`` (the source sends to each node) or ``tree`` (binomial).
        node_up_bps: per-node upload bandwidths, bits/s (overrides ``up_bps``; length N).
        node_down_bps: per-node download bandwidths, bits/s (overrides ``down_bps``; length N).
        node_speed: per-node relative compute speed (1 = the measured or given step time, 0.5 =
            a node twice as slow); length N.
        bw_sigma: random heterogeneity: node ``i``'s bandwidths are multiplied by
            ``exp(bw_sigma * z_i)``, ``z_i ~ N(0, 1)`` drawn from ``seed`` (a log-normal factor,
            median 1); 0 = none.
        speed_sigma: the same for the compute speed.
        seed: seeds the random factors (``torch.Generator``, never the global RNG).
        efficiency: the fraction of every link's bandwidth that carries payload, in (0, 1]:
            each formula's ``B`` is ``efficiency`` times the link's bits/s (headers and
            acknowledgements take the rest). Default :data:`LINK_EFFICIENCY`, TCP over
            Ethernet in a ring, 0.936; 1 = every bit on the link is payload.
        hop_latency_s: software latency of one message hop, seconds, added to ``latency_s``
            wherever a formula has ``L`` (one per ring step, tree round or star phase). Default
            :data:`HOP_LATENCY_S`, measured with gloo over TCP; 0 = the network's latency only.
        ramp_s: a fixed cost of every collective that moves bulk data, seconds: the time a
            congestion control loses reaching the link's rate at the start of a transfer (a
            line through BBR's 1 and 8 MB all-reduces at 20 Mbit/s on links with no
            propagation delay met ``S = 0`` 3 to 58 ms above the latency, from run to run;
            none with Reno or CUBIC). A collective of ``S`` bytes per node adds ``ramp_s *
            min(1, S / ramp_bytes)``. Default 0: ``exogym calibrate`` fits it where its own
            measurements show one (none of the files measured here did). Collectives only:
            point-to-point transfers (an asynchronous method's push and pull) do not pay it.
        ramp_bytes: the payload per node from which the whole ``ramp_s`` applies (below it, a
            share in proportion); 0 = every collective of more than 0 bytes pays all of it.
        topology: ``"peer"`` (the nodes run their collectives among themselves, with the
            algorithms above) or ``"server"`` (a federated system's: each node sends to and
            receives from a server only, over its own uplink and downlink; the server's link
            is not a bottleneck, as in FLSim and FedScale, unless ``server_bps`` gives it a
            rate; :class:`exogym.sim.clock.SimClock` has the rules). None: the run decides: a
            server for a population (``participation``, ``concurrency``), peers otherwise.
        server_bps: the server's link, bits/s each way (full duplex), shared by the transfers
            in flight through it (:mod:`exogym.sim.server`, :mod:`exogym.sim.sharing`: max-min
            fair, each transfer at most its node's own link); None: no bottleneck. A server's
            setting: it makes the topology ``"server"`` where none is given, and is refused
            with ``"peer"``.
        description: where a profile's numbers come from.
    """

    name: str = "custom"
    up_bps: float
    down_bps: float | None = None
    latency_s: float = 0.0
    all_reduce: AllReduceAlgo = "ring"
    all_gather: AllGatherAlgo = "ring"
    broadcast: BroadcastAlgo = "star"
    node_up_bps: tuple[float, ...] | None = None
    node_down_bps: tuple[float, ...] | None = None
    node_speed: tuple[float, ...] | None = None
    bw_sigma: float = 0.0
    speed_sigma: float = 0.0
    seed: int = 0
    efficiency: float = LINK_EFFICIENCY
    hop_latency_s: float = HOP_LATENCY_S
    ramp_s: float = 0.0
    ramp_bytes: float = 0.0
    topology: Topology | None = None
    server_bps: float | None = None
    description: str = ""

    def __post_init__(self) -> None:
        _positive("up_bps", self.up_bps)
        if self.down_bps is not None:
            _positive("down_bps", self.down_bps)
        if not (isinstance(self.latency_s, (int, float)) and math.isfinite(self.latency_s)
                and self.latency_s >= 0):
            raise ValueError(f"latency_s must be a number >= 0 (seconds), got {self.latency_s!r}")
        if self.topology is not None and self.topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {TOPOLOGIES}, got {self.topology!r}")
        if self.server_bps is not None:
            if isinstance(self.server_bps, bool) or not isinstance(
                    self.server_bps, (int, float)) or not 0 < self.server_bps < math.inf:
                raise ValueError(f"server_bps (the server's link) must be a finite number > 0, "
                                 f"bits per second, got {self.server_bps!r}")
            if self.topology == "peer":
                raise ValueError(f"server_bps ({format_rate(self.server_bps)}, the server's "
                                 "link) needs a server: topology=server, or no topology (a "
                                 "server rate makes it server); got topology=peer, whose nodes "
                                 "talk among themselves")
            object.__setattr__(self, "topology", "server")
        for op, allowed in ALGORITHMS.items():
            if getattr(self, op) not in allowed:
                raise ValueError(f"{op} algorithm must be one of {allowed}, "
                                 f"got {getattr(self, op)!r}")
        for key in ("node_up_bps", "node_down_bps", "node_speed"):
            values = getattr(self, key)
            if values is None:
                continue
            values = tuple(float(v) for v in values)
            if not values or not all(math.isfinite(v) and v > 0 for v in values):
                raise ValueError(f"{key} must be a non-empty list of numbers > 0, got {values!r}")
            object.__setattr__(self, key, values)
        lengths = {len(v) for v in (self.node_up_bps, self.node_down_bps) if v is not None}
        if len(lengths) > 1:
            raise ValueError(f"node_up_bps and node_down_bps must have the same length, got "
                             f"{len(self.node_up_bps or ())} and {len(self.node_down_bps or ())}")
        for key in ("bw_sigma", "speed_sigma"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{key} must be a number >= 0, got {value!r}")
        if self.bw_sigma and (self.node_up_bps or self.node_down_bps):
            raise ValueError("give per-node bandwidths (node_up_bps/node_down_bps) or bw_sigma, "
                             "not both")
        if self.speed_sigma and self.node_speed:
            raise ValueError("give node_speed or speed_sigma, not both")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if isinstance(self.efficiency, bool) or not isinstance(self.efficiency, (int, float)) or (
                not 0 < self.efficiency <= 1):
            raise ValueError(f"efficiency must be a number in (0, 1] (the payload share of a "
                             f"link's bandwidth), got {self.efficiency!r}")
        if isinstance(self.hop_latency_s, bool) or not isinstance(
                self.hop_latency_s, (int, float)) or not (
                math.isfinite(self.hop_latency_s) and self.hop_latency_s >= 0):
            raise ValueError(f"hop_latency_s must be a number >= 0 (seconds), got "
                             f"{self.hop_latency_s!r}")
        for key in ("ramp_s", "ramp_bytes"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value >= 0):
                raise ValueError(f"{key} must be a number >= 0, got {value!r}")

    # -- per-node values -----------------------------------------------------------------------
    def node_bandwidths(self, num_nodes: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """``(up, down)`` bits/s of each of ``num_nodes`` nodes."""
        up = self._per_node("node_up_bps", self.node_up_bps, self.up_bps, num_nodes)
        down = self._per_node("node_down_bps", self.node_down_bps,
                              self.down_bps if self.down_bps is not None else self.up_bps,
                              num_nodes)
        if self.bw_sigma:
            factors = _lognormal(self.bw_sigma, self.seed, 0, num_nodes)
            up = tuple(u * f for u, f in zip(up, factors, strict=True))
            down = tuple(d * f for d, f in zip(down, factors, strict=True))
        return up, down

    def node_speeds(self, num_nodes: int) -> tuple[float, ...]:
        """Relative compute speed of each node (1.0 = nominal)."""
        speeds = self._per_node("node_speed", self.node_speed, 1.0, num_nodes)
        if self.speed_sigma:
            factors = _lognormal(self.speed_sigma, self.seed, 1, num_nodes)
            speeds = tuple(s * f for s, f in zip(speeds, factors, strict=True))
        return speeds

    def check_nodes(self, num_nodes: int) -> None:
        """Raise ValueError, before a run starts, if a per-node list (``node_bw``, ``node_up``,
        ``node_down``, ``node_speed``) does not have one value per node of a ``num_nodes`` run."""
        for key, spec_key in (("node_up_bps", "node_up/node_bw"),
                              ("node_down_bps", "node_down/node_bw"), ("node_speed", "node_speed")):
            values = getattr(self, key)
            if values is not None and len(values) != num_nodes:
                raise ValueError(
                    f"network {spec_key} lists {len(values)} values ({self.spec()}) but the run "
                    f"has {num_nodes} nodes: give exactly one value per node")

    def slowest_link_bps(self, num_nodes: int) -> float:
        """``min_i min(up_i, down_i)``, bits/s: the slowest link of ring and tree algorithms
        (their ``B`` is ``efficiency`` times it)."""
        up, down = self.node_bandwidths(num_nodes)
        return min(min(up), min(down))

    @staticmethod
    def _per_node(key: str, values: tuple[float, ...] | None, default: float,
                  num_nodes: int) -> tuple[float, ...]:
        if values is None:
            return (float(default),) * num_nodes
        if len(values) != num_nodes:
            raise ValueError(f"{key} lists {len(values)} nodes but the run has {num_nodes}")
        return values

    # -- time ----------------------------------------------------------------------------------
    @property
    def message_latency_s(self) -> float:
        """``L``: the latency of one message, ``latency_s + hop_latency_s``."""
        return self.latency_s + self.hop_latency_s

    def transfer_s(self, payload_bytes: float, up_bps: float, down_bps: float) -> float:
        """Seconds for one message of ``payload_bytes`` to pass a sender's uplink ``up_bps`` and
        a receiver's downlink ``down_bps``: ``8S / (efficiency * min(up, down))`` (the link is
        busy that long; the receiver has it ``L`` later)."""
        return 8 * payload_bytes / (self.efficiency * min(up_bps, down_bps))

    def collective_time(self, op: str, payload_bytes: float, num_nodes: int, *,
                        src: int = 0) -> float:
        """Seconds for one collective of ``payload_bytes`` per node over ``num_nodes`` nodes,
        with this network's algorithm for ``op`` (formulas in the module docstring), ``B`` the
        payload rate ``efficiency * bits/s`` and ``L`` the latency ``latency_s +
        hop_latency_s``, plus the ramp (:meth:`ramp_time`)."""
        if op not in ALGORITHMS:
            raise ValueError(f"unknown collective {op!r}; allowed: {', '.join(ALGORITHMS)}")
        _check_args(payload_bytes, num_nodes)
        if num_nodes == 1:
            return 0.0
        return self._formula_time(op, payload_bytes, num_nodes, src) + self.ramp_time(
            payload_bytes)

    def ramp_time(self, payload_bytes: float) -> float:
        """The ramp of a collective of ``payload_bytes`` per node: ``ramp_s * min(1, S /
        ramp_bytes)`` (all of ``ramp_s`` when ``ramp_bytes`` is 0 and ``S > 0``)."""
        if not self.ramp_s or payload_bytes <= 0:
            return 0.0
        if not self.ramp_bytes:
            return self.ramp_s
        return self.ramp_s * min(1.0, payload_bytes / self.ramp_bytes)

    def _formula_time(self, op: str, payload_bytes: float, num_nodes: int, src: int) -> float:
        up, down = self.node_bandwidths(num_nodes)
        up = tuple(u * self.efficiency for u in up)  # payload bits/s
        down = tuple(d * self.efficiency for d in down)
        bps = min(min(up), min(down))
        lat = self.message_latency_s
        algo = getattr(self, op)
        if op == "all_reduce":
            if algo == "ring":
                return ring_all_reduce_time(payload_bytes, num_nodes, bps, lat)
            if algo == "tree":
                return tree_all_reduce_time(payload_bytes, num_nodes, bps, lat)
            return star_all_reduce_time(payload_bytes, up, down, lat)
        if op == "all_gather":
            return ring_all_gather_time(payload_bytes, num_nodes, bps, lat)
        if algo == "tree":
            return tree_broadcast_time(payload_bytes, num_nodes, bps, lat)
        return star_broadcast_time(payload_bytes, up, down, lat, src)

    # -- text ----------------------------------------------------------------------------------
    def describe(self) -> str:
        """``"100 Mbit/s, 20 ms, ring all-reduce"`` (plus heterogeneity, and the efficiency and
        hop latency where they are not the calibrated defaults)."""
        down = self.down_bps if self.down_bps is not None else self.up_bps
        bw = (format_rate(self.up_bps) if down == self.up_bps
              else f"{format_rate(down)} down / {format_rate(self.up_bps)} up")
        parts = [bw, format_duration(self.latency_s), self._describe_topology()]
        if self.node_up_bps or self.node_down_bps or self.bw_sigma:
            parts.append("per-node bandwidth")
        if self.node_speed or self.speed_sigma:
            parts.append("per-node compute speed")
        if self.efficiency != LINK_EFFICIENCY:
            parts.append(f"efficiency {100 * self.efficiency:.4g}%")
        if self.hop_latency_s != HOP_LATENCY_S:
            parts.append(f"hop latency {format_duration(self.hop_latency_s)}")
        if self.ramp_s:
            parts.append(f"ramp {format_duration(self.ramp_s)} per collective"
                         + (f" from {self.ramp_bytes:,.0f} B" if self.ramp_bytes else ""))
        return ", ".join(parts)

    def _describe_topology(self) -> str:
        if self.topology != "server":
            return f"{self.all_reduce} all-reduce"
        if self.server_bps is None:
            return "a server (each node over its own link)"
        return f"a server of {format_rate(self.server_bps)} shared by the transfers in flight"

    def spec(self) -> str:
        """A string that :func:`parse_network` turns back into this network."""
        base = PROFILES.get(self.name)
        if base is not None and replace(base, description=self.description) == self:
            return self.name
        items = [f"name={self.name}", f"up={self.up_bps:g}bps"]
        if self.down_bps is not None:
            items.append(f"down={self.down_bps:g}bps")
        items.append(f"latency={self.latency_s:g}s")
        defaults = {f.name: f.default for f in fields(Network)}
        for key in ("all_reduce", "all_gather", "broadcast", "bw_sigma", "speed_sigma", "seed",
                    "topology"):
            if getattr(self, key) != defaults[key]:
                items.append(f"{key}={getattr(self, key)}")
        if self.efficiency != defaults["efficiency"]:
            items.append(f"efficiency={self.efficiency!r}")  # repr: round-trips exactly
        if self.hop_latency_s != defaults["hop_latency_s"]:
            items.append(f"hop_latency={self.hop_latency_s!r}s")
        if self.ramp_s:
            items.append(f"ramp={self.ramp_s!r}s")
        if self.ramp_bytes:
            items.append(f"ramp_bytes={self.ramp_bytes!r}")
        if self.server_bps is not None:
            items.append(f"server={self.server_bps!r}bps")  # repr: round-trips exactly
        for key, unit in (("node_up_bps", "bps"), ("node_down_bps", "bps"), ("node_speed", "")):
            values = getattr(self, key)
            if values is not None:
                items.append(f"{key.removesuffix('_bps')}=" + ":".join(f"{v:g}{unit}"
                                                                        for v in values))
        return ",".join(items)

    def to_dict(self) -> dict[str, Any]:
        """Every field plus ``spec``, for ``summary.json``."""
        out = asdict(self)
        out["spec"] = self.spec()
        return out


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a number > 0 (bits per second), got {value!r}")


def _lognormal(sigma: float, seed: int, stream: int, n: int) -> tuple[float, ...]:
    gen = torch.Generator().manual_seed(2 * seed + stream)
    z = torch.randn(n, generator=gen, dtype=torch.float64)
    return tuple(float(v) for v in torch.exp(sigma * z))


# -- profiles ------------------------------------------------------------------------------------
PROFILES: dict[str, Network] = {
    "datacenter": Network(
        name="datacenter", up_bps=200e9, latency_s=10e-6,
        description="one 200 Gbit/s NIC per node (InfiniBand HDR / 200 GbE, the EXO Gym post's "
                    "data centre figure), ~10 us one-way latency inside a cluster"),
    "cloud-10g": Network(
        name="cloud-10g", up_bps=10e9, latency_s=100e-6,
        description="cloud VMs in one region: 10 Gbit/s per VM (a common instance network "
                    "limit), ~100 us one-way latency (assumption: same region, TCP)"),
    "home-1gbps": Network(
        name="home-1gbps", up_bps=1e9, latency_s=10e-3,
        description="symmetric 1 Gbit/s fibre at home, ~10 ms one-way latency between peers "
                    "in one region (assumption)"),
    "home-100mbps": Network(
        name="home-100mbps", up_bps=100e6, latency_s=20e-3,
        description="the EXO Gym post's 100 Mbit/s home internet, symmetric, ~20 ms one-way "
                    "latency between peers in one country (assumption)"),
    "mobile": Network(
        name="mobile", up_bps=10e6, down_bps=50e6, latency_s=50e-3,
        description="4G/LTE-class mobile link: 50 Mbit/s down, 10 Mbit/s up, ~50 ms one-way "
                    "latency (assumption, the order of public speed-test medians)"),
}

_SPEC_KEYS = ("name", "bw", "up", "down", "latency", "all_reduce", "all_gather", "broadcast",
              "node_bw", "node_up", "node_down", "node_speed", "bw_sigma", "speed_sigma", "seed",
              "efficiency", "hop_latency", "ramp", "ramp_bytes", "topology", "server")


def parse_network(spec: str | Network | None = None) -> Network:
    """A :class:`Network` from a profile name and/or ``key=value`` items separated by commas.

    ``"home-100mbps"``; ``"bw=1Gbps,latency=5ms"``; ``"home-100mbps,latency=50ms"``.
    Keys: ``bw`` (up and down), ``up``, ``down``, ``latency``, ``all_reduce`` (ring, tree, star),
    ``all_gather`` (ring), ``broadcast`` (star, tree), per-node lists separated by ``:``
    (``node_bw``, ``node_up``, ``node_down`` with units, ``node_speed`` as plain numbers),
    ``bw_sigma``, ``speed_sigma``, ``seed``, ``name``, ``efficiency`` (a plain number in (0, 1])
    and ``hop_latency`` (a duration), ``ramp`` (a duration), ``ramp_bytes`` (a plain number
    of bytes), ``topology`` (peer, server) and ``server`` (the server's link, a bandwidth;
    :class:`Network`). The first item may instead be a network file (a path ending in ``.json``,
    or any existing file: :func:`load_network_file`), changed by the items after it as a profile
    is. None gives ``datacenter``.
    """
    if spec is None:
        return PROFILES["datacenter"]
    if isinstance(spec, Network):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"a network is a profile name or key=value items, got {spec!r}; "
                         f"profiles: {', '.join(PROFILES)}")
    items = [s.strip() for s in spec.split(",") if s.strip()]
    base: Network | None = None
    if "=" not in items[0]:
        name = items.pop(0)
        if name in PROFILES:
            base = PROFILES[name]
        elif name.endswith(".json") or Path(name).is_file():
            base = load_network_file(name)
        else:
            raise ValueError(f"unknown network profile {name!r}; profiles: {', '.join(PROFILES)}"
                             "; or give key=value items such as 'bw=1Gbps,latency=5ms', or a "
                             f"network file (FILE.json){_did_you_mean(name, PROFILES)}")
    values: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep:
            raise ValueError(f"expected key=value in network spec {spec!r}, got {item!r}")
        if key not in _SPEC_KEYS:
            raise ValueError(f"unknown network key {key!r} in {spec!r}; allowed: "
                             f"{', '.join(_SPEC_KEYS)}{_did_you_mean(key, _SPEC_KEYS)}")
        try:
            _parse_item(key, value, values)
        except ValueError as err:  # name the item: "latency=5: a duration needs a unit ..."
            raise ValueError(f"network {key}={value}: {err}") from None
    if base is None:
        if "up_bps" not in values:
            raise ValueError(f"network spec {spec!r} needs a bandwidth (bw=, or up= and down=) "
                             f"or a profile name ({', '.join(PROFILES)})")
        return Network(**values)
    if not values:
        return base
    values.setdefault("name", f"{base.name}+")  # a modified profile is no longer the profile
    return replace(base, **values)


def _did_you_mean(word: str, allowed: Iterable[str]) -> str:
    """`` (did you mean 'X'?)`` with the allowed value closest to a misspelled ``word``, or ``""``
    where none is close (difflib's ratio >= 0.6)."""
    close = difflib.get_close_matches(word, list(allowed), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _parse_item(key: str, value: str, values: dict[str, Any]) -> None:
    """One ``key=value`` item of a network spec into :class:`Network` field values."""
    if key in ("bw", "up"):
        values["up_bps"] = parse_rate(value)
    if key in ("bw", "down"):
        values["down_bps"] = parse_rate(value)
    if key == "latency":
        values["latency_s"] = parse_duration(value)
    if key in ("node_bw", "node_up"):
        values["node_up_bps"] = tuple(parse_rate(v) for v in value.split(":"))
    if key in ("node_bw", "node_down"):
        values["node_down_bps"] = tuple(parse_rate(v) for v in value.split(":"))
    if key == "node_speed":
        values["node_speed"] = tuple(_number(key, v) for v in value.split(":"))
    if key in ("bw_sigma", "speed_sigma", "efficiency"):
        values[key] = _number(key, value)
    if key == "hop_latency":
        values["hop_latency_s"] = parse_duration(value)
    if key == "ramp":
        values["ramp_s"] = parse_duration(value)
    if key == "server":
        values["server_bps"] = parse_rate(value)
    if key == "ramp_bytes":
        values["ramp_bytes"] = _number(key, value)
    if key == "seed":
        try:
            values["seed"] = int(value)
        except ValueError:
            raise ValueError(f"seed takes an integer, got {value!r}") from None
    if key in ("name", "all_reduce", "all_gather", "broadcast", "topology"):
        values[key] = value


def _number(key: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{key} takes a plain number, got {text!r}") from None


def collective_time(op: str, payload_bytes: float, num_nodes: int,
                    network: Network | str | None = None, *, src: int = 0) -> float:
    """Seconds for one collective on ``network`` (default ``datacenter``); see
    :meth:`Network.collective_time`."""
    return parse_network(network).collective_time(op, payload_bytes, num_nodes, src=src)


# -- network files -------------------------------------------------------------------------------
#: The ``format`` of a network file; :data:`NETWORK_FILE_VERSION` its ``version``.
NETWORK_FILE_FORMAT = "exogym-network"
NETWORK_FILE_VERSION = 1
_TUPLE_FIELDS = ("node_up_bps", "node_down_bps", "node_speed")


def write_network_file(path: str | Path, network: Network,
                       extra: dict[str, Any] | None = None) -> Path:
    """Write ``network`` as a network file (JSON) at ``path``; ``extra`` is kept beside it
    (e.g. ``{"calibration": ...}``; its keys must not be ``format``, ``version`` or
    ``network``). Returns the path. :func:`load_network_file` reads it back to an equal
    :class:`Network` (floats are written with Python's round-tripping repr)."""
    extra = dict(extra or {})
    clash = sorted({"format", "version", "network"} & set(extra))
    if clash:
        raise ValueError(f"extra keys {clash} would overwrite the file's own")
    body = {f.name: getattr(network, f.name) for f in fields(Network)}
    for key in _TUPLE_FIELDS:
        if body[key] is not None:
            body[key] = list(body[key])
    out = Path(path)
    out.write_text(json.dumps({"format": NETWORK_FILE_FORMAT, "version": NETWORK_FILE_VERSION,
                               "network": body, **extra}, indent=2) + "\n")
    return out


def load_network_file(path: str | Path) -> Network:
    """The :class:`Network` of a network file (see the module docstring).

    Raises:
        ValueError: the file is missing, is not JSON, is not a network file of a known version,
            or its ``network`` has unknown fields or invalid values (the message names them).
    """
    where = Path(path)
    try:
        data = json.loads(where.read_text())
    except FileNotFoundError:
        raise ValueError(f"network file {str(where)!r} does not exist (a network is a profile "
                         f"name, key=value items, or an existing FILE.json)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"network file {str(where)!r} could not be read as JSON: {err}") from None
    if not isinstance(data, dict) or data.get("format") != NETWORK_FILE_FORMAT:
        raise ValueError(f"{str(where)!r} is not a network file: it needs \"format\": "
                         f"\"{NETWORK_FILE_FORMAT}\" (as `exogym calibrate --out` writes)")
    if data.get("version") != NETWORK_FILE_VERSION:
        raise ValueError(f"network file {str(where)!r} has version {data.get('version')!r}; "
                         f"this exogym reads version {NETWORK_FILE_VERSION}")
    body = data.get("network")
    known = {f.name for f in fields(Network)}
    if not isinstance(body, dict):
        raise ValueError(f"network file {str(where)!r}: \"network\" must be an object of "
                         f"Network fields ({', '.join(sorted(known))})")
    unknown = sorted(set(body) - known)
    if unknown:
        raise ValueError(f"network file {str(where)!r}: unknown fields {unknown}; allowed: "
                         f"{', '.join(sorted(known))}")
    values = {k: (tuple(v) if k in _TUPLE_FIELDS and isinstance(v, list) else v)
              for k, v in body.items()}
    try:
        return Network(**values)
    except (TypeError, ValueError) as err:
        raise ValueError(f"network file {str(where)!r}: {err}") from None
