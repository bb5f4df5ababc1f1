"""Measuring the links between real ranks: the measuring side of ``exogym calibrate``.

Every rank runs :func:`measure_rank` in one process group (torchrun's, or the processes of
``--engine process`` on one machine), with the transport training uses (gloo on CPU, nccl on
CUDA); rank 0 then fits the network model (:func:`exogym.sim.calibration.fit_network`) and
writes a network file (:func:`calibrate`). The measurements, in order:

1. two untimed 1 MB all-reduces (they open every connection and TCP's windows, as a run's
   first steps do);
2. the ring all-reduce of every size, ``reps`` times (the 4-byte one :data:`LATENCY_REPS`
   times as often), each after a barrier; the sizes (:func:`next_size`): 4 bytes (the
   latency), then ``64 KiB x 4^k`` while the next is predicted from the last measured to take
   at most ``target_s`` (and within ``max_bytes``), so a slow start of the link (BBR's first
   transfers) does not cut the sizes short. A rank's time is
   from its call to the result; the repeat's time is the **minimum over ranks**: the last rank
   to arrive waits for nobody, so its time is the clock's definition of a collective (from the
   last arrival to the result) without a clock shared between machines;
3. a ping-pong for every ordered pair ``i -> j``, one pair at a time while the others wait at a
   barrier (so a link carries one transfer): ``i`` sends each size to ``j``, which answers with
   4 bytes, ``reps`` times after one untimed transfer; timed on ``i``'s clock.

A rank also reads its TCP congestion control (``/proc/sys/net/ipv4/tcp_congestion_control``,
where there is one), which the file records: the fitted efficiency holds for it.
"""

from __future__ import annotations

import platform
import socket
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from exogym.run.dist.ranks import RankContext
from exogym.sim.calibration import Fit, Sample, fit_network
from exogym.sim.network import write_network_file

__all__ = ["CalibrateOptions", "calibrate", "measure_rank", "next_size"]

#: Untimed all-reduces of this many bytes per rank open the connections first.
WARMUP_BYTES = 1_000_000
WARMUP_ALL_REDUCES = 2
#: The 4-byte transfers (the latency) are repeated this many times more than the others:
#: cheap, and a single scheduling hiccup is a large share of their time.
LATENCY_REPS = 10
#: The smallest transfer above the 4-byte one; sizes grow by :data:`SIZE_FACTOR`.
FIRST_BYTES = 64 * 1024
SIZE_FACTOR = 4
_CC_PATH = Path("/proc/sys/net/ipv4/tcp_congestion_control")


@dataclass(frozen=True)
class CalibrateOptions:
    """What ``exogym calibrate`` measures.

    Attributes:
        reps: timed repeats of every case (the fit takes their median); >= 1.
        target_s: the largest all-reduce takes about this long, seconds (> 0): larger
            transfers average out the shaper's and TCP's bursts, smaller ones are quicker.
        max_bytes: the largest transfer, bytes (>= :data:`FIRST_BYTES`).
    """

    reps: int = 5
    target_s: float = 2.0
    max_bytes: int = 64_000_000

    def __post_init__(self) -> None:
        if isinstance(self.reps, bool) or not isinstance(self.reps, int) or self.reps < 1:
            raise ValueError(f"reps must be an integer >= 1, got {self.reps!r}")
        if not (isinstance(self.target_s, (int, float)) and self.target_s > 0):
            raise ValueError(f"target_s must be a number of seconds > 0, got {self.target_s!r}")
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or (
                self.max_bytes < FIRST_BYTES):
            raise ValueError(f"max_bytes must be an integer >= {FIRST_BYTES}, got "
                             f"{self.max_bytes!r}")


def next_size(sizes: Sequence[int], last_s: float, opts: CalibrateOptions) -> int | None:
    """The size to measure after ``sizes`` (the last of which took ``last_s``, the median of
    its repeats), or None when done: ``SIZE_FACTOR`` times the last while that is predicted
    (linearly) to take at most ``opts.target_s`` and stays within ``opts.max_bytes``; always
    at least two sizes above 4 bytes (a line needs them)."""
    if not sizes:
        return 4
    if sizes[-1] < FIRST_BYTES:
        return FIRST_BYTES
    grown = sizes[-1] * SIZE_FACTOR
    if grown > opts.max_bytes:
        return None
    if len(sizes) < 3 or last_s * SIZE_FACTOR <= opts.target_s:
        return grown
    return None


def _timed_all_reduce(x: torch.Tensor) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(x)
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
    return time.perf_counter() - t0


def _repeats(size: int, reps: int) -> int:
    """Timed repeats of a transfer of ``size`` bytes: the 4-byte one :data:`LATENCY_REPS`
    times as often."""
    return reps * (LATENCY_REPS if size <= 4 else 1)


def _all_reduces(nodes: int, opts: CalibrateOptions, device: str) -> list[Sample]:
    """Every size's all-reduces, the sizes growing by :func:`next_size` (every rank holds the
    same times after the MIN reduction, so every rank picks the same next size)."""
    out: list[Sample] = []
    size = next_size([], 0.0, opts)
    while size is not None:
        x = torch.ones(size // 4, device=device)
        times = [_timed_all_reduce(x) for _ in range(_repeats(size, opts.reps))]
        mine = torch.tensor(times, dtype=torch.float64, device=device)
        dist.all_reduce(mine, op=dist.ReduceOp.MIN)  # the last rank to arrive (see above)
        out.append(Sample("all_reduce", nodes, size, tuple(mine.tolist())))
        size = next_size([s.payload_bytes for s in out], out[-1].median_s, opts)
    return out


def _pingpong(src: int, dst: int, rank: int, sizes: Sequence[int], reps: int,
              device: str) -> list[tuple[int, list[float]]]:
    """One ordered pair's ping-pongs: on ``src`` its ``[(size, [seconds...])]``, else []."""
    pong = torch.zeros(1, device=device)
    out = []
    if rank not in (src, dst):
        return out
    warm = torch.ones(min(sizes[-1], WARMUP_BYTES) // 4, device=device)
    for size in [None, *sizes]:  # None: the untimed warm-up
        x = warm if size is None else torch.ones(size // 4, device=device)
        times = []
        for _ in range(1 if size is None else _repeats(size, reps)):
            if rank == src:
                t0 = time.perf_counter()
                dist.send(x, dst)
                dist.recv(pong, dst)
                if pong.is_cuda:
                    torch.cuda.synchronize(pong.device)
                times.append(time.perf_counter() - t0)
            else:
                dist.recv(x, src)
                dist.send(pong, src)
        if size is not None and rank == src:
            out.append((size, times))
    return out


def _congestion_control() -> str:
    try:
        return _CC_PATH.read_text().strip()
    except OSError:
        return "unknown"


def measure_rank(ctx: RankContext, opts: CalibrateOptions) -> dict[str, Any] | None:
    """This rank's part of the measurement (the module docstring's steps); every rank of the
    group must call it. Rank 0 returns ``{"samples": [Sample...], "ranks": [{host, cc}...],
    "sizes": [...]}``; the others None."""
    n, rank, device = ctx.world_size, ctx.rank, ctx.device
    if n < 2:
        raise ValueError("calibrate needs 2 or more ranks: there is no link to measure in one")
    for _ in range(WARMUP_ALL_REDUCES):  # untimed: connections and windows open
        dist.all_reduce(torch.ones(WARMUP_BYTES // 4, device=device))
    samples = _all_reduces(n, opts, device)
    sizes = [s.payload_bytes for s in samples]
    mine: list[Sample] = []
    for src in range(n):
        for dst in range(n):
            if src != dst:
                for size, times in _pingpong(src, dst, rank, sizes, opts.reps, device):
                    mine.append(Sample("pingpong", n, size, tuple(times), src, dst))
                dist.barrier()
    info = {"host": socket.gethostname(), "cc": _congestion_control(), "rank": rank}
    gathered: list[Any] = [None] * n
    dist.all_gather_object(gathered, ([s.to_dict() for s in mine], info))
    if rank != 0:
        return None
    for part, _ in gathered:
        samples += [Sample.from_dict(d) for d in part]
    return {"samples": samples, "ranks": [i for _, i in gathered], "sizes": sizes}


def calibrate(measured: dict[str, Any], out: str | Path, *, name: str = "calibrated",
              backend: str = "gloo", opts: CalibrateOptions | None = None,
              per_node: bool | None = None) -> Fit:
    """Fit rank 0's measurements (:func:`measure_rank`) and write the network file ``out``:
    the fitted network, and under ``"calibration"`` when, where and how it was measured (each
    rank's host and congestion control, the backend), the fit and every sample with its
    residual. ``per_node``: see :func:`~exogym.sim.calibration.fit_network`. Returns the
    fit."""
    ranks = measured["ranks"]
    ccs = sorted({r["cc"] for r in ranks})
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    description = (f"measured by exogym calibrate on {when}: {len(ranks)} ranks, {backend}, "
                   f"TCP congestion control {'/'.join(ccs)}")
    fit = fit_network(measured["samples"], name=name, description=description,
                      per_node=per_node)
    write_network_file(out, fit.network, {"calibration": {
        "date": when, "backend": backend, "ranks": ranks, "sizes": measured["sizes"],
        "python": platform.python_version(), "torch": torch.__version__,
        "options": asdict(opts or CalibrateOptions()), **fit.to_dict()}})
    return fit
