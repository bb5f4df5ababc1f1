#!/usr/bin/env python
"""The simulated clock against real gloo traffic over shaped links (issue 17).

One Linux network namespace per node, all joined by one bridge, every node's link shaped with
``tc ... tbf`` in both directions (its upload: the namespace side of its veth pair; its download:
the bridge side). Real gloo processes, one per namespace, started with torchrun's environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``; ``LOCAL_WORLD_SIZE``
1, see :func:`worker_env`), then, for every N and rate:

(0) **calibration**: ``exogym calibrate`` on the shaped links, one rank per namespace as a run's
    (``--cal-reps``, ``--cal-target``; ``--no-calibrate`` skips it): the network file it writes
    is the third prediction of every row below, "calibrated", beside "before" (the model
    before issue 17) and "after" (the presets' calibrated defaults, ``bw=RATE,latency=0s``);
(a) **raw all-reduces**: fp32 tensors of each ``--sizes`` MB (1 MB = 1e6 bytes), ``--reps``
    timed repetitions after one warm-up; predicted = :meth:`exogym.sim.network.Network.
    collective_time` of the same bytes and N;
(b) **end-to-end runs**: ``exogym run --task mnist --strategy ddp|diloco --nodes N`` (N ranks,
    one node each, gloo), ``--steps`` steps; predicted = the run's own ``sim_comm_s``
    (``summary.json``), the clock of ``--network FILE`` (the calibrated file; without
    calibration the network ``bw=RATE,latency=0s``), and its trace re-costed on the other
    networks with the same measured compute.

How communication is measured. All processes run on one machine, so ``time.monotonic`` is one
clock for all of them (network namespaces do not change it). Every rank records when it enters
and leaves each collective; the collective's communication time is ``mean_r(leave_r) -
max_r(enter_r)``: from the moment the last rank joins to when the ranks have the result. That is
the clock's definition (:mod:`exogym.sim.clock`: a blocking collective starts when the last node
arrives; waiting for that node is *idle*, not communication). In the end-to-end runs each rank
times the communicator's hooks (``DistributedCommunicator._all_reduce`` / ``_all_gather`` /
``_broadcast``: exactly the collectives of the run's log, one hook call per record; evaluation
traffic is not in the log and not timed) by wrapping them before calling ``exogym.cli.main``,
the code path of ``python -m exogym run``; the measured communication of the run is the sum over
its collectives. Each run also gives a **total** row: the wall time of its training steps on
rank 0 (evaluation excluded: ``train_time_s``) against the clock's total (``sim_time_s``:
compute + communication + idle, with the compute measured from the run's own steps, per rank,
on the cores each rank's machine has: ``EXOGYM_CORES``, see :func:`worker_env`); its "before"
re-costs the run on the uncalibrated network with the compute of the eval-mode probe the clock
used before (measured on rank 0 after the run).

Shaping: ``tbf rate R burst B limit Q`` on both ends of each veth pair (:func:`tbf_args`: a
bucket of 2 ms and a queue of 50 ms of traffic, ``--burst`` / ``--queue``). tbf counts every byte
of a frame as the kernel hands it to the device, the 14-byte Ethernet header included (no
preamble or FCS: a veth has none), so a TCP stream's payload rate is at most ``1448 / 1514`` of
``R``; the table's notes give what each uplink carried per payload byte (``wire/payload``), its
packets per MB and the packets the queues dropped. The links add no delay (``netem`` is not
available everywhere; no WAN latency is emulated). Only the namespaces this script creates and
loopback carry traffic: the bridge has no address in the root namespace and nothing routes to it.

TCP congestion control: ``--cc reno`` by default, set inside the namespaces only (a
per-namespace sysctl). Reno is loss-based like Linux's default CUBIC: it keeps a link busy.
A namespace may select only what the host's ``net.ipv4.tcp_allowed_congestion_control`` lists
(a host-wide list): the script stops and says how to allow ``cubic`` when it is missing.
BBR (``--cc bbr``, or ``--cc default`` on a host that defaults to it) paces at its estimate of
the bottleneck and, on links with no propagation delay whose ACKs queue behind the reverse
direction's data (every link of a ring), leaves 2 to 15% of the rate unused; measure both where
it matters, and calibrate (0) with the congestion control the cluster runs.

Everything it creates is named with the prefix ``exg-`` and a per-run tag (``exg-1a2b-br``,
``exg-1a2b-n0``, ``exg-1a2b-h0``) and removed by name at the end, on an exception, on Ctrl-C and
on SIGTERM/SIGHUP; ``--cleanup`` removes what a killed run (SIGKILL) left behind. Needs root and
iproute2 (``ip``, ``tc``) with the ``tbf`` qdisc.

Usage (the virtual environment's python, as root)::

    sudo -E "$(command -v python)" bench/clock_fidelity.py --rates 20,100 --nodes 2,4 \\
        --sizes 1,8,32 --e2e ddp,diloco --steps 60 --json clock_fidelity.json
    sudo -E "$(command -v python)" bench/clock_fidelity.py --cc cubic --sizes 1,8 \\
        --json cubic.json                              # calibrate, then predict, under CUBIC
    sudo -E "$(command -v python)" bench/clock_fidelity.py --cc bbr --e2e none   # BBR, raw only
    sudo -E "$(command -v python)" bench/clock_fidelity.py --cleanup

The pure parts (commands for a topology and rate, parsers, error arithmetic, tables) are plain
functions, tested without root in ``tests/project/test_clock_fidelity.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, astuple, dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "exg-"
#: The private /24 of the namespaces (node i has SUBNET.(i+1)); never routed from the root one.
SUBNET = "10.213.47"
#: The interface name inside every namespace (names are per namespace, so one name for all).
NS_IFNAME = "exg0"
#: Rank 0's rendezvous port, inside namespace 0 (its own port space: no clash with the host).
MASTER_PORT = 29517
#: Ethernet frame bytes that tbf counts for a full TCP segment: 1448 payload + 32 TCP (20 +
#: 12 timestamp option) + 20 IPv4 + 14 Ethernet header.
FRAME_BYTES = 1514
#: tbf's bucket, seconds of traffic at its rate (at least two full frames): the most a link
#: sends above its rate after an idle moment. tbf waits for tokens with a kernel timer; a bucket
#: of two frames loses rate whenever the timer fires late (measured: 2 to 3% at 100 Mbit/s on a
#: busy 2-core machine), 2 ms absorbs that and changes no transfer here by more than 2 ms.
BURST_S = 0.002
#: Queue of each tbf, seconds of traffic at its rate (``limit = rate * QUEUE_S / 8`` bytes):
#: a home router's buffer is tens of milliseconds deep; 50 ms here.
QUEUE_S = 0.05
MB = 1e6


# -- topology and commands (pure) ------------------------------------------------------------------
@dataclass(frozen=True)
class Topology:
    """The names and addresses of one run's namespaces, veths and bridge.

    Attributes:
        tag: a short per-run tag (4 hex digits); every name starts with ``exg-TAG-``.
        num_nodes: namespaces ``exg-TAG-n0`` ... (one per node), veths ``exg-TAG-h0`` ... on the
            bridge ``exg-TAG-br``; the namespace side of each veth is ``exg0``.
    """

    tag: str
    num_nodes: int

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[0-9a-f]{4}", self.tag):
            raise ValueError(f"tag must be 4 lower-case hex digits, got {self.tag!r}")
        if isinstance(self.num_nodes, bool) or not isinstance(self.num_nodes, int) or not (
                1 <= self.num_nodes <= 200):
            raise ValueError(f"num_nodes must be an integer in [1, 200], got {self.num_nodes!r}")

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.tag}-br"

    def namespace(self, i: int) -> str:
        return f"{PREFIX}{self.tag}-n{i}"

    def host_veth(self, i: int) -> str:
        """The bridge side of node ``i``'s link (its egress is the node's download)."""
        return f"{PREFIX}{self.tag}-h{i}"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"


def setup_commands(topo: Topology) -> list[list[str]]:
    """The ``ip`` commands that build the bridge, the namespaces and their links, in order."""
    cmds = [["ip", "link", "add", topo.bridge, "type", "bridge"],
            ["ip", "link", "set", topo.bridge, "up"]]
    for i in range(topo.num_nodes):
        ns, host = topo.namespace(i), topo.host_veth(i)
        cmds += [
            ["ip", "netns", "add", ns],
            ["ip", "link", "add", host, "type", "veth", "peer", "name", NS_IFNAME, "netns", ns],
            ["ip", "link", "set", host, "master", topo.bridge],
            ["ip", "link", "set", host, "up"],
            ["ip", "-n", ns, "addr", "add", f"{topo.address(i)}/24", "dev", NS_IFNAME],
            ["ip", "-n", ns, "link", "set", NS_IFNAME, "up"],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
        ]
    return cmds


def tbf_args(rate_bps: float, burst_s: float = BURST_S, queue_s: float = QUEUE_S) -> list[str]:
    """``tbf`` arguments for ``rate_bps``: ``rate R burst B limit Q``, ``B`` = ``burst_s`` of
    traffic (at least two frames), ``Q`` = ``queue_s`` of traffic (at least 4 B). 20 Mbit/s ->
    ``rate 20000000bit burst 5000 limit 125000``."""
    if not (math.isfinite(rate_bps) and rate_bps > 0):
        raise ValueError(f"rate_bps must be a number > 0, got {rate_bps!r}")
    for name, value in (("burst_s", burst_s), ("queue_s", queue_s)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
    burst = max(round(rate_bps * burst_s / 8), 2 * FRAME_BYTES)
    limit = max(round(rate_bps * queue_s / 8), 4 * burst)
    return ["rate", f"{round(rate_bps)}bit", "burst", str(burst), "limit", str(limit)]


def shaping_commands(topo: Topology, rate_bps: float | None, burst_s: float = BURST_S,
                     queue_s: float = QUEUE_S) -> list[list[str]]:
    """``tc`` commands that shape both directions of every node's link to ``rate_bps`` (replacing
    any earlier shaping; :func:`tbf_args`), or, with None, remove the shaping (the kernel's
    default qdisc)."""
    cmds = []
    for i in range(topo.num_nodes):
        up = ["ip", "netns", "exec", topo.namespace(i), "tc", "qdisc"]
        down = ["tc", "qdisc"]
        for base, dev in ((up, NS_IFNAME), (down, topo.host_veth(i))):
            if rate_bps is None:
                cmds.append([*base, "del", "dev", dev, "root"])
            else:
                cmds.append([*base, "replace", "dev", dev, "root", "tbf",
                             *tbf_args(rate_bps, burst_s, queue_s)])
    return cmds


def stats_commands(topo: Topology, i: int) -> tuple[list[str], list[str]]:
    """``(uplink, downlink)`` ``tc -s qdisc show`` commands of node ``i``'s link."""
    return (["ip", "netns", "exec", topo.namespace(i), "tc", "-s", "qdisc", "show", "dev",
             NS_IFNAME],
            ["tc", "-s", "qdisc", "show", "dev", topo.host_veth(i)])


def cc_commands(topo: Topology, cc: str | None) -> list[list[str]]:
    """Set TCP congestion control ``cc`` inside every namespace (a per-namespace sysctl: the
    host's own setting is untouched); None: keep the namespaces' default."""
    if cc is None:
        return []
    if not re.fullmatch(r"[a-z0-9_]+", cc):
        raise ValueError(f"a congestion control is a lower-case name such as reno, cubic or bbr, "
                         f"got {cc!r}")
    return [["ip", "netns", "exec", topo.namespace(i), "sysctl", "-q", "-w",
             f"net.ipv4.tcp_congestion_control={cc}"] for i in range(topo.num_nodes)]


def cc_problem(cc: str | None, allowed: str, available: str) -> str | None:
    """Why the namespaces cannot use congestion control ``cc``, or None. ``allowed`` and
    ``available`` are the host's ``net.ipv4.tcp_allowed_congestion_control`` and
    ``tcp_available_congestion_control``: a namespace may select only an allowed one (the
    list is the host's, not per namespace)."""
    if cc is None or cc in allowed.split():
        return None
    if cc not in available.split():
        return (f"TCP congestion control {cc!r} is not available on this host ({available.strip()}"
                f"): load its module (modprobe tcp_{cc})")
    return (f"the namespaces may not select {cc!r}: the host allows only {allowed.strip()!r}. "
            f"Allow it (as root): sysctl -w net.ipv4.tcp_allowed_congestion_control="
            f"\"{allowed.strip()} {cc}\"")


def worker_env(topo: Topology, rank: int, num_nodes: int,
               base: dict[str, str] | None = None, cores: int | None = None) -> dict[str, str]:
    """The environment of rank ``rank``: torchrun's rendezvous variables, gloo bound to the
    namespace's interface, one intra-op thread (N processes share the cores).

    ``LOCAL_WORLD_SIZE`` is 1: each namespace stands for a machine of its own. Some gloo builds
    reduce through shared memory instead of the network when ``LOCAL_WORLD_SIZE`` equals the
    world size (all ranks on one host), which would bypass the shaped links entirely.

    ``EXOGYM_CORES``: the machine a rank stands for has ``min(1, cores / N)`` cores, where
    ``cores`` (default: the cores this process may run on) are shared by the N ranks (two
    cores and N = 4: half a core each; the ranks compute at the same time in both strategies
    here, each at half speed). Without it the clock priced a rank's step at its CPU time on a
    core of its own, and DiLoCo's N = 4 totals read 36 to 41% short."""
    if cores is None:
        cores = len(os.sched_getaffinity(0))
    env = dict(os.environ if base is None else base)
    env.update({"RANK": str(rank), "WORLD_SIZE": str(num_nodes), "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": topo.address(0),
                "MASTER_PORT": str(MASTER_PORT), "GLOO_SOCKET_IFNAME": NS_IFNAME,
                "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                "EXOGYM_CORES": f"{min(1.0, cores / num_nodes):.6g}"})
    return env


def teardown_commands(topo: Topology) -> list[list[str]]:
    """Commands that delete, by name, everything :func:`setup_commands` creates. Deleting a
    namespace deletes the veth pair with it; the host side is deleted too in case its namespace
    was never made."""
    cmds = [["ip", "netns", "del", topo.namespace(i)] for i in range(topo.num_nodes)]
    cmds += [["ip", "link", "del", topo.host_veth(i)] for i in range(topo.num_nodes)]
    return [*cmds, ["ip", "link", "del", topo.bridge]]


def leftovers(netns_list: str, link_list: str, prefix: str = PREFIX) -> tuple[list[str],
                                                                               list[str]]:
    """``(namespaces, links)`` named ``prefix...`` in the output of ``ip netns list`` and
    ``ip -o link show`` (``"7: exg-1a2b-h0@if2: <...>"``: the name before ``@`` or ``:``)."""
    spaces = [line.split()[0] for line in netns_list.splitlines()
              if line.strip() and line.split()[0].startswith(prefix)]
    links = []
    for line in link_list.splitlines():
        match = re.match(r"^\s*\d+:\s+([^:@\s]+)", line)
        if match and match.group(1).startswith(prefix):
            links.append(match.group(1))
    return spaces, links


def cleanup_commands(spaces: Sequence[str], links: Sequence[str]) -> list[list[str]]:
    """Delete the namespaces first (their veths go with them), then the other links; bridges
    last, so that no port is left on a bridge being deleted."""
    bridges = [name for name in links if name.endswith("-br")]
    others = [name for name in links if name not in bridges]
    return ([["ip", "netns", "del", ns] for ns in spaces]
            + [["ip", "link", "del", name] for name in [*others, *bridges]])


@dataclass(frozen=True)
class QdiscStats:
    """Counters of one qdisc (``tc -s qdisc show``): bytes and packets sent, packets dropped,
    times it was over its rate."""

    sent_bytes: int
    sent_packets: int
    dropped: int
    overlimits: int

    def __sub__(self, other: QdiscStats) -> QdiscStats:
        return QdiscStats(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))


def parse_qdisc_stats(text: str) -> QdiscStats:
    """The first ``Sent B bytes P pkt (dropped D, overlimits O ...)`` line of ``tc -s qdisc``."""
    match = re.search(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)", text)
    if match is None:
        raise ValueError(f"no 'Sent ... bytes ... pkt (dropped ..., overlimits ...' in tc output "
                         f"{text[:200]!r}")
    return QdiscStats(*(int(g) for g in match.groups()))


# -- measurement arithmetic (pure) -----------------------------------------------------------------
def collective_seconds(enters: Sequence[Sequence[float]], leaves: Sequence[Sequence[float]]
                       ) -> list[float]:
    """Communication time of each collective from every rank's enter/leave times:
    ``mean_r(leave[r][k]) - max_r(enter[r][k])`` (``enters[r][k]``: rank ``r``, collective
    ``k``). Every rank must have timed the same number of collectives."""
    counts = {len(e) for e in enters} | {len(lv) for lv in leaves}
    if len(enters) != len(leaves) or not enters or len(counts) != 1:
        raise ValueError(f"every rank must time the same collectives; got enter counts "
                         f"{[len(e) for e in enters]}, leave counts {[len(lv) for lv in leaves]}")
    out = []
    for k in range(counts.pop()):
        start = max(e[k] for e in enters)
        out.append(statistics.fmean(lv[k] for lv in leaves) - start)
    return out


def arrival_skew(enters: Sequence[Sequence[float]]) -> list[float]:
    """``max_r - min_r`` of the enter times of each collective: how long the first rank waited
    for the last (idle time in the clock's terms; not communication)."""
    return [max(e[k] for e in enters) - min(e[k] for e in enters) for k in range(len(enters[0]))]


def relative_error(simulated: float, real: float) -> float:
    """``(simulated - real) / real``: negative = the clock is optimistic."""
    if not real > 0:
        raise ValueError(f"the real time must be > 0, got {real!r}")
    return (simulated - real) / real


@dataclass(frozen=True)
class Row:
    """One measured case and its predictions.

    Attributes:
        kind: ``all_reduce`` (raw) or the strategy of an end-to-end run (``ddp``, ``diloco``).
        what: the case: ``"8 MB"``, or ``"60 steps, 60 coll."``.
        nodes: N; rate_bps: the shaped rate; real_s: measured communication (seconds).
        before_s: the uncalibrated model (the issue's measurement: ``efficiency=1,
            hop_latency=0s,latency=0.1ms``); after_s: the calibrated model (``latency=0s``).
        notes: extra measurements (drops, wire bytes per payload byte, arrival skew).
        calibrated_s: the network file ``exogym calibrate`` wrote for this case's links (None:
            not calibrated).
    """

    kind: str
    what: str
    nodes: int
    rate_bps: float
    real_s: float
    before_s: float
    after_s: float
    notes: dict[str, float] = field(default_factory=dict)
    calibrated_s: float | None = None

    @property
    def error_before(self) -> float:
        return relative_error(self.before_s, self.real_s)

    @property
    def error_after(self) -> float:
        return relative_error(self.after_s, self.real_s)

    @property
    def error_calibrated(self) -> float | None:
        return None if self.calibrated_s is None else relative_error(self.calibrated_s,
                                                                     self.real_s)


def format_table(rows: Sequence[Row], tolerance: float = 0.10) -> str:
    """A Markdown table: case, N, rate, real, before and after (the presets' calibrated
    defaults) with their errors, and, where any row has one, the calibrated file's prediction
    and error; errors of after or calibrated beyond ``tolerance`` are marked ``!``."""
    cal = any(r.calibrated_s is not None for r in rows)
    extra = (" calibrated | err |", "---|---|") if cal else ("", "")
    lines = [f"| case | N | rate | real | before | err | after | err |{extra[0]} notes |",
             f"|---|---|---|---|---|---|---|---|{extra[1]}---|"]
    for r in rows:
        mark = " !" if abs(r.error_after) > tolerance else ""
        notes = ", ".join(f"{k} {_fmt_note(v)}" for k, v in r.notes.items())
        cells = ""
        if cal:
            err = r.error_calibrated
            cells = (" - | - |" if r.calibrated_s is None or err is None else
                     f" {r.calibrated_s:.3f} s | {100 * err:+.1f}%"
                     f"{' !' if abs(err) > tolerance else ''} |")
        lines.append(
            f"| {r.kind} {r.what} | {r.nodes} | {r.rate_bps / 1e6:g} Mbit/s | {r.real_s:.3f} s "
            f"| {r.before_s:.3f} s | {100 * r.error_before:+.1f}% | {r.after_s:.3f} s "
            f"| {100 * r.error_after:+.1f}%{mark} |{cells} {notes} |")
    return "\n".join(lines)


def _fmt_note(v: float) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def error_summary(errors: Sequence[float]) -> dict[str, float]:
    """``median``, ``worst`` (largest magnitude, with its sign) and ``mean_abs`` of errors."""
    if not errors:
        raise ValueError("no errors to summarise")
    worst = max(errors, key=abs)
    return {"median": statistics.median(errors), "worst": worst,
            "mean_abs": statistics.fmean(abs(e) for e in errors)}


def parse_numbers(text: str, what: str, *, integer: bool = False, least: int = 2,
                  why: str = "one node sends nothing") -> list[float]:
    """``"20,100"`` -> ``[20.0, 100.0]``; every value > 0 (an integer >= ``least`` with
    ``integer``, ``why`` saying why)."""
    values: list[float] = []
    for item in text.split(","):
        try:
            value = int(item) if integer else float(item)
        except ValueError:
            raise ValueError(f"{what}: {item.strip()!r} in {text!r} is not "
                             f"{'an integer' if integer else 'a number'}") from None
        if integer and value < least:
            raise ValueError(f"{what}: {value} in {text!r} must be >= {least} ({why})")
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{what}: {item.strip()!r} in {text!r} must be > 0")
        values.append(value)
    return values


# -- networks (the model under test) -------------------------------------------------------------
def before_network(rate_bps: float) -> Any:
    """The model as it was before calibration, as the issue's measurement ran it: ``bw=RATE,
    latency=0.1ms``, every byte at the line rate, no per-hop software latency."""
    from exogym.sim.network import Network

    return Network(up_bps=rate_bps, latency_s=1e-4, efficiency=1.0, hop_latency_s=0.0)


def after_spec(rate_bps: float) -> str:
    """The spec the end-to-end runs get: the calibrated defaults; no latency, since the bridge
    adds none beyond the stack's own (which the per-hop latency covers)."""
    return f"bw={rate_bps:g}bps,latency=0s"


# -- running things (needs root) -----------------------------------------------------------------
class Interrupted(Exception):
    """SIGINT, SIGTERM or SIGHUP arrived: unwind so that everything is removed."""


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(f"signal {signal.Signals(signum).name}")


def check_environment() -> None:
    """Exit with a clear message unless this is root with ``ip`` and ``tc``."""
    problems = []
    if os.geteuid() != 0:
        problems.append("it must run as root (namespaces, veths and tc need CAP_NET_ADMIN): "
                        "sudo -E \"$(command -v python)\" bench/clock_fidelity.py ...")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            problems.append(f"{tool!r} is not on PATH: install iproute2")
    if problems:
        raise SystemExit("clock_fidelity: " + "; ".join(problems))


def sh(cmd: Sequence[str], *, check: bool = True) -> str:
    """Run one command, return its stdout; on failure raise naming the command and its stderr."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def remove(cmds: Sequence[Sequence[str]]) -> None:
    """Run delete commands, ignoring 'does not exist' (a partial set-up, or a second pass)."""
    for cmd in cmds:
        sh(cmd, check=False)


def present() -> tuple[list[str], list[str]]:
    return leftovers(sh(["ip", "netns", "list"], check=False),
                     sh(["ip", "-o", "link", "show"], check=False))


@contextmanager
def network(topo: Topology) -> Iterator[Topology]:
    """Build ``topo``; remove it by name afterwards, whatever happens (signals included)."""
    previous = {s: signal.signal(s, _raise_interrupted)
                for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        for cmd in setup_commands(topo):
            sh(cmd)
        yield topo
    finally:
        # Signals are blocked meanwhile: a second Ctrl-C must not leave half a network behind.
        signal.pthread_sigmask(signal.SIG_BLOCK, list(previous))
        try:
            remove(teardown_commands(topo))
            spaces, links = present()
            mine = [n for n in spaces + links if n.startswith(f"{PREFIX}{topo.tag}-")]
            if mine:
                print(f"clock_fidelity: could not remove {', '.join(mine)}", file=sys.stderr)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            # A signal that came during the teardown is delivered now, to the caller's handler.
            signal.pthread_sigmask(signal.SIG_UNBLOCK, list(previous))


def link_stats(topo: Topology, num_nodes: int) -> list[tuple[QdiscStats, QdiscStats]]:
    out = []
    for i in range(num_nodes):
        up, down = stats_commands(topo, i)
        out.append((parse_qdisc_stats(sh(up)), parse_qdisc_stats(sh(down))))
    return out


def launch(topo: Topology, num_nodes: int, argv: Sequence[str], workdir: Path, name: str,
           timeout_s: float) -> None:
    """Run ``python clock_fidelity.py ARGV`` as ranks 0..N-1, rank ``i`` in namespace ``i``;
    wait for all, kill the rest (by pid) if one fails or time runs out."""
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for rank in range(num_nodes):
            env = worker_env(topo, rank, num_nodes)
            log = open(workdir / f"{name}.rank{rank}.log", "wb")  # noqa: SIM115 (closed below)
            logs.append(log)
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", topo.namespace(rank), sys.executable,
                 str(Path(__file__).resolve()), *argv],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed or time.monotonic() > deadline:
                why = f"rank {failed[0]} failed" if failed else f"timed out after {timeout_s:g} s"
                raise RuntimeError(f"{name}: {why}; logs in {workdir}/{name}.rank*.log:\n"
                                   + _tail(workdir / f"{name}.rank{failed[0] if failed else 0}"
                                           ".log"))
            time.sleep(0.05)
        bad = [r for r, p in enumerate(procs) if p.returncode != 0]
        if bad:
            raise RuntimeError(f"{name}: rank {bad[0]} exited with {procs[bad[0]].returncode}:\n"
                               + _tail(workdir / f"{name}.rank{bad[0]}.log"))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)  # its own session: only what we started
                p.wait()
        for log in logs:
            log.close()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as err:
        return f"(no log: {err})"


def read_times(workdir: Path, name: str, num_nodes: int) -> list[dict[str, Any]]:
    return [json.loads((workdir / f"{name}.rank{r}.json").read_text()) for r in range(num_nodes)]


# -- workers (run inside a namespace) -------------------------------------------------------------
def worker_collectives(sizes: Sequence[int], reps: int | Sequence[int], warmup_bytes: int,
                       out: Path, *, warmups: int = 1, gap_s: float | None = None) -> None:
    """Rank body of (a): per size ``warmups`` untimed all-reduces of ``min(size,
    warmup_bytes)`` and ``reps`` timed fp32 all-reduces (one count for all sizes or one per
    size), each after a barrier, or, with ``gap_s``, after that many seconds of busy waiting
    (the compute between a run's collectives); writes ``{"sizes": [...], "enter": [[...]],
    "leave": [[...]]}`` to ``out``."""
    import torch
    import torch.distributed as dist

    counts = [reps] * len(sizes) if isinstance(reps, int) else list(reps)
    dist.init_process_group("gloo", init_method="env://")
    torch.set_num_threads(1)
    enter: list[list[float]] = []
    leave: list[list[float]] = []
    for size, count in zip(sizes, counts, strict=True):
        x = torch.ones(max(size // 4, 1))
        # untimed: the connections' congestion windows open here, as in a run's first steps
        for _ in range(warmups):
            dist.all_reduce(torch.ones(max(min(size, warmup_bytes) // 4, 1)))
        e, lv = [], []
        for _ in range(count):
            if gap_s is None:
                dist.barrier()
            else:
                until = time.monotonic() + gap_s
                while time.monotonic() < until:
                    pass
            t0 = time.monotonic()
            dist.all_reduce(x)
            t1 = time.monotonic()
            e.append(t0)
            lv.append(t1)
        enter.append(e)
        leave.append(lv)
    dist.barrier()
    dist.destroy_process_group()
    out.write_text(json.dumps({"sizes": list(sizes), "enter": enter, "leave": leave}))


def worker_run(out: Path, run_args: Sequence[str]) -> int:
    """Rank body of (b): ``exogym run RUN_ARGS`` with the communicator's collective hooks timed
    (enter/leave per call, in call order); writes ``{"ops", "enter", "leave"}`` to ``out``."""
    from exogym.cli import main
    from exogym.run.dist.communicator import DistributedCommunicator

    ops: list[str] = []
    enter: list[float] = []
    leave: list[float] = []

    def timed(hook: Any, op: str) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.monotonic()
            result = hook(self, *args, **kwargs)
            leave.append(time.monotonic())
            enter.append(t0)
            ops.append(op)
            return result
        return wrapper

    for attr, op in (("_all_reduce", "all_reduce"), ("_all_gather", "all_gather"),
                     ("_broadcast", "broadcast")):
        setattr(DistributedCommunicator, attr, timed(getattr(DistributedCommunicator, attr), op))
    rc = main(["run", *run_args])
    out.write_text(json.dumps({"ops": ops, "enter": enter, "leave": leave,
                               "probe_s": _probe_step_time(run_args)}))
    return int(rc or 0)


def _probe_step_time(run_args: Sequence[str]) -> float:
    """The compute time the clock used before it measured real steps (the "before" of the total
    rows): :func:`exogym.sim.clock.measure_step_time` on this rank, one MNIST node alone, a
    copy of the model in eval mode, the task's batch, AdamW at the task's lr."""
    from torch.utils.data import default_collate

    from exogym.sim.clock import measure_step_time
    from exogym.strategy.optim import OptimSpec
    from exogym.tasks.registry import get_task

    data_dir = run_args[run_args.index("--data-dir") + 1] if "--data-dir" in run_args else None
    task = get_task("mnist")
    train, _ = task.load_data(data_dir, False)
    batch = default_collate([train[i] for i in range(task.batch_size)])
    return measure_step_time(task.build_model(), batch, OptimSpec(lr=task.lr))


# -- the experiment ------------------------------------------------------------------------------
@dataclass
class Config:
    """What to measure (the command line's options)."""

    rates_mbps: list[float]
    nodes: list[int]
    sizes_mb: list[float]
    reps: int = 3
    e2e: list[str] = field(default_factory=lambda: ["ddp", "diloco"])
    steps: int = 60
    H: int = 10
    probe_reps: int = 200
    data_dir: str | None = None
    cc: str | None = "reno"
    burst_s: float = BURST_S
    queue_s: float = QUEUE_S
    timeout_s: float = 900.0
    calibrate: bool = True
    cal_reps: int = 3
    cal_target_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("reps", "steps", "H", "probe_reps", "cal_reps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if any(s != "ddp" for s in self.e2e) and self.steps < self.H:
            raise ValueError(f"--steps {self.steps} is shorter than --H {self.H}: the run would "
                             "never synchronise")
        if not (self.rates_mbps and self.nodes and self.sizes_mb):
            raise ValueError("give at least one rate, one N and one size")


def measure_hop_latency(topo: Topology, cfg: Config, workdir: Path) -> dict[int, float]:
    """Median time of a 4-byte all-reduce over unshaped links, per N, divided by its ``2(N-1)``
    ring hops: the per-hop latency of gloo and the kernel's stack with no link delay."""
    for cmd in shaping_commands(topo, None):
        sh(cmd, check=False)
    out = {}
    for n in cfg.nodes:
        name = f"probe-n{n}"
        launch(topo, n, ["_collective", "--sizes", "4", "--reps", str(cfg.probe_reps),
                         "--out", str(workdir / name)], workdir, name, cfg.timeout_s)
        times = read_times(workdir, name, n)
        secs = collective_seconds([t["enter"][0] for t in times], [t["leave"][0] for t in times])
        out[n] = statistics.median(secs) / (2 * (n - 1))
    return out


def measure_calibration(topo: Topology, n: int, rate_bps: float, cfg: Config,
                        workdir: Path) -> Path:
    """``exogym calibrate`` on the shaped links (ranks 0..N-1, one per namespace, as a run's):
    the network file it writes; its report (rank 0's output) is printed."""
    name = f"cal-n{n}-r{rate_bps:g}"
    out = workdir / f"{name}.json"
    launch(topo, n, ["_calibrate", "--out", str(out), "--reps", str(cfg.cal_reps),
                     "--target-time", f"{cfg.cal_target_s!r}s"], workdir, name, cfg.timeout_s)
    print((workdir / f"{name}.rank0.log").read_text(errors="replace"), flush=True)
    return out


def measure_collectives(topo: Topology, n: int, rate_bps: float, cfg: Config,
                        workdir: Path, calibrated: Path | None = None) -> list[Row]:
    from exogym.sim.network import parse_network

    cal_net = None if calibrated is None else parse_network(str(calibrated))
    rows = []
    for size_mb in cfg.sizes_mb:
        size = round(size_mb * MB)
        name = f"ar-n{n}-r{rate_bps:g}-s{size}"
        before = link_stats(topo, n)
        launch(topo, n, ["_collective", "--sizes", str(size), "--reps", str(cfg.reps),
                         "--out", str(workdir / name)], workdir, name, cfg.timeout_s)
        delta = [(u1 - u0, d1 - d0) for (u0, d0), (u1, d1) in zip(before, link_stats(topo, n),
                                                                     strict=True)]
        times = read_times(workdir, name, n)
        secs = collective_seconds([t["enter"][0] for t in times], [t["leave"][0] for t in times])
        real = statistics.median(secs)
        # What each uplink carried per payload byte the ring sends (2(N-1)/N * S per node per
        # all-reduce; reps + 1 warm-up all-reduces + barriers, which are a few hundred bytes).
        payload = (cfg.reps * size + min(size, MB)) * 2 * (n - 1) / n
        up = [u for u, _ in delta]
        rows.append(Row(
            kind="all_reduce", what=f"{size_mb:g} MB", nodes=n, rate_bps=rate_bps, real_s=real,
            before_s=before_network(rate_bps).collective_time("all_reduce", size, n),
            after_s=parse_network(after_spec(rate_bps)).collective_time("all_reduce", size, n),
            calibrated_s=(None if cal_net is None
                          else cal_net.collective_time("all_reduce", size, n)),
            notes={"wire/payload": statistics.fmean(u.sent_bytes for u in up) / payload,
                   "pkts/MB": statistics.fmean(u.sent_packets for u in up) / payload * MB,
                   "drops": sum(u.dropped + d.dropped for u, d in delta),
                   "spread": (max(secs) - min(secs)) / real}))
    return rows


def measure_run(topo: Topology, n: int, rate_bps: float, strategy: str, cfg: Config,
                workdir: Path, calibrated: Path | None = None) -> tuple[Row, Row]:
    """An end-to-end run's communication (the sum over its collectives, real and on the clock)
    and its total: the training steps' wall time on rank 0 (evaluation excluded) against the
    clock's total. Before: the uncalibrated network, and the compute of the eval-mode probe
    that the clock used before it measured real steps (rank 0's); after: the preset's
    calibrated defaults (``bw=RATE``); calibrated: the network file of ``exogym calibrate``.
    The run's own clock is the last of these it has (``--network FILE`` or ``bw=RATE``); the
    other is its trace re-costed, with the same measured compute."""
    from exogym.sim.clock import ClockTrace
    from exogym.sim.network import parse_network

    name = f"{strategy}-n{n}-r{rate_bps:g}"
    run_dir = workdir / f"{name}-run"
    args = ["--task", "mnist", "--strategy", strategy, "--nodes", str(n), "--steps",
            str(cfg.steps), "--network", after_spec(rate_bps) if calibrated is None else
            str(calibrated), "--no-progress", "--seed", "0",
            "--eval-interval", str(cfg.steps), "--log-interval", str(cfg.steps), "--no-download",
            "--compute", "measured",  # the real run's compute: these ranks' own steps
            "--out", str(run_dir)]
    if strategy != "ddp":
        args += ["--set", f"H={cfg.H}"]
    if cfg.data_dir:
        args += ["--data-dir", cfg.data_dir]
    launch(topo, n, ["_run", "--out", str(workdir / name), "--", *args], workdir, name,
           cfg.timeout_s)
    times = read_times(workdir, name, n)
    enters, leaves = [t["enter"] for t in times], [t["leave"] for t in times]
    real = sum(collective_seconds(enters, leaves))
    summary = json.loads((run_dir / "summary.json").read_text())
    trace = ClockTrace.from_dict(summary["clock"]["trace"])
    if len(trace.records) != len(enters[0]):
        raise RuntimeError(f"{name}: the log has {len(trace.records)} collectives but "
                           f"{len(enters[0])} were timed")
    skew = arrival_skew(enters)
    own_comm, own_total = float(summary["sim_comm_s"]), float(summary["sim_time_s"])
    preset = (trace.cost(parse_network(after_spec(rate_bps))) if calibrated is not None
              else None)
    comm = Row(kind=strategy, what=f"{cfg.steps} steps, {len(trace.records)} coll.", nodes=n,
               rate_bps=rate_bps, real_s=real, before_s=trace.cost(before_network(rate_bps)).comm_s,
               after_s=own_comm if preset is None else preset.comm_s,
               calibrated_s=None if preset is None else own_comm,
               notes={"skew": statistics.fmean(skew), "wall": float(summary["wall_time_s"])})
    probe = float(times[0]["probe_s"])
    clock = summary["clock"]
    total = Row(kind=f"{strategy} total", what=f"{cfg.steps} steps", nodes=n, rate_bps=rate_bps,
                real_s=float(summary["train_time_s"]),
                before_s=trace.cost(before_network(rate_bps), step_time_s=probe).total_s,
                after_s=own_total if preset is None else preset.total_s,
                calibrated_s=None if preset is None else own_total,
                notes={"c_probe_ms": 1e3 * probe,
                       "c_ms": 1e3 * float(clock["report"]["step_time_s"]),
                       "idle": float(summary["sim_idle_s"]) / float(summary["sim_time_s"])})
    return comm, total


def experiment(cfg: Config, workdir: Path) -> dict[str, Any]:
    tag = f"{os.getpid() & 0xFFFF:04x}"
    topo = Topology(tag, max(cfg.nodes))
    proc = Path("/proc/sys/net/ipv4")
    problem = cc_problem(cfg.cc, (proc / "tcp_allowed_congestion_control").read_text(),
                         (proc / "tcp_available_congestion_control").read_text())
    if problem:
        raise SystemExit(f"clock_fidelity: {problem}")
    raw: list[Row] = []
    runs: list[Row] = []
    totals: list[Row] = []
    files: dict[str, Any] = {}
    with network(topo):
        for cmd in cc_commands(topo, cfg.cc):
            sh(cmd)
        cc = sh(["ip", "netns", "exec", topo.namespace(0), "sysctl", "-n",
                 "net.ipv4.tcp_congestion_control"]).strip()
        print(f"TCP congestion control in the namespaces: {cc}", flush=True)
        hop = measure_hop_latency(topo, cfg, workdir)
        print("hop latency (4-byte all-reduce / 2(N-1), unshaped): "
              + ", ".join(f"N={n}: {1e6 * h:.1f} us" for n, h in hop.items()), flush=True)
        for n in cfg.nodes:
            for rate in cfg.rates_mbps:
                rate_bps = rate * 1e6
                for cmd in shaping_commands(topo, rate_bps, cfg.burst_s, cfg.queue_s):
                    sh(cmd)
                cal = None
                if cfg.calibrate:
                    cal = measure_calibration(topo, n, rate_bps, cfg, workdir)
                    files[f"N={n} {rate:g} Mbit/s"] = json.loads(cal.read_text())
                raw += measure_collectives(topo, n, rate_bps, cfg, workdir, cal)
                print(format_table(raw[-len(cfg.sizes_mb):], 0.05), flush=True)
                for strategy in cfg.e2e:
                    comm, total = measure_run(topo, n, rate_bps, strategy, cfg, workdir, cal)
                    runs.append(comm)
                    totals.append(total)
                    print(format_table([comm, total]), flush=True)
    return {"cc": cc, "hop_latency_s": hop, "raw": raw, "runs": runs, "totals": totals,
            "calibrations": files}


def report(result: dict[str, Any], cfg: Config, load: tuple[str, str]) -> str:
    lines = [f"load average before: {load[0]}; after: {load[1]}",
             f"TCP congestion control: {result['cc']}; tbf burst {cfg.burst_s * 1e3:g} ms, "
             f"queue {cfg.queue_s * 1e3:g} ms of traffic",
             "hop latency: " + ", ".join(f"N={n}: {1e6 * h:.1f} us"
                                         for n, h in result["hop_latency_s"].items())]
    for title, rows in (("raw all-reduce", result["raw"]),
                        ("end-to-end communication", result["runs"]),
                        ("end-to-end total (compute + communication + idle)",
                         result["totals"])):
        if not rows:
            continue
        before = error_summary([r.error_before for r in rows])
        after = error_summary([r.error_after for r in rows])
        cal = [r.error_calibrated for r in rows if r.error_calibrated is not None]
        summary = ("before: median {median:+.1%}, worst {worst:+.1%}; ".format(**before)
                   + "after: median {median:+.1%}, worst {worst:+.1%}".format(**after))
        if cal:
            summary += "; calibrated: median {median:+.1%}, worst {worst:+.1%}".format(
                **error_summary(cal))
        tolerance = 0.05 if rows is result["raw"] else 0.10
        lines += ["", f"## {title}", "", format_table(rows, tolerance), "", summary]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_collective"]:
        p = argparse.ArgumentParser(prog="clock_fidelity.py _collective")
        p.add_argument("--sizes", required=True)
        p.add_argument("--reps", required=True, help="one count, or one per size")
        p.add_argument("--warmup-bytes", type=int, default=int(MB))
        p.add_argument("--warmups", type=int, default=1)
        p.add_argument("--gap", type=float, default=None,
                       help="busy seconds before each timed all-reduce (default: a barrier)")
        p.add_argument("--out", required=True)
        a = p.parse_args(argv[1:])
        rank = os.environ["RANK"]
        reps = [int(r) for r in a.reps.split(",")]
        worker_collectives([int(s) for s in a.sizes.split(",")],
                           reps[0] if len(reps) == 1 else reps, a.warmup_bytes,
                           Path(f"{a.out}.rank{rank}.json"), warmups=a.warmups, gap_s=a.gap)
        return 0
    if argv[:1] == ["_calibrate"]:  # one rank of `exogym calibrate` (rank 0 writes the file)
        from exogym.cli import main as exogym_main

        return exogym_main(["calibrate", *argv[1:]])
    if argv[:1] == ["_run"]:
        split = argv.index("--")
        out = argv[argv.index("--out") + 1]
        return worker_run(Path(f"{out}.rank{os.environ['RANK']}.json"), argv[split + 1:])

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="20,100", help="shaped rates, Mbit/s (default 20,100)")
    p.add_argument("--nodes", default="2,4", help="N values (default 2,4)")
    p.add_argument("--sizes", default="1,8,32", help="all-reduce sizes, MB = 1e6 bytes")
    p.add_argument("--reps", type=int, default=3, help="timed all-reduces per size (median)")
    p.add_argument("--e2e", default="ddp,diloco",
                   help="strategies of the end-to-end MNIST runs ('none': skip them)")
    p.add_argument("--steps", type=int, default=60, help="steps of each end-to-end run")
    p.add_argument("--H", type=int, default=10, help="H of the non-DDP strategies")
    p.add_argument("--probe-reps", type=int, default=200,
                   help="4-byte all-reduces of the hop-latency probe")
    p.add_argument("--cc", default="reno",
                   help="TCP congestion control inside the namespaces (default reno: loss-based "
                        "like Linux's default cubic; 'default': the namespaces' own)")
    p.add_argument("--burst", default=f"{BURST_S * 1e3:g}ms",
                   help="tbf bucket, as time at the rate (default 2ms)")
    p.add_argument("--queue", default=f"{QUEUE_S * 1e3:g}ms",
                   help="tbf queue, as time at the rate (default 50ms)")
    p.add_argument("--no-calibrate", action="store_true",
                   help="skip `exogym calibrate` (the 'calibrated' columns)")
    p.add_argument("--cal-reps", type=int, default=3, help="calibrate's --reps (default 3)")
    p.add_argument("--cal-target", default="5s",
                   help="calibrate's --target-time (default 5s: up to 4 MB at 20 Mbit/s)")
    p.add_argument("--data-dir", default=os.environ.get("EXOGYM_DATA_DIR"),
                   help="folder holding mnist/ (default $EXOGYM_DATA_DIR)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--keep", action="store_true", help="keep the work folder (logs, runs)")
    p.add_argument("--cleanup", action="store_true",
                   help=f"only remove namespaces and links named {PREFIX}* (a killed run's)")
    a = p.parse_args(argv)
    check_environment()
    if a.cleanup:
        spaces, links = present()
        remove(cleanup_commands(spaces, links))
        left = [name for names in present() for name in names]
        print(f"removed {len(spaces)} namespaces and {len(links)} links; left: {left or 'none'}")
        return 1 if left else 0
    from exogym.sim.network import parse_duration

    try:
        cfg = Config(rates_mbps=parse_numbers(a.rates, "--rates"),
                     nodes=[int(v) for v in parse_numbers(a.nodes, "--nodes", integer=True)],
                     sizes_mb=parse_numbers(a.sizes, "--sizes"), reps=a.reps,
                     e2e=[] if a.e2e == "none" else [s.strip() for s in a.e2e.split(",")],
                     steps=a.steps, H=a.H, probe_reps=a.probe_reps, data_dir=a.data_dir,
                     cc=None if a.cc == "default" else a.cc,
                     burst_s=parse_duration(a.burst), queue_s=parse_duration(a.queue),
                     calibrate=not a.no_calibrate, cal_reps=a.cal_reps,
                     cal_target_s=parse_duration(a.cal_target))
    except ValueError as err:
        p.error(str(err))
    workdir = Path(tempfile.mkdtemp(prefix="exg-fidelity-"))
    load0 = Path("/proc/loadavg").read_text().strip()
    try:
        result = experiment(cfg, workdir)
    except Interrupted as err:
        print(f"clock_fidelity: stopped by {err}; everything it created is removed",
              file=sys.stderr)
        return 130
    finally:
        if not a.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    load1 = Path("/proc/loadavg").read_text().strip()
    text = report(result, cfg, (load0, load1))
    print("\n" + text)
    if a.json:
        Path(a.json).write_text(json.dumps(
            {"config": asdict(cfg), "load": [load0, load1], "cc": result["cc"],
             "hop_latency_s": result["hop_latency_s"],
             "raw": [asdict(r) for r in result["raw"]],
             "runs": [asdict(r) for r in result["runs"]],
             "totals": [asdict(r) for r in result["totals"]],
             "calibrations": result["calibrations"]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
