"""Typed overrides of dataclass configs from ``KEY=VALUE`` strings (the CLI's ``--set``).

Keys are field names (``H``), or ``section.field`` for a nested config (``optim.lr``); a bare name
that is unique among the nested fields also works (``lr`` -> ``optim.lr``). Values are parsed from
the field's annotation: int, float, bool, str, ``X | None``, tuples of numbers. An unknown key is an
error that lists every allowed key; nothing is silently ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

__all__ = ["ConfigError", "apply_overrides", "config_fields", "field_docs", "parse_value"]


class ConfigError(ValueError):
    """A bad key or value in a configuration override."""


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def field_docs(cls: type) -> dict[str, str]:
    """Field descriptions from the Google-style ``Attributes:`` sections along the class's MRO."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        text = klass.__doc__ or ""
        match = re.search(r"^\s*Attributes:\s*$(.*?)(?=^\s*\w[\w ]*:\s*$|\Z)", text, re.M | re.S)
        if not match:
            continue
        current = None
        for line in match.group(1).splitlines():
            m = re.match(r"^\s{4,8}(\w+):\s*(.*)$", line)
            if m:
                current = m.group(1)
                docs[current] = m.group(2).strip()
            elif current and line.strip():
                docs[current] += " " + line.strip()
    return docs


def config_fields(cls: type) -> dict[str, tuple[Any, Any, str]]:
    """``{key: (type, default, doc)}`` for every overridable key, nested ones as ``a.b``."""
    out: dict[str, tuple[Any, Any, str]] = {}
    hints, docs = _hints(cls), field_docs(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        default = _default(f)
        if dataclasses.is_dataclass(tp):
            sub_hints, sub_docs = _hints(tp), field_docs(tp)
            for sf in dataclasses.fields(tp):
                sub_default = getattr(default, sf.name)
                out[f"{f.name}.{sf.name}"] = (sub_hints[sf.name], sub_default,
                                              sub_docs.get(sf.name, ""))
        else:
            out[f.name] = (tp, default, docs.get(f.name, ""))
    return out


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _resolve_key(key: str, keys: list[str]) -> str:
    if key in keys:
        return key
    short = [k for k in keys if k.split(".")[-1] == key]
    if len(short) == 1:
        return short[0]
    hint = difflib.get_close_matches(key, keys + [k.split(".")[-1] for k in keys], n=1)
    did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
    raise ConfigError(f"unknown key {key!r}{did_you_mean}; allowed: {', '.join(keys)}")


def parse_value(text: str, tp: Any, key: str = "value") -> Any:
    """Parse ``text`` as annotation ``tp``; raise :class:`ConfigError` naming ``key``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and text.strip().lower() in ("none", "null"):
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return parse_value(text, arg, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{key}: cannot parse {text!r}")
    if origin is typing.Literal:
        if text in args:
            return text
        raise ConfigError(f"{key} must be one of {list(args)}, got {text!r}")
    if origin is tuple:
        parts = [p for p in text.replace("(", "").replace(")", "").split(",") if p.strip()]
        item_types = [args[0]] * len(parts) if len(args) == 2 and args[1] is Ellipsis else args
        if len(parts) != len(item_types):
            raise ConfigError(f"{key} takes {len(item_types)} comma-separated values, got {text!r}")
        return tuple(parse_value(p.strip(), t, key) for p, t in zip(parts, item_types, strict=True))
    if tp is bool:
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key} takes true/false, got {text!r}")
    if tp is int:
        try:
            return int(text)
        except ValueError:
            pass
        try:  # "1e3" style
            value = float(text)
        except ValueError:
            raise ConfigError(f"{key} takes an integer, got {text!r}") from None
        if not value.is_integer():
            raise ConfigError(f"{key} takes an integer, got {text!r}")
        return int(value)
    if tp is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{key} takes a number, got {text!r}") from None
    if tp is str:
        return text
    raise ConfigError(f"{key}: cannot parse a value of type {tp!r} from the command line")


def apply_overrides(cls: type, overrides: Mapping[str, Any]) -> Any:
    """Build ``cls`` with ``overrides`` (string values are parsed; others used as they are).

    Validation of the values is the config's own (``__post_init__``); its ``ValueError`` becomes a
    :class:`ConfigError`. A key that ``cls`` retired (its ``retired_keys``, key -> what replaces
    it) is refused with that advice rather than resolved to a nested field of the same name.
    """
    spec = config_fields(cls)
    keys = list(spec)
    retired: Mapping[str, str] = getattr(cls, "retired_keys", {})
    hints = _hints(cls)
    sections = {
        f.name: f for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])
    }
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for raw_key, raw_value in overrides.items():
        if raw_key in sections and not isinstance(raw_value, str):  # a whole nested config
            top[raw_key] = raw_value
            continue
        if raw_key in retired and raw_key not in keys:
            raise ConfigError(f"{cls.__name__} has no {raw_key!r}: {retired[raw_key]}")
        key = _resolve_key(raw_key, keys)
        tp = spec[key][0]
        value = parse_value(raw_value, tp, key) if isinstance(raw_value, str) else raw_value
        if "." in key:
            section, name = key.split(".", 1)
            nested.setdefault(section, {})[name] = value
        else:
            top[key] = value
    try:
        for section, values in nested.items():
            if section in top:
                raise ConfigError(f"{section!r} is given whole and field by field; give it once")
            # Start from the section's default so that a class's own defaults survive.
            base = _default(sections[section])
            try:
                top[section] = dataclasses.replace(base, **values)
            except (ValueError, TypeError) as err:  # "lr must be ..." -> "optim.lr must be ..."
                raise ConfigError(f"{cls.__name__}: {section}.{err}") from err
        return cls(**top)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        prefix = "" if str(err).startswith(f"{cls.__name__}:") else f"{cls.__name__}: "
        raise ConfigError(f"{prefix}{err}") from err
