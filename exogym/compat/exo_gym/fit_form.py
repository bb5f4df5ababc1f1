"""EXO Gym's ``Trainer.fit``: its arguments mapped onto exogym's, its CSV logs, the model returned.

EXO Gym (github.com/exo-explore/gym, read at commit 9fa323c: ``exogym/trainer.py``,
``exogym/train_node.py``, ``exogym/aux/logger.py``) trains with::

    model = trainer.fit(num_epochs, strategy, num_nodes, max_steps=None, batch_size=16,
                        minibatch_size=None, shuffle=True, val_size=64, val_interval=100,
                        autocast=False, checkpoint_interval=None, save_dir="./checkpoints",
                        run_name=..., ...)

:meth:`exogym.Trainer.fit` takes that call as it is when it is **EXO Gym's**: its strategy is
one of EXO Gym's built-ins (``DiLoCoStrategy``, ..., ``SimpleReduceStrategy``), or a per-node
strategy (:class:`exogym.strategy.strategy.Strategy`, EXO Gym's kind) with arguments by
position, any of EXO Gym's own argument names (``val_interval``, ``run_name``, ...), or both
``num_epochs`` and ``max_steps`` (exogym's own form takes one of them). Such a
call returns what EXO Gym's returns, the trained model (an ``nn.Module``: exogym's global
model), and keeps the full :class:`exogym.run.result.FitResult` as ``trainer.result``; exogym's
own arguments (``network``, ``world``, ``engine``, ``out_dir``, ...) may be added to it. A
per-node strategy of one's own with exogym's arguments only is an exogym call (a
:class:`~exogym.run.result.FitResult`, exogym's defaults), so that it compares with the
built-ins under the same settings.

How each EXO Gym argument maps (EXO Gym's defaults apply when it is not given):

- ``max_steps``: the run's steps when given (EXO Gym's training loop then ignores
  ``num_epochs``, and so does this); else ``num_epochs`` (default 1) passes over each node's
  shard;
- ``batch_size`` (16): per node; ``minibatch_size``: ``micro_batch_size`` (gradient
  accumulation; it must divide ``batch_size``; None: the whole batch at once, where EXO Gym
  probed the device's memory for a size);
- ``shuffle`` (True): ``partition="iid"``; False: ``"contiguous"`` (each node its own block of
  the dataset: EXO Gym's unshuffled ``DistributedSampler`` gave node i the samples i, i + N, ...
  in file order; exogym's orders are drawn from the seed);
- ``val_size`` (64): ``eval_samples`` (a fixed subset, where EXO Gym drew random batches each
  time; 0: no evaluation); ``val_interval`` (100): ``eval_interval``, with an evaluation before
  the first step as EXO Gym's; the batch size of evaluation is ``minibatch_size or batch_size``;
- ``autocast``: ``precision="bf16"``;
- ``checkpoint_interval`` (steps): ``checkpoint_every``, into ``save_dir/RUN_NAME`` (a new
  folder) unless ``out_dir`` is given;
- ``device`` (EXO Gym's ``fit`` ignored it; its ``Trainer(device=)`` chose): the run's device;
- ``seed`` (42, EXO Gym's default): the run's seed;
- ``run_name``: EXO Gym's CSV logs, ``logs/RUN_NAME/train.csv`` (a row per step: ``step``,
  ``examples_trained``, ``train_loss`` (the nodes' mean), ``train_perplexity``, ``lr``),
  ``validation.csv`` (``step``, ``local_loss``, ``local_perplexity``, ``global_loss``,
  ``global_perplexity``) and ``config.json``; ``local_*``, node 0's own model, is not evaluated
  by exogym and stays empty;
- ``wandb_project``: a :class:`exogym.run.sinks.WandbSink` (named ``run_name``) instead of the
  CSVs, as EXO Gym chose; ``disable_logging``: neither, and no progress bar;
- ``correlation_interval`` and ``dataloader_kwargs`` have no equivalent: an error;
  ``force_minibatch_recalculate`` (there is no probe): an
  :class:`exogym.strategy.exo_gym.ExoGymWarning`.

EXO Gym's form with an exogym strategy (``DiLoCo``, an id) is an error naming exogym's arguments.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from exogym.run.sinks import CSVSink, WandbSink
from exogym.strategy.exo_gym import BuiltinStrategy, ExoGymWarning
from exogym.strategy.strategy import SimpleReduceStrategy
from exogym.strategy.strategy import Strategy as PerNodeStrategy

if TYPE_CHECKING:
    from exogym.run.result import FitResult
    from exogym.run.trainer import Trainer

__all__ = ["EXO_GYM_ONLY", "ExoGymCSVLogs", "fit", "is_exo_gym_call"]

# EXO Gym's fit(), in order (its first three are positional there).
POSITIONAL = ("num_epochs", "strategy", "num_nodes", "max_steps", "batch_size",
              "minibatch_size", "shuffle", "val_size", "val_interval", "autocast",
              "checkpoint_interval", "correlation_interval", "save_dir", "dataloader_kwargs")
# Its arguments exogym's fit() does not have, with what exogym calls them.
EXO_GYM_ONLY: dict[str, str] = {
    "minibatch_size": "micro_batch_size", "shuffle": "partition ('iid', 'contiguous')",
    "val_size": "eval_samples", "val_interval": "eval_interval",
    "autocast": "precision='bf16'", "save_dir": "out_dir",
    "correlation_interval": "(none)", "dataloader_kwargs": "(none)",
    "run_name": "out_dir with sinks=[CSVSink()]", "wandb_project": "sinks=[WandbSink(project)]",
    "log_x_axis": "(none)", "disable_logging": "progress=False",
    "force_minibatch_recalculate": "(none)",
}
# Names both fits have, with EXO Gym's defaults or meanings in an EXO Gym call.
_SHARED = ("num_epochs", "max_steps", "batch_size", "checkpoint_interval", "seed", "device")



def is_exo_gym_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a ``fit`` call is EXO Gym's: a per-node strategy (EXO Gym's kind) with arguments
    by position, an EXO Gym-only argument or both ``num_epochs`` and ``max_steps``, or one of
    EXO Gym's built-in classes. EXO Gym's
    arguments with an exogym (node-stacked) strategy are an error naming exogym's."""
    strategy = kwargs.get("strategy", args[1] if len(args) > 1 else None)
    exo_names = [k for k in EXO_GYM_ONLY if k in kwargs]
    if not isinstance(strategy, PerNodeStrategy):
        if args or exo_names:
            renamed = ", ".join(f"{k} -> {EXO_GYM_ONLY[k]}" for k in exo_names)
            raise TypeError(
                "fit() got EXO Gym's form ("
                + ("arguments by position" if args else f"argument(s) {exo_names}")
                + "), which takes an EXO Gym strategy (exogym.strategy.diloco.DiLoCoStrategy, "
                f"... or a per-node strategy), with strategy {strategy!r}; exogym's fit takes "
                "keyword arguments" + (f": {renamed}" if renamed else ""))
        return False
    # num_epochs and max_steps together: EXO Gym's example/mnist.py calls fit so, and exogym's
    # own form refuses the pair, so the call can only mean EXO Gym's
    both = kwargs.get("num_epochs") is not None and kwargs.get("max_steps") is not None
    return bool(args or exo_names or both) or isinstance(strategy, BuiltinStrategy) \
        or type(strategy) is SimpleReduceStrategy  # a subclass is a per-node strategy of one's own


def fit(trainer: Trainer, run: Callable[..., FitResult], args: tuple[Any, ...],
        kwargs: dict[str, Any]) -> nn.Module:
    """EXO Gym's ``fit(*args, **kwargs)`` on ``trainer``: translate, ``run(**exogym_kwargs)``,
    keep the result as ``trainer.result`` and return its model."""
    kwargs = dict(kwargs)
    if len(args) > len(POSITIONAL):
        raise TypeError(f"fit() takes at most {len(POSITIONAL)} positional arguments (EXO Gym's "
                        f"{', '.join(POSITIONAL)}), got {len(args)}")
    for name, value in zip(POSITIONAL, args, strict=False):
        if name in kwargs:
            raise TypeError(f"fit() got multiple values for argument {name!r}")
        kwargs[name] = value
    for name in ("strategy", "num_nodes"):
        if name not in kwargs:
            raise TypeError(f"fit() missing EXO Gym's required argument {name!r}")
    exo = {k: kwargs.pop(k) for k in list(kwargs) if k in EXO_GYM_ONLY or k in _SHARED}
    out, explicit = _translate(exo)
    if "sinks" in kwargs and "sinks" in out:  # exogym's sinks and EXO Gym's logs, both
        kwargs["sinks"] = [*kwargs["sinks"], *out.pop("sinks")]
        explicit.pop("sinks", None)
    for key in sorted(set(kwargs) & set(explicit)):
        raise TypeError(f"fit() got {key}={kwargs[key]!r} and EXO Gym's {explicit[key]}, which "
                        f"sets it; give one of them")
    out.update(kwargs)
    if "checkpoint_every" in out and "out_dir" not in out:
        name = exo.get("run_name") or f"exogym_{datetime.now().strftime('%Y%m%d_%H%M%S')}"
        out["out_dir"] = Path(exo.get("save_dir", "./checkpoints")) / name
    val = trainer.val_dataset
    if exo.get("val_size", 64) == 0:
        trainer.val_dataset = None  # EXO Gym's val_size=0: no evaluation
    try:
        result = run(**out)
    finally:
        trainer.val_dataset = val
    trainer.result = result
    return result.model


def _translate(exo: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """exogym's arguments from EXO Gym's (its defaults for those not given), and for each one
    that a given EXO Gym argument set, that argument's name."""
    explicit: dict[str, str] = {}

    def put(key: str, value: Any, *sources: str) -> None:
        out[key] = value
        given = [s for s in sources if s in exo]
        if given:
            explicit[key] = " and ".join(given)

    out: dict[str, Any] = {}
    if exo.get("max_steps") is not None:
        put("max_steps", exo["max_steps"], "max_steps")
    else:
        put("num_epochs", 1 if exo.get("num_epochs") is None else exo["num_epochs"],
            "num_epochs")
    batch_size = exo.get("batch_size", 16)
    put("batch_size", batch_size, "batch_size")
    minibatch = exo.get("minibatch_size")
    if minibatch is not None:
        if isinstance(minibatch, bool) or not isinstance(minibatch, int) or minibatch < 1 \
                or not isinstance(batch_size, int) or batch_size % minibatch:
            raise ValueError(f"minibatch_size must be an integer >= 1 that divides batch_size "
                             f"{batch_size!r} (the gradient is accumulated over "
                             f"batch_size / minibatch_size minibatches), got {minibatch!r}")
        if minibatch < batch_size:
            put("micro_batch_size", minibatch, "minibatch_size")
    shuffle = exo.get("shuffle", True)
    if not isinstance(shuffle, bool):
        raise ValueError(f"shuffle must be True or False, got {shuffle!r}")
    put("partition", "iid" if shuffle else "contiguous", "shuffle")
    val_size, val_interval = exo.get("val_size", 64), exo.get("val_interval", 100)
    if isinstance(val_size, bool) or not isinstance(val_size, int) or val_size < 0:
        raise ValueError(f"val_size must be an integer >= 0 (0: no evaluation), got "
                         f"{val_size!r}")
    if val_size:
        put("eval_samples", val_size, "val_size")
        put("eval_interval", val_interval, "val_interval")
        put("eval_at_start", True)
        put("eval_batch_size", minibatch or batch_size, "minibatch_size", "batch_size")
    autocast = exo.get("autocast", False)
    if not isinstance(autocast, bool):
        raise ValueError(f"autocast must be True or False, got {autocast!r}")
    put("precision", "bf16" if autocast else "fp32", "autocast")
    if exo.get("checkpoint_interval") is not None:
        put("checkpoint_every", exo["checkpoint_interval"], "checkpoint_interval")
    for key, why in (("correlation_interval", "exogym does not compute the correlation of the "
                      "nodes' models"),
                     ("dataloader_kwargs", "exogym batches the nodes' data itself (no "
                      "DataLoader)")):
        if exo.get(key):
            raise ValueError(f"{key}={exo[key]!r} has no equivalent in exogym: {why}; leave it "
                             "out")
    if exo.get("force_minibatch_recalculate"):
        warnings.warn("force_minibatch_recalculate=True is ignored: exogym does not probe for a "
                      "minibatch size (minibatch_size=None trains on the whole batch at once)",
                      ExoGymWarning, stacklevel=4)
    put("device", "auto" if exo.get("device") is None else exo["device"], "device")
    put("seed", exo.get("seed", 42), "seed")
    x_axis = exo.get("log_x_axis", "step")
    if x_axis != "step":
        raise ValueError(f"log_x_axis={x_axis!r}: exogym's rows are per step ('step'); the "
                         "examples trained are in every row ('samples')")
    run_name, project = exo.get("run_name"), exo.get("wandb_project")
    if exo.get("disable_logging", False):
        put("progress", False, "disable_logging")
    elif project is not None:
        put("sinks", [WandbSink(project, name=run_name)], "wandb_project", "run_name")
        put("log_interval", 1)
    elif run_name is not None:
        if not isinstance(run_name, str) or not run_name or Path(run_name).name != run_name:
            raise ValueError(f"run_name must be a folder name (no '/'), got {run_name!r}")
        put("sinks", [ExoGymCSVLogs(Path("logs") / run_name)], "run_name")
        put("log_interval", 1)
    return out, explicit


class ExoGymCSVLogs:
    """EXO Gym's ``logs/RUN_NAME`` folder: ``train.csv``, ``validation.csv`` (EXO Gym's
    columns, written row by row by two :class:`exogym.run.sinks.CSVSink`) and ``config.json``
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
