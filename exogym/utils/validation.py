"""Validation helpers shared by every config: a bad value is an error naming it and what is allowed.

Floats must be finite wherever a range is checked (``nan`` fails every comparison and ``inf`` is
never a meaningful learning rate, momentum or bandwidth), and bools are not numbers here
(``True`` is an ``int`` to Python, never to a user).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_int", "check_number", "in_range", "positive_int"]


def check_int(name: str, value: Any, minimum: int | None = None,
              maximum: int | None = None) -> int:
    """``value`` must be an int (not a bool) in ``[minimum, maximum]``; returns it."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    ok = ok and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
    if not ok:
        if minimum is not None and maximum is not None:
            want = f"an integer in [{minimum}, {maximum}]"
        elif minimum is not None:
            want = f"an integer >= {minimum}"
        elif maximum is not None:
            want = f"an integer <= {maximum}"
        else:
            want = "an integer"
        raise ValueError(f"{name} must be {want}, got {value!r}")
    return value


def positive_int(name: str, value: Any) -> None:
    """``value`` must be an int >= 1 (bools rejected)."""
    check_int(name, value, 1)


def check_number(name: str, value: Any, *, lo: float = -math.inf, hi: float = math.inf,
                 lo_open: bool = False, hi_open: bool = False) -> float:
    """``value`` must be a finite real number (not a bool) in the given range; returns it as a
    float. Infinite bounds mean "no bound" (the value itself must still be finite)."""
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))
    if ok:
        ok = (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        raise ValueError(f"{name} must be {_describe(lo, hi, lo_open, hi_open)}, got {value!r}")
    return float(value)


def in_range(name: str, value: Any, lo: float, hi: float, *, lo_open: bool = False,
             hi_open: bool = False) -> None:
    """``lo <= value <= hi`` (or strict where ``*_open``), ``value`` finite."""
    check_number(name, value, lo=lo, hi=hi, lo_open=lo_open, hi_open=hi_open)


def _describe(lo: float, hi: float, lo_open: bool, hi_open: bool) -> str:
    if math.isinf(lo) and math.isinf(hi):
        return "a finite number"
    if math.isinf(hi):
        return f"a finite number {'>' if lo_open else '>='} {lo:g}"
    if math.isinf(lo):
        return f"a finite number {'<' if hi_open else '<='} {hi:g}"
    lb, rb = ("(" if lo_open else "["), (")" if hi_open else "]")
    return f"in {lb}{lo}, {hi}{rb}"
