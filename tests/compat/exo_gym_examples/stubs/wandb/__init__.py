"""A stand-in for W&B in tests (no account, no network): each ``init`` and each ``log`` is
appended as a JSON line to ``$EXOGYM_STUB_WANDB_LOG``, for the test to read back."""

from __future__ import annotations

import json
import os
from typing import Any


def _write(record: dict[str, Any]) -> None:
    with open(os.environ["EXOGYM_STUB_WANDB_LOG"], "a", encoding="utf-8") as f:
        f.write(json.dumps(record, default=str) + "\n")


class Run:
    """A run as exogym's WandbSink uses it: ``id``, ``log``, ``summary``, ``finish``."""

    def __init__(self, name: str | None) -> None:
        self.id, self.name, self.summary = f"stub-{name}", name, {}

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        _write({"log": self.name, "step": step, "metrics": metrics})

    def finish(self, exit_code: int = 0) -> None:
        _write({"finish": self.name, "exit_code": exit_code, "summary": self.summary})


def init(**kwargs: Any) -> Run:
    _write({"init": kwargs.get("name"), "project": kwargs.get("project"),
            "config": kwargs.get("config")})
    return Run(kwargs.get("name"))
