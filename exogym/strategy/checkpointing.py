"""Checkpointing a strategy's run-time attributes: values to saved data and back.

A strategy's state is whatever it sets on itself at run time (the node-stacked base
:class:`exogym.strategy.base.StackedStrategy` and the per-node base
:class:`exogym.strategy.per_node.base.PerNodeStrategy` both save it this way, without code in
the subclass). :func:`save_value` turns one attribute's value into
checkpointable data, :func:`restore_value` puts saved data back into the fresh run's value. The
kinds: tensors (saved by reference, restored in place so that optimizers keep their references),
``torch.Generator`` objects (their state), plain Python values, dicts (keys: str, int, float,
bool, tuple, None) and lists and tuples of these, and any object with ``state_dict()`` /
``load_state_dict()`` (optimizers, schedulers, codecs). Any other kind is a ``TypeError`` naming
the attribute, so that a strategy is never checkpointed incompletely without saying so.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["restore_value", "save_value"]


def save_value(value: Any, where: str) -> Any:
    """``value`` as checkpointable data (the kinds of the module docstring); tensors by reference.

    Raises:
        TypeError: a kind that cannot be saved, naming ``where`` (the attribute's path).
    """
    if isinstance(value, Tensor):
        return value
    if isinstance(value, torch.Generator):
        return value.get_state()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, (str, int, float, bool, tuple)) and key is not None:
                raise TypeError(f"{where}: a dict key of type {type(key).__name__} cannot be "
                                "checkpointed (keys: str, int, float, bool, tuple, None)")
        return {key: save_value(v, f"{where}[{key!r}]") for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(save_value(v, f"{where}[{i}]") for i, v in enumerate(value))
    if callable(getattr(value, "state_dict", None)) and callable(
            getattr(value, "load_state_dict", None)):
        return value.state_dict()  # optimizers, schedulers, codecs, user objects
    raise TypeError(
        f"{where} is a {type(value).__name__}, which exogym cannot checkpoint: list the "
        "attribute in the strategy's derived_state if init_state() rebuilds it from the "
        "hyperparameters, or give its class state_dict() and load_state_dict()")


def restore_value(current: Any, saved: Any, where: str) -> Any:
    """The value to hold after restoring ``saved`` into ``current`` (the fresh run's value):
    tensors, dicts and lists are updated in place where their structure matches."""
    if isinstance(current, Tensor):
        if saved is current:  # restoring a snapshot that holds the live tensor itself
            return current
        if not isinstance(saved, Tensor) or saved.shape != current.shape \
                or saved.dtype != current.dtype:
            got = (f"{saved.dtype} {tuple(saved.shape)}" if isinstance(saved, Tensor)
                   else type(saved).__name__)
            raise ValueError(f"{where}: saved {got}, but the run has {current.dtype} "
                             f"{tuple(current.shape)}")
        with torch.no_grad():  # a leaf that requires grad (an outer optimizer's parameter)
            current.copy_(saved)
        return current
    if isinstance(current, torch.Generator):
        current.set_state(saved)
        return current
    if isinstance(current, dict) and isinstance(saved, dict):
        for key in [k for k in current if k not in saved]:
            del current[key]
        for key, value in saved.items():
            current[key] = (restore_value(current[key], value, f"{where}[{key!r}]")
                            if key in current else _fresh(value))
        return current
    if isinstance(current, list) and isinstance(saved, list) and len(current) == len(saved):
        current[:] = [restore_value(c, s, f"{where}[{i}]")
                      for i, (c, s) in enumerate(zip(current, saved, strict=True))]
        return current
    if isinstance(current, tuple) and isinstance(saved, tuple) and len(current) == len(saved):
        return tuple(restore_value(c, s, f"{where}[{i}]")
                     for i, (c, s) in enumerate(zip(current, saved, strict=True)))
    if callable(getattr(current, "load_state_dict", None)):
        current.load_state_dict(saved)
        return current
    return _fresh(saved)


def _fresh(saved: Any) -> Any:
    """A saved value that has no counterpart in the fresh run (a dict entry made at run time):
    tensors are copied, containers rebuilt."""
    if isinstance(saved, Tensor):
        return saved.clone()
    if isinstance(saved, dict):
        return {k: _fresh(v) for k, v in saved.items()}
    if isinstance(saved, (list, tuple)):
        return type(saved)(_fresh(v) for v in saved)
    return saved
