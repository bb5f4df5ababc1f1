"""How the lab's tables show a number: bytes in decimal units, a final metric as a percentage or
with 4 decimals.

Shared by the comparison report (:mod:`exogym.lab.report`), the sweep report
(:mod:`exogym.lab.sweep_report`) and the estimate tables (:mod:`exogym.lab.estimate`); imports
nothing of exogym, so that any of them can use it.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["format_bytes", "format_metric"]


def format_bytes(n: float) -> str:
    """``14e9`` -> ``"14.00 GB"`` (decimal units)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} PB"


def format_metric(key: str) -> Callable[[float], str]:
    """How a final metric ``key`` is shown in a table (a function of its value): accuracy and
    utilization as a percentage with 2 decimals, anything else (a loss, a perplexity) with 4."""
    if "accuracy" in key or key == "utilization":
        return lambda v: f"{100 * v:.2f}%"
    return lambda v: f"{v:.4f}"
