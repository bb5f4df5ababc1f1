"""A run's timeline as a picture: ``timeline.png``, drawn from its Chrome trace
(:mod:`exogym.run.output.trace`).

One row per node (for more than :data:`MAX_ROWS` nodes a sample, named on the axis: evenly
spaced nodes plus those that were down or idle the longest), and the server's two links for an
asynchronous strategy. Time runs left to right in simulated seconds, cut into
:data:`BINS` columns; in each column a row is filled bottom up with the share of that time the
node spent computing, communicating, idle and down (so a 1 ms all-reduce after a 1 s step is a
thin band, and a failure a solid block); a server link's row has a tick per message. Merged
steps (:mod:`exogym.sim.spans`) spread their summed times evenly over their stretch. Failures,
rejoins, deadline cuts and lost messages are marked on their node's row.

Uses matplotlib (a core dependency), imported only here, with the Agg backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["BINS", "COLORS", "MAX_ROWS", "plot_trace"]

MAX_ROWS = 24
BINS = 800
COLORS = {"compute": "#59a14f", "comm": "#4e79a7", "idle": "#d9d9d9", "down": "#e15759"}
_KINDS = tuple(COLORS)
_MARKS = {  # instant event name: (marker, colour, label)
    "failure": ("v", "#000000", "failure"),
    "rejoin": ("^", "#1b7837", "rejoin"),
    "deadline cut": ("d", "#8e44ad", "deadline cut"),
    "message lost": ("x", "#555555", "message lost"),
}


def plot_trace(trace: dict[str, Any], path: str | Path) -> Path:
    """Draw ``trace`` (a run's Chrome trace) into ``path`` (a PNG); the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    nodes = sorted(p for p, n in names.items() if n != "server")
    rows = _rows(events, nodes, names)
    end = max((e["ts"] + e.get("dur", 0.0) for e in events if e["ph"] == "X"), default=1.0)
    end = max(end, 1e-9) / 1e6
    fig, ax = plt.subplots(figsize=(11, 1.3 + 0.32 * len(rows)), dpi=110)
    edges = np.linspace(0.0, end, BINS + 1)
    for y, (pid, _, spans) in enumerate(rows):
        if pid not in nodes:  # a server link: a tick per message (each is short)
            ax.vlines([(s["ts"] + s["dur"] / 2) / 1e6 for s in spans], y - 0.4, y + 0.4,
                      color=COLORS["comm"], lw=0.8)
            continue
        shares = _shares(_pieces(spans, edges[1] - edges[0]), edges)
        base = np.zeros(BINS)
        for k, kind in enumerate(_KINDS):
            top = base + shares[k]
            ax.fill_between(edges, np.append(y + 0.4 - base * 0.8, y + 0.4 - base[-1] * 0.8),
                            np.append(y + 0.4 - top * 0.8, y + 0.4 - top[-1] * 0.8),
                            step="post", color=COLORS[kind], lw=0, label=kind if y == 0 else None)
            base = top
    _marks(ax, events, [pid for pid, _, _ in rows])
    ax.set_yticks(range(len(rows)), [label for _, label, _ in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0.0, end)
    ax.set_xlabel("simulated time (s)")
    ax.set_title(_title(trace, len(nodes), sum(1 for p, _, _ in rows if p in nodes)),
                 fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def _rows(events: Sequence[dict[str, Any]], nodes: Sequence[int],
          names: dict[int, str]) -> list[tuple[int, str, list[dict[str, Any]]]]:
    """``(pid, label, top-level spans)`` of each row drawn: the nodes (a sample of them) and the
    server's links."""
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in events:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    top = {pid: _top_level(tracks.get((pid, 0), [])) for pid in nodes}
    shown = list(nodes)
    if len(nodes) > MAX_ROWS:
        def most(kind: str) -> list[int]:
            return sorted(nodes, key=lambda p: -sum(_seconds(s)[kind] for s in top[p]))[:2]

        even = [nodes[round(k * (len(nodes) - 1) / (MAX_ROWS - 5))] for k in range(MAX_ROWS - 4)]
        shown = sorted(set(even) | set(most("down")) | set(most("idle")))
    rows = [(pid, names[pid], top[pid]) for pid in shown]
    server = [p for p, n in names.items() if n == "server"]
    for pid in server:
        for tid, label in ((0, "server: receiving"), (1, "server: sending")):
            rows.append((pid, label, tracks.get((pid, tid), [])))
    return rows


def _top_level(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The spans not inside another (a merged span's detail is inside it), each with the
    spans inside it under ``"inside"``."""
    out: list[dict[str, Any]] = []
    until = -1
    for s in sorted(spans, key=lambda e: (e["ts"], -e["dur"])):
        if round(s["ts"] * 1000) < until:  # to the nanosecond, the trace's resolution
            out[-1]["inside"].append(s)
            continue
        out.append({**s, "inside": []})
        until = round(s["ts"] * 1000) + round(s["dur"] * 1000)
    return out


def _pieces(spans: Sequence[dict[str, Any]], width: float) -> list[dict[str, Any]]:
    """What to spread over the columns: merged steps that each took exactly the first one's
    times (``same``) and are wider than a column (``width`` seconds) as their first step
    repeated; every other span as it is."""
    out: list[dict[str, Any]] = []
    for s in spans:
        first = s.get("inside", [])
        period = sum(c["dur"] for c in first)
        if not (s["cat"] == "steps" and s["args"].get("same") and first
                and period / 1e6 > width):
            out.append(s)
            continue
        for k in range(int(s["args"]["count"])):
            out += [{**c, "ts": c["ts"] + k * period} for c in first]
    return out


def _seconds(span: dict[str, Any]) -> dict[str, float]:
    """A span's seconds per kind (a merged span's from its args)."""
    if span["cat"] in COLORS:
        return {k: span["dur"] / 1e6 if k == span["cat"] else 0.0 for k in _KINDS}
    args = span.get("args", {})
    if span["cat"] == "steps":  # merged steps: seconds per kind in its args (none: 0)
        return {k: float(args.get(f"{k}_s", 0.0)) for k in _KINDS}
    return {k: span["dur"] / 1e6 if k == "comm" else 0.0 for k in _KINDS}  # a link's messages


def _shares(spans: Sequence[dict[str, Any]], edges: np.ndarray) -> np.ndarray:
    """``[kind, bin]``: the share of each bin's time spent on each kind (each span's seconds
    spread evenly over its stretch)."""
    width = edges[1] - edges[0]
    out = np.zeros((len(_KINDS), len(edges) - 1))
    for s in spans:
        start, dur = s["ts"] / 1e6, s["dur"] / 1e6
        if dur <= 0:
            continue
        seconds = _seconds(s)
        lo, hi = edges[:-1], edges[1:]
        i0 = max(int(start / width), 0)
        i1 = min(int((start + dur) / width) + 1, len(lo))
        overlap = np.clip(np.minimum(hi[i0:i1], start + dur) - np.maximum(lo[i0:i1], start),
                          0.0, None) / dur
        for k, kind in enumerate(_KINDS):
            if seconds[kind]:
                out[k, i0:i1] += seconds[kind] * overlap / width
    return np.clip(out, 0.0, 1.0)


def _marks(ax: Any, events: Sequence[dict[str, Any]], pids: Sequence[int]) -> None:
    """The world's events on the rows of their nodes."""
    where = {pid: y for y, pid in enumerate(pids) if pid not in pids[:y]}
    for name, (marker, color, label) in _MARKS.items():
        pts = [(e["ts"] / 1e6, where[e["pid"]]) for e in events
               if e["ph"] == "i" and e["name"] == name and e["pid"] in where]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.scatter(xs, ys, marker=marker, s=28, color=color, zorder=3, label=label,
                       linewidths=1.2)


def _title(trace: dict[str, Any], nodes: int, shown: int) -> str:
    meta = trace.get("otherData", {}).get("exogym", {})
    parts = [f"{meta.get('strategy', 'run')}: {nodes} nodes"]
    if meta.get("steps"):
        parts[0] += f", {meta['steps']:,} steps"
    if meta.get("network"):
        parts.append(f"network {meta['network']}")
    if meta.get("world") not in (None, "perfect"):
        parts.append(f"world {meta['world']}")
    title = "; ".join(parts)
    if shown < nodes:
        title += f"\n{shown} of {nodes} nodes shown (evenly spaced, and those down or idle longest)"
    return title
