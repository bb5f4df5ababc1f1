"""A real ``--ft`` run's failures replayed in the simulator, and the two runs compared.

:func:`world_of` turns the events of a ``--ft`` run folder (``events.jsonl``: which node failed
at which step, at which step it healed) into a ``--world`` spec (``fail=NODE@STEP,
rejoin=NODE@STEP,...``); the simulator trains the same strategy, seed and data on it; and
:func:`compare` puts the two runs' outages and losses side by side:

- **outages**: ``(node, fail step)``, ``(node, rejoin step, donor)`` in each run; equal when the
  simulated world means by a failure and a recovery what torchft did (a node out from the step
  it did not commit; back, from the global model, at the step it healed);
- **losses**: per step, the real run's (the mean of the replicas that committed the step) and
  the simulated one's (the mean of the nodes that computed it); their mean and largest absolute
  difference.

What differs by construction: a real heal moves the donor's whole state (its nodes, the
strategy's ``state_dict``, the data position), the simulated recovery counts what the node needs
(the global model, the outer optimizer's state, the inner optimizer's rows); torchft picks the
donor (the simulator: the lowest live node); a dead replica's nodes skip their batches in the
real run (every replica draws every node's indices each step) where a simulated down node's
data wait for it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["compare", "losses", "outages", "world_of"]


def _events(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def outages(events: Sequence[dict[str, Any]]) -> dict[str, list[tuple[int, ...]]]:
    """A run's outages: ``fail`` ``(node, step)`` and its ``recovery`` ``(node, step, donor)``,
    sorted. A death that cost no step (the node healed at the very step it died in: the others
    could not commit it without the node, ``min_replicas``) is not an outage and is left out."""
    fails = sorted((int(e["node"]), int(e["step"])) for e in events if e["event"] == "fail")
    heals = sorted((int(e["node"]), int(e["step"]), int(e["donor"])) for e in events
                   if e["event"] == "recovery")
    out: dict[str, list[tuple[int, ...]]] = {"fail": [], "recovery": []}
    for node, step in fails:
        back = [h for h in heals if h[0] == node and h[1] >= step]
        if back and back[0][1] == step:
            heals.remove(back[0])
            continue
        out["fail"].append((node, step))
        if back:
            out["recovery"].append(back[0])
            heals.remove(back[0])
    out["recovery"].sort()
    return out


def world_of(run_dir: str | Path) -> str | None:
    """The ``--world`` spec of a ``--ft`` run's failures: each node's ``fail`` at the step it
    did not commit and ``rejoin`` at the step it healed (none: it never came back). None when
    nothing failed."""
    out = outages(_events(run_dir))
    items = []
    for node, step in out["fail"]:
        items.append(f"fail={node}@{step}")
        back = [s for n, s, _ in out["recovery"] if n == node and s > step]
        if back:
            items.append(f"rejoin={node}@{min(back)}")
    return ",".join(items) or None


def losses(run_dir: Path, real: bool) -> dict[int, float]:
    """Step -> train loss: a real run's rows are keyed by the step computed, a simulated run's
    by the steps done (its row ``k`` is the loss of step ``k - 1``)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    shift = 0 if real else 1
    return {int(r["step"]) - shift: float(r["train_loss"]) for r in rows
            if r.get("train_loss") is not None}


def compare(real_dir: str | Path, sim_dir: str | Path) -> dict[str, Any]:
    """The two runs side by side: their outages (equal or not) and their losses' mean and
    largest absolute difference over the steps both logged."""
    real_dir, sim_dir = Path(real_dir), Path(sim_dir)
    real, sim = outages(_events(real_dir)), outages(_events(sim_dir))
    a, b = losses(real_dir, True), losses(sim_dir, False)
    steps = sorted(set(a) & set(b))
    diffs = [abs(a[s] - b[s]) for s in steps]
    return {
        "fail_equal": real["fail"] == sim["fail"],
        "rejoin_equal": [h[:2] for h in real["recovery"]] == [h[:2] for h in sim["recovery"]],
        "donor_equal": real["recovery"] == sim["recovery"],
        "real": real, "sim": sim, "steps": len(steps),
        "loss_mean_abs": sum(diffs) / len(diffs) if diffs else None,
        "loss_max_abs": max(diffs) if diffs else None,
    }
