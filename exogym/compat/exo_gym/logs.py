"""EXO Gym's logs of a run: its ``logs/RUN_NAME`` CSV files, and W&B against the examples trained.

EXO Gym (github.com/exo-explore/gym at commit 9fa323c, ``exogym/aux/logger.py``) wrote a run's
rows to ``logs/RUN_NAME/train.csv`` and ``validation.csv`` (its ``CSVLogger``), or to W&B with the
step or the examples trained as x axis (its ``WandbLogger(x_axis=)``). These are exogym sinks
(:mod:`exogym.run.output.sinks`) that write the same, from exogym's rows;
:mod:`exogym.compat.exo_gym.fit_form` adds them to a ``fit`` call in EXO Gym's form.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from exogym.run.output.sinks import CSVSink, WandbSink

__all__ = ["ExamplesAxisWandb", "ExoGymCSVLogs"]


class ExoGymCSVLogs:
    """EXO Gym's ``logs/RUN_NAME`` folder: ``train.csv``, ``validation.csv`` (EXO Gym's
    columns, written row by row by two :class:`exogym.run.output.sinks.CSVSink`) and ``config.json``
    (exogym's config). A folder that already holds them is an error (EXO Gym overwrote them)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._train = CSVSink(self.folder / "train.csv")
        self._val = CSVSink(self.folder / "validation.csv")

    def start(self, config: dict[str, Any], run_dir: Path | None) -> None:
        taken = [n for n in ("train.csv", "validation.csv") if (self.folder / n).exists()]
        if taken:
            raise FileExistsError(f"{self.folder} already holds a run's logs ({', '.join(taken)});"
                                  " give another run_name, or move that folder")
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "config.json").write_text(json.dumps(config, indent=2, default=str))
        self._train.start(config, None)
        self._val.start(config, None)

    def log(self, row: dict[str, Any]) -> None:
        step, loss = row["step"], row.get("train_loss")
        if loss is not None and step > 0:  # EXO Gym numbers a step's row by the steps before it
            self._train.log({"step": step - 1, "examples_trained": row.get("samples"),
                             "train_loss": loss, "train_perplexity": _exp(loss),
                             "lr": row.get("lr")})
        if "eval_loss" in row:
            self._val.log({"step": step, "local_loss": None, "local_perplexity": None,
                           "global_loss": row["eval_loss"],
                           "global_perplexity": _exp(row["eval_loss"])})

    def finish(self, summary: dict[str, Any] | None) -> None:
        self._train.finish(summary)
        self._val.finish(summary)


def _exp(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf


class ExamplesAxisWandb(WandbSink):
    """EXO Gym's ``log_x_axis="examples"``: each row is logged at W&B step = the samples trained
    so far (over all nodes), as EXO Gym's W&B logger did."""

    def log(self, row: dict[str, Any]) -> None:
        super().log({**row, "step": int(row["samples"])})
