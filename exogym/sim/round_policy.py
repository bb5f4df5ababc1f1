"""A synchronous round as deployed federated systems run it: over-selection, a report deadline, a
minimum number of reports, and clients that drop out.

Google's system (Bonawitz et al., "Towards Federated Learning at Scale: System Design", MLSys
2019, section 2.2) selects more devices than a round needs (130% of the target), takes the
round as done when enough have reported, and abandons a round that does not get enough reports
before its timeout. FedScale (SymbioticLab/FedScale at commit 7ec441c,
``fedscale/cloud/aggregation/aggregator.py``, ``tictak_client_tasks``, read to understand, not
copied) simulates the same: it samples ``overcommitment x K`` clients, drops those whose
availability has ended by the time they would report, sorts the rest by completion time
(download, compute, upload over the client's own link) and keeps the first ``K``; the round
lasts as long as the ``K``-th. :class:`RoundPolicy` (``--round-policy``) gives a population's
rounds those rules:

- ``over_selection`` ``r >= 1``: each round draws ``ceil(r K)`` clients, all of whom train; the
  first ``K`` reports to reach the server are aggregated, the others are **discarded**;
- ``deadline`` ``T``: a report reaching the server more than ``T`` seconds after the round
  started (the previous round's release) is **late** and discarded;
- ``min_reports`` ``M``: a round with fewer than ``M`` reports kept is **abandoned**: nothing is
  aggregated (the global model stays as it was; the round's time is spent);
- ``dropouts`` (on by default): a client whose availability (the world's ``trace`` or
  ``online``) has ended when its report would reach the server **drops out** (tested at that
  instant, as FedScale does).

A report's time is the client's compute finish plus its upload of the round's payload over its
own uplink (``topology=server``; with a server rate, every drawn client's upload shares the
server's link: :func:`exogym.sim.server.upload_arrivals`). The round's release is the last kept
report's arrival; every client not kept is let go then (its seat's clock stops at the release,
or waits until it). Each discarded, late, dropped or abandoned client is an event
(``events.jsonl``, the timeline) and a count in ``summary.json``'s ``population``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from exogym.sim.network import parse_duration

__all__ = ["Outcome", "RoundPolicy", "decide", "parse_round_policy"]

_KEYS = ("over_selection", "deadline", "min_reports", "dropouts")
MOST_OVER_SELECTION = 10.0
"""The largest over-selection taken: ten times the clients a round aggregates (deployed
systems draw 1.3 times, Bonawitz et al. 2019); more overflowed the count of clients drawn."""
LONGEST_DEADLINE_S = 1e7
"""The longest round deadline taken (116 days): longer ones overflow the clock's times."""


@dataclass(frozen=True)
class RoundPolicy:
    """A population's round rules (module docstring).

    Attributes:
        over_selection: ``r >= 1``: draw ``ceil(r K)`` clients, aggregate the first ``K``.
        deadline_s: reports later than this after the round's start are discarded; None:
            none.
        min_reports: ``M``: fewer reports kept abandons the round.
        dropouts: clients whose availability ends before they report drop out.
    """

    over_selection: float = 1.0
    deadline_s: float | None = None
    min_reports: int = 1
    dropouts: bool = True

    def __post_init__(self) -> None:
        r = self.over_selection
        if not (isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r)
                and 1.0 <= r <= MOST_OVER_SELECTION):
            raise ValueError(f"round policy over_selection must be a number in [1, "
                             f"{MOST_OVER_SELECTION:g}] (1.3: draw 30% more clients than a "
                             f"round aggregates), got {r!r}")
        d = self.deadline_s
        if d is not None and not (isinstance(d, (int, float)) and not isinstance(d, bool)
                                  and math.isfinite(d) and 0 < d <= LONGEST_DEADLINE_S):
            raise ValueError(f"round policy deadline must be a duration in (0, "
                             f"{LONGEST_DEADLINE_S:g}] seconds (e.g. 30s), got {d!r}")
        m = self.min_reports
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"round policy min_reports must be an integer >= 1, got {m!r}")
        if not isinstance(self.dropouts, bool):
            raise ValueError(f"round policy dropouts must be on or off, got {self.dropouts!r}")

    def drawn(self, k: int) -> int:
        """The clients a round of ``k`` reports draws: ``ceil(r k)``."""
        return math.ceil(self.over_selection * k - 1e-9)

    def check(self, k: int) -> None:
        """Raise ValueError if ``min_reports`` exceeds the ``k`` reports a round keeps."""
        if self.min_reports > k:
            raise ValueError(f"round policy min_reports={self.min_reports} is more than the "
                             f"{k} reports a round aggregates (participation)")

    def spec(self) -> str:
        items = [f"over_selection={self.over_selection:g}"]
        if self.deadline_s is not None:
            items.append(f"deadline={self.deadline_s:g}s")
        items.append(f"min_reports={self.min_reports}")
        items.append(f"dropouts={'on' if self.dropouts else 'off'}")
        return ",".join(items)

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec(), "over_selection": self.over_selection,
                "deadline_s": self.deadline_s, "min_reports": self.min_reports,
                "dropouts": self.dropouts}


@dataclass(frozen=True)
class Outcome:
    """What a round's rules made of its reports.

    Attributes:
        kept: the seats whose reports are aggregated, in seat order.
        fates: every other reporting seat's fate: ``"discarded"`` (over-selection),
            ``"late"`` (the deadline), ``"dropout"``, ``"abandoned"`` (the round got too few).
        release: when the server has the last report it keeps (the round's start if none).
    """

    kept: list[int]
    fates: dict[int, str]
    release: float

    @property
    def abandoned(self) -> bool:
        return not self.kept


def decide(policy: RoundPolicy, k: int, start: float, reports: dict[int, float],
           gone: set[int]) -> Outcome:
    """The round's outcome from each seat's report time (``reports``, seconds on the clock),
    the seats that dropped out (``gone``), the round's ``start`` and its ``k`` reports wanted:
    dropouts out, then late reports, then the first ``k`` by arrival (ties by seat) kept; fewer
    than ``min_reports`` kept abandons the round."""
    fates = {seat: "dropout" for seat in reports if seat in gone}
    on_time = []
    for seat, at in reports.items():
        if seat in gone:
            continue
        if policy.deadline_s is not None and at - start > policy.deadline_s * (1 + 1e-12):
            fates[seat] = "late"
        else:
            on_time.append((at, seat))
    on_time.sort()
    kept = sorted(seat for _, seat in on_time[:k])
    for _, seat in on_time[k:]:
        fates[seat] = "discarded"
    if len(kept) < policy.min_reports:
        fates.update({seat: "abandoned" for seat in kept})
        return Outcome([], fates, start)
    return Outcome(kept, fates, max(reports[s] for s in kept))


def parse_round_policy(spec: str | RoundPolicy | None) -> RoundPolicy | None:
    """``"over_selection=1.3,deadline=60s,min_reports=8,dropouts=off"`` (any of them), a
    :class:`RoundPolicy`, or None (none: every drawn client reports)."""
    if spec is None or isinstance(spec, RoundPolicy):
        return spec
    values: dict[str, Any] = {}
    for item in [s.strip() for s in str(spec).split(",") if s.strip()]:
        key, sep, text = (p.strip() for p in item.partition("="))
        if not sep or key not in _KEYS:
            raise ValueError(f"round policy items are key=value with keys {', '.join(_KEYS)}; "
                             f"got {item!r} in {spec!r}")
        if key in values or (key == "deadline" and "deadline_s" in values):
            raise ValueError(f"round policy {key} given twice in {spec!r}")
        try:
            if key == "over_selection":
                values[key] = float(text)
            elif key == "deadline":
                values["deadline_s"] = parse_duration(text)
            elif key == "min_reports":
                values[key] = int(text)
            elif text in ("on", "off"):
                values[key] = text == "on"
            else:
                raise ValueError(f"takes on or off, got {text!r}")
        except ValueError as err:
            raise ValueError(f"round policy {key}={text}: {err}") from None
    return RoundPolicy(**values)
