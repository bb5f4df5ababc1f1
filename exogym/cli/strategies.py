"""``exogym strategies``: the registered strategies with their hyperparameters and defaults
(what ``--set KEY=VALUE`` takes)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from exogym.utils.config import config_fields

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    strat = sub.add_parser("strategies",
                           help="list strategies with their hyperparameters and defaults")
    strat.add_argument("ids", nargs="*", metavar="ID",
                       help="show only these strategies (default: every registered one)")


def command(args: argparse.Namespace) -> int:
    """The settings every strategy shares, once; then each strategy's own (and any shared one
    whose default it changes)."""
    from exogym import strategy as strategies

    chosen = list(args.ids) or strategies.registry()
    classes = {sid: strategies.get(sid) for sid in chosen}  # an unknown id: error, listing all
    common = config_fields(strategies.StackedStrategy)

    def show(spec: dict[str, tuple[object, object, str]], keys: list[str]) -> None:
        width = max(len(k) for k in keys)
        for key in keys:
            _tp, default, help_text = spec[key]
            print(f"    {key:<{width}}  = {default!r:<14} {help_text.replace('``', '')}")

    print("shared by every strategy (--set KEY=VALUE):")
    show(common, list(common))
    for sid, cls in classes.items():
        print()
        print(f"{sid}  ({cls.__name__}): {_summary_line(cls)}")
        spec = strategies.describe(sid)
        own = [k for k in spec if k not in common or spec[k][1] != common[k][1]]
        if own:
            show(spec, own)
        else:
            print("    (only the shared settings)")
    return 0


def _summary_line(cls: type) -> str:
    """The first line of the strategy's module docstring (a built-in's names its paper), else of
    its class's own docstring (not the signature a dataclass makes up), else a placeholder."""
    own = cls.__dict__.get("__doc__") or ""
    if own.startswith(f"{cls.__name__}("):  # dataclasses' generated ``Name(field=..., ...)``
        own = ""
    for doc in (sys.modules[cls.__module__].__doc__, own):
        lines = (doc or "").strip().splitlines()
        if lines:
            return lines[0]
    return "(no docstring)"
