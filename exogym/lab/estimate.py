"""``exogym estimate``: training time, bytes and utilization of data-parallel training, on paper.

No training: a model of ``params`` parameters in ``dtype`` (``S`` bytes per copy on the wire,
after an optional transport codec), ``batches`` batches of ``c`` seconds of compute each, shared
by ``N`` nodes, and a strategy that synchronises every ``H`` steps (``ddp``: ``H = 1``; ``diloco``
and ``fedavg``: every ``H`` steps). Each node takes ``steps = ceil(batches / N)`` steps; there are
``syncs = floor(steps / H)`` synchronisations (a run that is not a multiple of ``H`` leaves its
last local steps unsynced, as the trainer does). Then, with node speeds from the network
(``c / min_i speed_i`` per step)::

    total = steps * c + syncs * sync_time          one node alone: batches * c

in two modes, side by side:

- **send once** (the arithmetic of the EXO Gym post, "Communication cost of distributed training"):
  a sync sends the whole model once, ``sync_time = 8 S / B`` over the slowest link ``B``, no
  latency, whatever ``N``; or a given ``sync_time`` (``--sync-time``). A 7B-parameter fp16 model is
  ``S`` = 14 GB = 112 Gbit: 0.56 s at 200 Gbit/s, 1,120 s = 18.7 min at 100 Mbit/s. 1,000 one-minute
  batches on 2 nodes: one node 1,000 min; DDP in a data centre 500 * (1 + 0.56/60) = 504.7 min
  (~505); over home internet 500 * (1 + 18.67) = 9,833 min, or with the post's rounded 20-minute
  sync exactly 500 * 21 = 10,500 min; DiLoCo with H = 500 syncs once: 500 + 18.67 = 518.7 min
  (~519), or exactly 520 with the 20-minute sync;
- **all-reduce**: ``sync_time`` is the network's all-reduce of ``S`` bytes over ``N`` nodes
  (:meth:`exogym.sim.network.Network.collective_time`; ring: ``2(N-1)/N * 8S/B + 2(N-1) L``
  with the calibrated ``B = efficiency * bits/s`` and ``L = latency + hop_latency``, see
  ``docs/network.md``; ``--network ...,efficiency=1,hop_latency=0s`` gives the bare formula), or
  an all-gather for a sparse codec (top-k), exactly as a run's clock costs it.

Bytes sent per node: send once ``syncs * S``; all-reduce ``syncs * 2(N-1)/N * S`` (``(N-1) S``
for a sparse codec), the communicator's formulas. Distributing pays off when ``total`` is below
one node's time, i.e. when ``sync_time < H (N-1) c`` (with ``N = 2``: the post's
``sync_time < H c``). ``utilization = steps * c / total``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from exogym.lab.formats import format_bytes
from exogym.sim.comm import all_gather_bytes, all_reduce_bytes
from exogym.sim.network import Network, format_duration, format_rate, parse_network

__all__ = ["DTYPES", "STRATEGIES", "Estimate", "estimate", "format_estimates", "format_sweep",
           "parse_count", "plot_estimates", "sweep"]

DTYPES: dict[str, torch.dtype] = {
    "fp64": torch.float64, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
    "fp8": torch.float8_e4m3fn, "int8": torch.int8,
}
STRATEGIES = ("ddp", "diloco", "fedavg")
_COUNT_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str) -> float:
    """``"7e9"``, ``"7B"``, ``"124M"``, ``"1.5T"`` -> a number (B/G = 1e9: billions)."""
    raw = text.strip()
    suffix = raw[-1:].lower() if raw[-1:].isalpha() else ""
    try:
        value = float(raw[: len(raw) - len(suffix)]) * _COUNT_SUFFIX[suffix]
    except (KeyError, ValueError):
        raise ValueError(f"expected a count such as 7e9, 7B, 124M or 1.5T, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"expected a count > 0, got {text!r}")
    return value


@dataclass(frozen=True)
class Estimate:
    """One scenario. Times in seconds, bytes per node.

    Attributes:
        label: ``"ddp"``, ``"diloco H=500"`` or ``"single node"``.
        network: the network (None for the single node).
        num_nodes: the nodes.
        H: the steps between two synchronisations.
        steps: the steps per node.
        syncs: the synchronisations.
        step_compute_s: compute per step of the slowest node.
        payload_bytes: ``S``, one copy of the model on the wire (after the codec).
        once_sync_s: one sync sending the model once (``sync_time_given``: this time was
            given, not computed).
        all_reduce_sync_s: one sync as a ring all-reduce.
        once_total_s: the training time, syncs sending once.
        all_reduce_total_s: the training time, syncs as all-reduces.
        once_bytes: bytes sent per node, syncs sending once.
        all_reduce_bytes: bytes sent per node, syncs as all-reduces.
        single_node_s: one node alone on every batch.
    """

    label: str
    network: Network | None
    num_nodes: int
    H: int
    steps: int
    syncs: int
    step_compute_s: float
    payload_bytes: float
    once_sync_s: float
    all_reduce_sync_s: float
    sync_time_given: bool
    once_total_s: float
    all_reduce_total_s: float
    once_bytes: float
    all_reduce_bytes: float
    single_node_s: float

    @property
    def once_speedup(self) -> float:
        return self.single_node_s / self.once_total_s

    @property
    def all_reduce_speedup(self) -> float:
        return self.single_node_s / self.all_reduce_total_s

    @property
    def utilization(self) -> float:
        """Compute / total, all-reduce mode."""
        return self.steps * self.step_compute_s / self.all_reduce_total_s

    @property
    def once_utilization(self) -> float:
        return self.steps * self.step_compute_s / self.once_total_s


def _int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _payload(params: float, dtype: str, codec: str | None) -> tuple[float, bool]:
    """``(S bytes on the wire, sparse)`` for ``params`` elements of ``dtype`` through ``codec``."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if codec is None or codec.strip().lower() == "none":
        return params * DTYPES[dtype].itemsize, False
    from exogym.sim.codecs import make_codec

    c = make_codec(codec)
    assert c is not None
    return float(c.payload_bytes(int(params), DTYPES[dtype])), c.sparse


def estimate(
    *, params: float, dtype: str = "fp16", codec: str | None = None, num_nodes: int = 2,
    batches: int = 1000, compute_s: float = 60.0, network: Network | str = "datacenter",
    strategy: str = "ddp", H: int | None = None, sync_time_s: float | None = None,
) -> Estimate:
    """Training time of ``batches`` batches of ``compute_s`` seconds on ``num_nodes`` nodes
    (formulas in the module docstring). ``strategy`` is ``ddp`` (H = 1), ``diloco`` or
    ``fedavg`` (H required), or ``single`` (one node, no network)."""
    if not (isinstance(params, (int, float)) and math.isfinite(params) and params > 0):
        raise ValueError(f"params must be a number > 0, got {params!r}")
    _int("num_nodes", num_nodes, 1)
    _int("batches", batches, 1)
    if not (isinstance(compute_s, (int, float)) and math.isfinite(compute_s) and compute_s > 0):
        raise ValueError(f"compute_s must be > 0 seconds, got {compute_s!r}")
    if sync_time_s is not None and not (math.isfinite(sync_time_s) and sync_time_s >= 0):
        raise ValueError(f"sync_time_s must be >= 0 seconds or None, got {sync_time_s!r}")
    payload, sparse = _payload(params, dtype, codec)
    single = batches * compute_s
    if strategy == "single":
        return Estimate("single node", None, 1, 1, batches, 0, compute_s, payload, 0.0, 0.0,
                        False, single, single, 0.0, 0.0, single)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if strategy == "ddp":
        if H not in (None, 1):
            raise ValueError(f"ddp synchronises every step (H = 1), got H={H!r}")
        H = 1
    elif H is None:
        raise ValueError(f"{strategy} needs H, the steps between synchronisations")
    _int("H", H, 1)
    net = parse_network(network)
    steps = math.ceil(batches / num_nodes)
    syncs = steps // H
    step_compute = compute_s / min(net.node_speeds(num_nodes))
    if num_nodes == 1:
        once = ring = 0.0
        once_bytes_sync = ring_bytes_sync = 0.0
    else:
        once = 8 * payload / net.slowest_link_bps(num_nodes)
        op = "all_gather" if sparse else "all_reduce"
        ring = net.collective_time(op, payload, num_nodes)
        once_bytes_sync = payload
        ring_bytes_sync = (all_gather_bytes(payload, num_nodes) if sparse  # type: ignore[arg-type]
                           else all_reduce_bytes(payload, num_nodes))  # type: ignore[arg-type]
    given = sync_time_s is not None
    if sync_time_s is not None:
        once = float(sync_time_s)
    label = "ddp" if strategy == "ddp" else f"{strategy} H={H}"
    return Estimate(
        label=label, network=net, num_nodes=num_nodes, H=H, steps=steps, syncs=syncs,
        step_compute_s=step_compute, payload_bytes=payload, once_sync_s=once,
        all_reduce_sync_s=ring, sync_time_given=given,
        once_total_s=steps * step_compute + syncs * once,
        all_reduce_total_s=steps * step_compute + syncs * ring,
        once_bytes=syncs * once_bytes_sync, all_reduce_bytes=syncs * ring_bytes_sync,
        single_node_s=single,
    )


def sweep(key: str, values: Sequence[int], **kwargs: object) -> list[Estimate]:
    """:func:`estimate` for each value of ``key`` (``"H"`` or ``"num_nodes"``)."""
    if key not in ("H", "num_nodes"):
        raise ValueError(f"sweep key must be H or nodes, got {key!r}")
    if key == "H" and kwargs.get("strategy") == "ddp":
        raise ValueError("ddp synchronises every step; sweep H with diloco or fedavg")
    return [estimate(**{**kwargs, key: v}) for v in values]  # type: ignore[arg-type]


# -- text --------------------------------------------------------------------------------------
def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w)
                      for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
            for r in rows]


def _verdict(speedup: float, syncs: int = 1) -> str:
    if syncs == 0:  # the nodes never exchange anything: N separate runs, not one
        return f"{speedup:.2f}x n/a"
    return f"{speedup:.2f}x " + ("yes" if speedup > 1 else "no")


def format_estimates(estimates: Sequence[Estimate], *, params: float, dtype: str,
                     codec: str | None, batches: int, compute_s: float) -> str:
    """The scenario table (the EXO Gym post's table in its default arguments)."""
    first = next(e for e in estimates if e.network is not None)
    payload = first.payload_bytes
    wire = f"{dtype}" + (f" through codec {codec}" if codec and codec != "none" else "")
    lines = [
        f"model    {params:,.0f} parameters in {wire}: {format_bytes(payload)} = "
        f"{8 * payload / 1e9:,.4g} Gbit per copy",
        f"work     {batches:,} batches x {format_duration(compute_s)} on {first.num_nodes} nodes "
        f"= {first.steps:,} steps per node; one node alone: "
        f"{format_duration(batches * compute_s)}",
        "",
        "sync time: send the model once (8S/B, the EXO Gym post's arithmetic) | the network's "
        "all-reduce",
    ]
    rows = [["network", "bandwidth", "latency", "send once", "all-reduce"]]
    seen: set[str] = set()
    for e in estimates:
        if e.network is None or e.network.spec() in seen:
            continue
        seen.add(e.network.spec())
        net = e.network
        once = format_duration(e.once_sync_s) + (" (given)" if e.sync_time_given else "")
        rows.append([net.name, format_rate(net.slowest_link_bps(e.num_nodes)),
                     format_duration(net.latency_s), once,
                     f"{format_duration(e.all_reduce_sync_s)} ({net.all_reduce})"])
    lines += _table(rows, set())
    lines.append("")
    rows = [["scenario", "network", "syncs", "time, send once", "speed-up", "time, all-reduce",
             "speed-up", "utilization", "sent/node"]]
    for e in estimates:
        net = e.network.name if e.network is not None else "-"
        rows.append([e.label, net, f"{e.syncs:,}", format_duration(e.once_total_s),
                     _verdict(e.once_speedup, e.syncs) if e.network else "1.00x",
                     format_duration(e.all_reduce_total_s),
                     _verdict(e.all_reduce_speedup, e.syncs) if e.network else "1.00x",
                     f"{100 * e.utilization:.1f}%", format_bytes(e.all_reduce_bytes)])
    lines += _table(rows, {2, 4, 6, 7, 8})
    lines += ["", "speed-up: one node's time / this time; distributing pays off (yes) when the "
                  "sync time < H (N-1) x compute per batch.",
              "utilization and sent/node: all-reduce mode."]
    unsynced = sorted({e.label for e in estimates if e.network is not None and e.syncs == 0})
    if unsynced:
        lines.append(f"0 syncs ({', '.join(unsynced)}): H is longer than the {first.steps:,} "
                     "steps per node, so the nodes never exchange anything: that is N separate "
                     "trainings, not distributed training (n/a); lower H or train longer.")
    return "\n".join(lines)


def format_sweep(key: str, values: Sequence[int], results: dict[str, list[Estimate]]) -> str:
    """A table: one row per swept value, the training time per network in both modes."""
    name = "H" if key == "H" else "nodes"
    head = [name, "syncs"]
    for net in results:
        head += [f"{net}: send once", "all-reduce", "util."]
    rows = [head]
    for k, v in enumerate(values):
        first = next(iter(results.values()))[k]
        row = [f"{v:,}", f"{first.syncs:,}"]
        for ests in results.values():
            e = ests[k]
            row += [format_duration(e.once_total_s), format_duration(e.all_reduce_total_s),
                    f"{100 * e.utilization:.1f}%"]
        rows.append(row)
    first = next(iter(results.values()))[0]
    lines = [f"sweep of {name}: {first.label.split(' ')[0]}, one node alone "
             f"{format_duration(first.single_node_s)}"]
    return "\n".join(lines + _table(rows, set(range(len(head)))))


def plot_estimates(path: str, key: str | None, values: Sequence[int],
                   results: dict[str, list[Estimate]], title: str) -> None:
    """Write a PNG: training time against the swept value (a line per network and mode), or,
    without a sweep, one bar per scenario, under ``title`` (what was estimated: model, nodes,
    strategy, networks). Uses matplotlib."""
    from exogym.lab.plots import require_matplotlib

    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    hours = 3600.0
    if key is not None:
        single = None
        for net, ests in results.items():
            ax.plot(values, [e.once_total_s / hours for e in ests], "o--",
                    label=f"{net}, send once")
            ax.plot(values, [e.all_reduce_total_s / hours for e in ests], "o-",
                    label=f"{net}, all-reduce")
            single = ests[0].single_node_s
        if single is not None:
            ax.axhline(single / hours, color="gray", lw=1, label="one node")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("H (steps between syncs)" if key == "H" else "nodes")
    else:
        ests = [e for es in results.values() for e in es]
        labels = [e.label + (f"\n{e.network.name}" if e.network else "") for e in ests]
        ypos = range(len(ests))
        ax.barh([y - 0.2 for y in ypos], [e.once_total_s / hours for e in ests], 0.4,
                label="send once")
        ax.barh([y + 0.2 for y in ypos], [e.all_reduce_total_s / hours for e in ests], 0.4,
                label="all-reduce")
        ax.set_yticks(list(ypos), labels)
        ax.invert_yaxis()
        ax.set_xscale("log")
    if key is not None:
        ax.set_ylabel("training time (h)")
    else:
        ax.set_xlabel("training time (h)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title, fontsize=9, wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
