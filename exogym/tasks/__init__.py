"""Benchmark tasks (a model, its data and defaults under a versioned id), their models and data."""

from exogym.tasks.registry import ALIASES, TASKS, CifarCNN, Task, get_task

__all__ = ["ALIASES", "TASKS", "CifarCNN", "Task", "get_task"]
