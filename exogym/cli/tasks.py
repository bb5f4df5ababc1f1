"""``exogym tasks``: the benchmark tasks, built-in and installed."""

from __future__ import annotations

import argparse
from typing import Any

from exogym.cli.common import get_task

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    sub.add_parser("tasks", help="list benchmark tasks")


def command(args: argparse.Namespace) -> int:
    from exogym.tasks.registry import TASKS, plugin_tasks

    for task in TASKS.values():
        print(f"{task.id}: {task.description} (batch {task.batch_size}/node, lr {task.lr})")
    for name, entry in plugin_tasks().items():  # installed packages' (entry points)
        task = get_task(name)
        print(f"{name}: {task.description} (batch {task.batch_size}/node, lr {task.lr}; "
              f"installed, {entry})")
    return 0
