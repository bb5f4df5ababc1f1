"""EXO Gym's ``Trainer.fit``: its arguments mapped onto exogym's, its CSV logs, the model returned.

EXO Gym (github.com/exo-explore/gym, read at commit 9fa323c: ``exogym/trainer.py``,
``exogym/train_node.py``, ``exogym/aux/logger.py``) trains with::

    model = trainer.fit(num_epochs, strategy, num_nodes, max_steps=None, batch_size=16,
                        minibatch_size=None, shuffle=True, val_size=64, val_interval=100,
                        autocast=False, checkpoint_interval=None, save_dir="./checkpoints",
                        run_name=..., ...)

``exogym.Trainer.fit`` (:class:`exogym.run.trainer.Trainer`) takes that call as it is
when it is **EXO Gym's**: its strategy is one of EXO Gym's built-ins (``DiLoCoStrategy``, ...,
``SimpleReduceStrategy``), or a per-node strategy
(:class:`exogym.strategy.PerNodeStrategy`, EXO Gym's kind) with arguments by
position, any of EXO Gym's own argument names (``val_interval``, ``run_name``, ...), or both
``num_epochs`` and ``max_steps`` (exogym's own form takes one of them). Such a
call returns what EXO Gym's returns, the trained model (an ``nn.Module``: exogym's global
model), and keeps the full :class:`exogym.run.output.result.FitResult` as ``trainer.result``;
exogym's own arguments (``network``, ``world``, ``engine``, ``out_dir``, ...) may be added to it. A
per-node strategy of one's own with exogym's arguments only is an exogym call (a
:class:`~exogym.run.output.result.FitResult`, exogym's defaults), so that it compares with the
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
  None or ``""`` (EXO Gym's "choose one"): ``Trainer(device=)``'s, else ``"auto"``; given
  both, they must agree;
- ``seed`` (42, EXO Gym's default): the run's seed;
- ``kwargs`` (a dict: EXO Gym logged it with the run's config): ``run_info``, more entries of
  ``config.json``;
- ``run_name``: EXO Gym's CSV logs, ``logs/RUN_NAME/train.csv`` (a row per step: ``step``,
  ``examples_trained``, ``train_loss`` (the nodes' mean), ``train_perplexity``, ``lr``),
  ``validation.csv`` (``step``, ``local_loss``, ``local_perplexity``, ``global_loss``,
  ``global_perplexity``) and ``config.json``; ``local_*``, node 0's own model, is not evaluated
  by exogym and stays empty;
- ``wandb_project``: a :class:`exogym.run.output.sinks.WandbSink` (named ``run_name``) instead
  of the CSVs, as EXO Gym chose; ``log_x_axis="examples"``: W&B's step is the samples trained
  (``"step"``, the default: the step); ``disable_logging``: neither, and no progress bar;
- ``correlation_interval`` has no equivalent: an error (None: nothing to do);
  ``dataloader_kwargs``: exogym batches the nodes' data itself, without a ``DataLoader``:
  its speed settings (``num_workers``, ``pin_memory``, ``persistent_workers``,
  ``prefetch_factor``, ``pin_memory_device``) are an :class:`~exogym.compat.exo_gym.conversions.
  ExoGymWarning` and ignored, any other key (``collate_fn``, ``sampler``, ...) an error;
  ``force_minibatch_recalculate`` (there is no probe): an ``ExoGymWarning``.

EXO Gym's form with an exogym strategy (``DiLoCo``, an id) is an error naming exogym's arguments.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from exogym.compat.exo_gym.conversions import BuiltinStrategy, ExoGymWarning
from exogym.compat.exo_gym.logs import ExamplesAxisWandb, ExoGymCSVLogs
from exogym.compat.exo_gym.simple_reduce import SimpleReduceStrategy
from exogym.run.output.sinks import WandbSink
from exogym.sim.engine import same_device
from exogym.strategy.per_node.base import PerNodeStrategy
from exogym.strategy.per_node.runner import as_stacked

if TYPE_CHECKING:
    from exogym.run.output.result import FitResult
    from exogym.run.trainer import Trainer

__all__ = ["EXO_GYM_ONLY", "fit", "is_exo_gym_call"]

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
    "force_minibatch_recalculate": "(none)", "kwargs": "run_info",
}
# Names both fits have, with EXO Gym's defaults or meanings in an EXO Gym call.
_SHARED = ("num_epochs", "max_steps", "batch_size", "checkpoint_interval", "seed", "device")
# DataLoader settings that change only how fast batches come (exogym uses no DataLoader).
_LOADER_SPEED = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor",
                 "pin_memory_device")


def is_exo_gym_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a ``fit`` call is EXO Gym's: a per-node strategy (EXO Gym's kind) with arguments
    by position, an EXO Gym-only argument or both ``num_epochs`` and ``max_steps``, or one of
    EXO Gym's built-in classes. EXO Gym's arguments with an exogym (node-stacked) strategy are
    an error naming exogym's."""
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
        kwargs: dict[str, Any], device: str | None = None) -> nn.Module:
    """EXO Gym's ``fit(*args, **kwargs)`` on ``trainer``: translate, ``run(**exogym_kwargs)``,
    keep the result as ``trainer.result`` and return its model. ``device``: the trainer's own
    (EXO Gym's ``Trainer(device=)``), or None."""
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
    out, explicit = _translate(exo, device)
    for key in ("sinks", "run_info"):  # exogym's and EXO Gym's, both
        if key in kwargs and key in out:
            kwargs[key] = ([*kwargs[key], *out.pop(key)] if key == "sinks"
                           else {**out.pop(key), **kwargs[key]})
            explicit.pop(key, None)
    for key in sorted(set(kwargs) & set(explicit)):
        raise TypeError(f"fit() got {key}={kwargs[key]!r} and EXO Gym's {explicit[key]}, which "
                        f"sets it; give one of them")
    out.update(kwargs)
    out["strategy"] = as_stacked(out["strategy"], out["num_nodes"])
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


class _Arguments:
    """exogym's arguments being built from EXO Gym's (``exo``), and for each one that a given
    EXO Gym argument set, that argument's name (``explicit``)."""

    def __init__(self, exo: dict[str, Any]) -> None:
        self.exo, self.out, self.explicit = exo, {}, {}  # type: ignore[var-annotated]

    def put(self, key: str, value: Any, *sources: str) -> None:
        self.out[key] = value
        given = [s for s in sources if s in self.exo]
        if given:
            self.explicit[key] = " and ".join(given)


def _translate(exo: dict[str, Any], device: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    """exogym's arguments from EXO Gym's (its defaults for those not given), and for each one
    that a given EXO Gym argument set, that argument's name."""
    a = _Arguments(exo)
    _training(a)
    _evaluation(a)
    _no_equivalent(a)
    _placement(a, device)
    _logging(a)
    return a.out, a.explicit


def _training(a: _Arguments) -> None:
    """Steps, batch and micro-batch, partition, precision, checkpoints."""
    exo, put = a.exo, a.put
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
    autocast = exo.get("autocast", False)
    if not isinstance(autocast, bool):
        raise ValueError(f"autocast must be True or False, got {autocast!r}")
    put("precision", "bf16" if autocast else "fp32", "autocast")
    if exo.get("checkpoint_interval") is not None:
        put("checkpoint_every", exo["checkpoint_interval"], "checkpoint_interval")


def _evaluation(a: _Arguments) -> None:
    """``val_size`` and ``val_interval``: a fixed subset, and an evaluation before step 1."""
    exo, put = a.exo, a.put
    val_size, val_interval = exo.get("val_size", 64), exo.get("val_interval", 100)
    if isinstance(val_size, bool) or not isinstance(val_size, int) or val_size < 0:
        raise ValueError(f"val_size must be an integer >= 0 (0: no evaluation), got "
                         f"{val_size!r}")
    if val_size:
        put("eval_samples", val_size, "val_size")
        put("eval_interval", val_interval, "val_interval")
        put("eval_at_start", True)
        put("eval_batch_size", exo.get("minibatch_size") or exo.get("batch_size", 16),
            "minibatch_size", "batch_size")


def _no_equivalent(a: _Arguments) -> None:
    """EXO Gym's arguments exogym has no use for: an error where they would change the run, an
    :class:`ExoGymWarning` where they would only have changed its speed."""
    exo = a.exo
    if exo.get("correlation_interval"):
        raise ValueError(f"correlation_interval={exo['correlation_interval']!r} has no "
                         "equivalent in exogym: exogym does not compute the correlation of the "
                         "nodes' models; leave it out")
    loader = exo.get("dataloader_kwargs") or {}
    if not isinstance(loader, dict):
        raise TypeError(f"dataloader_kwargs must be a dict, got {type(loader).__name__}")
    other = sorted(k for k in loader if k not in _LOADER_SPEED)
    if other:
        raise ValueError(f"dataloader_kwargs={loader!r} has no equivalent in exogym (it batches "
                         f"the nodes' data itself, without a DataLoader): {other} would change "
                         f"the batches; allowed (ignored, they only set a DataLoader's speed): "
                         f"{list(_LOADER_SPEED)}")
    if loader:
        warnings.warn(f"dataloader_kwargs {loader} are ignored: exogym batches the nodes' data "
                      "itself, without a DataLoader", ExoGymWarning, stacklevel=5)
    if exo.get("force_minibatch_recalculate"):
        warnings.warn("force_minibatch_recalculate=True is ignored: exogym does not probe for a "
                      "minibatch size (minibatch_size=None trains on the whole batch at once)",
                      ExoGymWarning, stacklevel=5)


def _placement(a: _Arguments, device: str | None) -> None:
    """The device (``fit``'s, or the trainer's), the seed, and ``kwargs`` as ``run_info``."""
    exo, put = a.exo, a.put
    given = exo.get("device")
    if given in (None, "") or (device and same_device(given, device)):
        chosen = device or "auto"
    elif device:
        raise ValueError(f"fit(device={given!r}) and Trainer(device={device!r}) differ; EXO "
                         "Gym ran on the Trainer's and ignored fit's: give one of them")
    else:
        chosen = given
    put("device", chosen, "device")
    put("seed", exo.get("seed", 42), "seed")
    extra = exo.get("kwargs")
    if extra is not None:
        if not isinstance(extra, dict) or not all(isinstance(k, str) for k in extra):
            raise TypeError(f"kwargs must be a dict with str keys (entries of the run's "
                            f"config), got {extra!r}")
        put("run_info", dict(extra), "kwargs")


def _logging(a: _Arguments) -> None:
    """``run_name``'s CSV logs, or ``wandb_project``'s W&B run, or neither."""
    exo, put = a.exo, a.put
    x_axis = exo.get("log_x_axis", "step")
    if x_axis not in ("step", "examples"):
        raise ValueError(f"log_x_axis must be 'step' or 'examples' (W&B's x axis: the step or "
                         f"the samples trained), got {x_axis!r}")
    run_name, project = exo.get("run_name"), exo.get("wandb_project")
    if exo.get("disable_logging", False):
        put("progress", False, "disable_logging")
    elif project is not None:
        sink = WandbSink(project, name=run_name) if x_axis == "step" else \
            ExamplesAxisWandb(project, name=run_name)
        put("sinks", [sink], "wandb_project", "run_name")
        put("log_interval", 1)
    elif run_name is not None:
        if not isinstance(run_name, str) or not run_name or Path(run_name).name != run_name:
            raise ValueError(f"run_name must be a folder name (no '/'), got {run_name!r}")
        put("sinks", [ExoGymCSVLogs(Path("logs") / run_name)], "run_name")
        put("log_interval", 1)
