"""A run's ``config.json``: its settings, resolved, and what follows from them; and the
checkpoint's plain form of such data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exogym.run.options import settings
from exogym.run.settings import RunSettings
from exogym.strategy.base import StackedStrategy
from exogym.strategy.server import ServerStrategy
from exogym.utils.plugins import source_of

__all__ = ["RUN_CONFIG_KEYS", "plain", "run_config"]

_DERIVED_KEYS = ("strategy_class", "hyperparameters", "steps_per_epoch", "partition_stats",
                 "processes", "parameters", "eval_set", "compute_source", "priced")
# the settings' keys, and what follows from them (the strategy's class and hyperparameters, the
# data's epochs and shards, the processes, the model's size, the evaluation set, the price's
# source, and what the hardware's price was made of: every device's figures, a FedScale-form
# table's digest)

RUN_CONFIG_KEYS = tuple(dict.fromkeys(
    [str(s.record).split(".")[0] for s in settings().values() if s.record] + [*_DERIVED_KEYS]))
"""The keys of ``config.json`` that are the run's own (``run_info`` may add others): every
setting's (:mod:`exogym.run.options`) and the derived ones."""

_RECORDED_AS_HELD = tuple((name, s.record) for name, s in settings().items()
                          if s.record and "." not in s.record)
"""The settings recorded under a key of their own; ``config.json`` holds their
:class:`RunSettings` value but where :func:`run_config` writes a resolved one (the network's
spec)."""


def run_config(s: RunSettings, strategy: StackedStrategy, derived: dict[str, Any],
               run_info: dict[str, Any], checkpointing: dict[str, Any]) -> dict[str, Any]:
    """The ``config.json`` content: the run's settings, resolved; ``derived``: what the run
    found of its data, engine and model (``steps_per_epoch``, ``partition_stats``, ``engine``,
    ``device``, ``processes``, ``parameters``, ``eval_set``, and ``distributed``: whether this
    process is one rank of several); ``run_info``: more entries (not the run's own keys)."""
    config = {
        "strategy": strategy.id,
        "strategy_class": source_of(type(strategy)),
        "hyperparameters": strategy.hyperparameters(),
        "steps": s.total_steps, "steps_per_epoch": derived["steps_per_epoch"],
        "partition": s.partition.spec, "partition_stats": derived["partition_stats"],
        "engine": derived["engine"], "device": derived["device"],
        "processes": derived["processes"], "parameters": derived["parameters"],
        "eval_set": derived["eval_set"],
        "network": s.network.spec() if s.network is not None else None,
        "step_time_s": s.step_time_s, "compute_source": s.compute_source,
        "priced": None if s.pricing is None else s.pricing.hardware.figures(),
        "hardware": None if s.hardware is None else s.hardware.spec,
        "device_profiles": None if s.device_profiles is None else str(s.device_profiles),
        "checkpointing": checkpointing, "world": s.world.spec(),
        "participation": None if s.participation is None else s.participation.to_dict(),
        "paging": None if s.resident is None or s.seats or derived["distributed"]
        else {"resident": s.resident, "offload": s.offload},
        "population": None if s.participation is None else {
            "clients_in_memory": "round" if s.seats else "all",
            "round_policy": None if s.round_policy is None else s.round_policy.spec(),
            "arrivals": None if s.arrivals is None else s.arrivals.spec(),
            **({"concurrency": s.participation.count}
               if isinstance(strategy, ServerStrategy) else {}),
            **({"client_store": s.client_store} if s.seats
               and s.participation.client_state == "keep" else {})},
    }
    for name, key in _RECORDED_AS_HELD:  # the rest of the settings, as the run holds them
        if key not in config:
            config[key] = getattr(s, name)
    assert set(config) == set(RUN_CONFIG_KEYS), set(config) ^ set(RUN_CONFIG_KEYS)
    clash = sorted(set(run_info) & set(config))
    if clash:
        raise ValueError(f"run_info may not replace the run's own config keys {clash}")
    config.update(run_info)
    return config


def plain(value: Any) -> Any:
    """JSON-like data with only the types ``torch.load(weights_only=True)`` reads (tuples kept,
    paths as strings)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, Path):
        return str(value)
    return value
