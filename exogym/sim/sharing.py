"""One link shared by the transfers through it, as TCP flows share a bottleneck: processor
sharing with per-flow caps (max-min fairness; Bertsekas and Gallager, *Data Networks*, 1992,
section 6.5.2).

At every instant each active flow ``i`` gets ``min(cap_i, f)``, ``f`` the fair share found by
water-filling: the link's rate ``C`` split equally among the active flows, a flow whose cap is
below the equal share keeping only its cap and leaving the rest to the others
(:func:`water_fill`). The rates change only when a flow starts or finishes, or the link's rate
steps (a link partly taken by transfers priced before), so :func:`share_link` computes the
finish times event by event. :mod:`exogym.sim.server` prices a server's link with it.

Rates are bits per second, sizes bits, times seconds. A rate over time is a list of
:data:`Step` ``(from, bits/s)``: the first from ``-inf``, each holding until the next.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["Flow", "Shared", "Step", "add_steps", "finish_times", "prune_steps", "share_link",
           "water_fill"]

#: ``(from, bits/s)``: one piece of a rate over time (it holds until the next piece's start).
Step = tuple[float, float]

# A flow whose bits left are below this fraction of its bits (float rounding of a finish shared
# with another flow) has finished.
_DONE = 1e-12


@dataclass(frozen=True)
class Flow:
    """A transfer through the link: it starts at ``start`` (s) with ``bits`` to send and never
    goes faster than ``cap`` (bits/s: its own end's link)."""

    start: float
    bits: float
    cap: float


class Shared(NamedTuple):
    """What :func:`share_link` found, per flow in the order given, and the link's use."""

    #: when each flow's last bit was through (``inf``: not by the stop)
    finish: list[float]
    #: each flow as it stands at the stop: from then, its bits left (0 once finished, from its
    #: finish; a flow not started yet unchanged), so that sharing resumes exactly from there
    left: list[Flow]
    #: the rate the flows took together over time, up to the stop (0 after the last finish)
    used: list[Step]


def water_fill(caps: Sequence[float], capacity: float) -> list[float]:
    """Max-min fair rates of flows capped at ``caps`` sharing ``capacity``: in increasing cap
    order each takes ``min(cap, what is left / flows left)``; a flow capped below its equal
    share leaves the rest to the flows after it. ``capacity`` may be ``inf`` (each its cap)."""
    rates = [0.0] * len(caps)
    left, n = capacity, len(caps)
    for i in sorted(range(len(caps)), key=caps.__getitem__):
        rates[i] = min(caps[i], left / n)
        left, n = max(left - rates[i], 0.0), n - 1
    return rates


def share_link(flows: Sequence[Flow], capacity: float | Sequence[Step], *,
               stop: float = math.inf, first: bool = False) -> Shared:
    """Processor sharing of a link of rate ``capacity`` (bits/s, or a rate over time) by
    ``flows``: event by event (a flow starts or finishes, the rate steps) the active flows get
    :func:`water_fill`'s rates. Runs until every flow has finished, or until ``stop``, or
    (``first``) until the first time a flow finishes; :class:`Shared` says when each finished
    and where the others stand. A flow that starts later changes nothing before its start, so
    resuming from ``left`` with more flows gives what one run over all of them gives."""
    steps = [(-math.inf, float(capacity))] if isinstance(capacity, (int, float)) else capacity
    finish, left = [math.inf] * len(flows), [f.bits for f in flows]
    # the flows not started yet, the next one last
    waiting = sorted(range(len(flows)), key=lambda i: (flows[i].start, i), reverse=True)
    active: list[int] = []
    used: list[Step] = [(-math.inf, 0.0)]
    t = min(min((f.start for f in flows), default=stop), stop)
    while waiting or active:
        done = False
        while waiting and flows[waiting[-1]].start <= t:
            i = waiting.pop()
            if left[i] > 0:
                active.append(i)
            else:  # nothing to send: finished as it starts
                finish[i], done = t, True
        if done and first:
            break
        c = bisect.bisect_right(steps, t, key=lambda s: s[0]) - 1  # the rate in force at t
        rates = water_fill([flows[i].cap for i in active], steps[c][1])
        _note(used, t, sum(rates))
        eta = [t + left[i] / r if r > 0 else math.inf for i, r in zip(active, rates, strict=True)]
        end = min([*eta, flows[waiting[-1]].start if waiting else math.inf,
                   steps[c + 1][0] if c + 1 < len(steps) else math.inf])
        if end == math.inf and stop == math.inf:
            break  # no rate left for the active flows, ever: they never finish
        if end > stop:
            for i, r in zip(active, rates, strict=True):
                left[i] -= r * (stop - t)
            t = stop
            break
        for i, r, e in zip(active, rates, eta, strict=True):
            left[i] = 0.0 if e <= end else left[i] - r * (end - t)
            if left[i] <= _DONE * flows[i].bits:
                finish[i], left[i], done = end, 0.0, True
        active = [i for i in active if finish[i] == math.inf]
        t = end
        if done and first:
            break
    if not active:
        _note(used, t, 0.0)
    return Shared(finish, [_left(f, finish[i], left[i], t) for i, f in enumerate(flows)], used)


def finish_times(flows: Sequence[Flow], link_bps: float) -> list[float]:
    """When each of ``flows`` has finished through a link of ``link_bps`` shared by them alone
    (:func:`share_link`)."""
    return share_link(flows, link_bps).finish


def add_steps(a: Sequence[Step], b: Sequence[Step]) -> list[Step]:
    """The sum of two rates over time (each from ``-inf``), equal neighbours merged."""
    out: list[Step] = []
    i = j = 0
    for t in sorted({s for s, _ in a} | {s for s, _ in b}):
        while i + 1 < len(a) and a[i + 1][0] <= t:
            i += 1
        while j + 1 < len(b) and b[j + 1][0] <= t:
            j += 1
        value = a[i][1] + b[j][1]
        if not out or out[-1][1] != value:
            out.append((t, value))
    return out


def prune_steps(steps: Sequence[Step], before: float) -> list[Step]:
    """``steps`` as seen from ``before`` on: the pieces that ended earlier dropped."""
    k = bisect.bisect_right(steps, before, key=lambda s: s[0]) - 1
    return [(-math.inf, steps[k][1]), *steps[k + 1:]]


def _note(used: list[Step], t: float, rate: float) -> None:
    if used[-1][0] == t:
        used.pop()
    if used[-1][1] != rate:
        used.append((t, rate))


def _left(flow: Flow, finish: float, bits: float, t: float) -> Flow:
    if finish < math.inf:
        return Flow(finish, 0.0, flow.cap)
    return flow if flow.start >= t else Flow(t, bits, flow.cap)
