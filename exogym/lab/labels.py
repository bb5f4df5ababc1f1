"""A comparison's strategies: labels and their ``KEY=VALUE`` settings, resolved into strategies.

A label is a registry id (``diloco``), or an id and a name (``diloco-h10``) so that one method
can appear with several settings; a strategy from user code is ``path/file.py:Class[-NAME]`` or
``module:Class[-NAME]``, labelled ``ID[-NAME]`` with its id (:func:`label_of_spec`). Settings
(:mod:`exogym.utils.config`): ``LABEL.KEY`` sets one strategy's hyperparameter
(``diloco-h10.H=10``), a bare ``KEY`` every strategy's (``optim.lr=2e-3``); a label's own setting
wins over a bare one, and either over the task's learning rate (:func:`resolve_strategies`).

Used by :func:`exogym.lab.compare.compare` (and through it ``exogym bench``); it trains nothing.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from exogym import strategy as strategies
from exogym.strategy import StackedStrategy
from exogym.utils.config import ConfigError, config_fields
from exogym.utils.plugins import is_spec

__all__ = ["label_of_spec", "resolve_strategies"]

_LABEL = re.compile(r"^[A-Za-z0-9_]+(-[A-Za-z0-9_-]+)?$")


def _strategy_of(label: str) -> str:
    """The registry id a label names: ``diloco`` -> ``diloco``, ``diloco-h10`` -> ``diloco``."""
    ids = strategies.registry()
    if not isinstance(label, str) or not _LABEL.match(label):
        raise ConfigError(f"bad strategy label {label!r}: a label is ID or ID-NAME (letters, "
                          "digits, '_' and '-'), e.g. diloco or diloco-h10")
    matches = [i for i in ids if label == i or label.startswith(i + "-")]
    if not matches:
        head = label.split("-", 1)[0]
        close = difflib.get_close_matches(head, ids, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown strategy {head!r} in label {label!r}{hint}; a label is ID "
                          f"or ID-NAME with ID one of: {', '.join(ids)}")
    return max(matches, key=len)


def label_of_spec(label: str) -> str:
    """``path/file.py:Class[-NAME]`` or ``module:Class[-NAME]`` -> ``ID[-NAME]``, the class
    loaded and registered under its id (its class name unless it sets ``id``); other labels
    unchanged."""
    if not is_spec(label):
        return label
    source, _, tail = label.rpartition(":")
    name, dash, suffix = tail.partition("-")
    return strategies.get(f"{source}:{name}").id + dash + suffix


def _canonical(cls: type[StackedStrategy], key: str) -> str | None:
    """``key`` as the full config key of ``cls`` (``lr`` -> ``optim.lr``); None if unknown."""
    keys = list(config_fields(cls))
    if key in keys:
        return key
    short = [k for k in keys if k.split(".")[-1] == key]
    return short[0] if len(short) == 1 else None


def _items(overrides: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    if isinstance(overrides, Mapping):
        return list(overrides.items())
    items = list(overrides)
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise ValueError(f"overrides must be a mapping or (KEY, VALUE) pairs, got {item!r}")
    return items


def resolve_strategies(
    labels: Sequence[str],
    overrides: Mapping[str, Any] | Iterable[tuple[str, Any]] = (),
    *,
    lr: float | None = None,
) -> dict[str, StackedStrategy]:
    """Build every labelled strategy with its settings; ``{label: strategy}`` in order.

    Args:
        labels: ``ID`` or ``ID-NAME`` (``diloco-h10``), each once; a strategy from user code
            as ``path/file.py:Class[-NAME]`` or ``module:Class[-NAME]``, labelled ``ID[-NAME]``
            with its id (the class name unless the class sets ``id``).
        overrides: ``KEY=VALUE`` settings as a mapping or pairs; ``LABEL.KEY`` for one strategy,
            a bare ``KEY`` for every one. String values are parsed as on the command line.
        lr: the inner learning rate (``optim.lr``) where no setting gives one (the task's).

    Raises:
        ConfigError: an unknown or repeated label, an unknown key or bad value (naming the label),
            a bare key that some strategy lacks, a key given twice for the same strategy.
    """
    if isinstance(labels, str) or not labels:
        raise ConfigError(f"strategies must be a non-empty list of labels, got {labels!r}")
    labels = [label_of_spec(label) for label in labels]
    ids: dict[str, str] = {}
    for label in labels:
        sid = _strategy_of(label)
        if label in ids:
            raise ConfigError(f"strategy {label!r} is listed twice; give the others names, "
                              f"e.g. {sid}-2 (then set them with {sid}-2.KEY=VALUE)")
        ids[label] = sid
    common: dict[str, tuple[str, Any]] = {}  # raw key -> (text for messages, value)
    own: dict[str, dict[str, tuple[str, Any]]] = {label: {} for label in labels}
    # the prefixes of nested keys (optim.lr): LABEL.KEY with another prefix names a label
    groups = {k.partition(".")[0] for sid in set(ids.values())
              for k in config_fields(strategies.get(sid)) if "." in k}
    for key, value in _items(overrides):
        prefix, dot, rest = key.partition(".")
        if dot and prefix in ids:
            own[prefix][rest] = _once(own[prefix], rest, value, f"{key}={value}", prefix)
            continue
        if dot and (_looks_like_label(prefix) or prefix not in groups):
            close = difflib.get_close_matches(prefix, labels, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            what = "strategy" if _looks_like_label(prefix) else "label"
            raise ConfigError(f"setting {key}={value} names {what} {prefix!r}, which is not "
                              f"compared{hint}; labels: {', '.join(labels)} (a setting for "
                              f"every strategy has no label: {rest}={value})")
        common[key] = _once(common, key, value, f"{key}={value}", None)
    built: dict[str, StackedStrategy] = {}
    for label, sid in ids.items():
        cls = strategies.get(sid)
        merged: dict[str, Any] = {}
        # task lr < bare settings < the label's own settings
        if lr is not None:
            merged["optim.lr"] = lr
        for level, items in (("every strategy", common), (label, own[label])):
            texts: dict[str, str] = {}  # full key -> the setting that gave it, at this level
            for key, (text, value) in items.items():
                full = _canonical(cls, key)
                if full is None:
                    where = (f"setting {text} applies to every strategy, but {label} ({sid}) "
                             f"has no key {key!r}; prefix it with a label (LABEL.{key}) to set "
                             "it for one strategy" if level == "every strategy" else "")
                    try:
                        strategies.make(sid, **{key: value})
                    except ConfigError as err:
                        raise ConfigError(where or f"{label}: setting {text}: {err}") from None
                    raise ConfigError(where or f"{label}: unknown setting {text}")
                if full in texts:
                    raise ConfigError(f"{label}: settings {texts[full]} and {text} both set "
                                      f"{full}; give it once")
                texts[full] = text
                merged[full] = value
        try:
            built[label] = strategies.make(sid, **merged)
        except ConfigError as err:
            raise ConfigError(f"{label}: {err}") from None
    return built


def _once(seen: Mapping[str, Any], key: str, value: Any, text: str,
          label: str | None) -> tuple[str, Any]:
    if key in seen:
        where = f" for {label}" if label else ""
        raise ConfigError(f"setting {key}{where} is given twice ({seen[key][0]} and {text}); "
                          "give it once")
    return text, value


def _looks_like_label(prefix: str) -> bool:
    return any(prefix == i or prefix.startswith(i + "-") for i in strategies.registry())
