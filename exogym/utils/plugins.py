"""Objects named by a spec: ``package.module:Name`` or ``path/to/file.py:Name``.

A researcher's strategy or task lives in their own file or package, not in exogym's registry;
``exogym run --strategy my_method.py:TopKDiLoCo`` and ``--task my_pkg.tasks:make_task`` name it
directly. A file is imported as the module its name gives (``my_method.py`` -> ``my_method``),
with its folder put first on ``sys.path``, exactly as ``python my_method.py`` would see its own
folder: its own imports work, and processes spawned later (``--engine process``) find the module
again, so its objects pickle by reference. A module of that name imported from elsewhere is an
error (rename the file), never a silent mix-up.

Installed packages add strategies without any flag through the entry point group
``exogym.strategies`` (``name = "package.module:Class"``), read by :mod:`exogym.strategy`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from exogym.utils.config import ConfigError

__all__ = ["canonical", "is_spec", "load_object", "source_of"]

_FROM_FILE: dict[str, Path] = {}  # module name -> the file it was imported from, by load_object


def is_spec(name: str) -> bool:
    """Whether ``name`` is a ``SOURCE:NAME`` spec rather than a registry id."""
    return isinstance(name, str) and ":" in name


def _split(spec: str, what: str) -> tuple[str, str]:
    source, _, attr = spec.rpartition(":")
    if not source or not attr or not all(part.isidentifier() for part in attr.split(".")):
        raise ConfigError(f"bad {what} {spec!r}: give path/to/file.py:Name or package.module:Name")
    return source, attr


def _is_file(source: str) -> bool:
    return source.endswith(".py") or "/" in source or "\\" in source


def canonical(spec: str) -> str:
    """``spec`` as it loads from any working directory: a file's path made absolute."""
    source, attr = _split(spec, "spec")
    return f"{Path(source).expanduser().resolve()}:{attr}" if _is_file(source) else spec


def _import_file(path: Path, what: str) -> Any:
    if not path.is_file():
        raise ConfigError(f"{what} file {str(path)!r} does not exist"
                          if not path.exists() else f"{what} file {str(path)!r} is not a file")
    name = path.stem
    if not name.isidentifier():
        raise ConfigError(f"{what} file {str(path)!r}: its name must be a Python identifier "
                          f"(it is imported as a module), e.g. {name.replace('-', '_')}.py")
    loaded = sys.modules.get(name)
    if loaded is None:
        spec = importlib.util.find_spec(name)
        origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
        if spec is not None and origin != path:
            raise ConfigError(f"{what} file {str(path)!r} is imported as module {name!r}, but "
                              f"that name is already taken by {origin or spec.name}; rename the "
                              "file")
        folder = str(path.parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        module = importlib.import_module(name)  # errors in the file itself propagate as they are
    else:
        where = getattr(loaded, "__file__", None)
        if where is None or Path(where).resolve() != path:
            raise ConfigError(f"{what} file {str(path)!r} is imported as module {name!r}, but a "
                              f"module of that name is already loaded from {where or 'builtins'}; "
                              "rename the file")
        module = loaded
    _FROM_FILE[name] = path
    return module


def load_object(spec: str, what: str = "object") -> Any:
    """The object ``spec`` names.

    Args:
        spec: ``path/to/file.py:Name`` (a file, relative to the working directory or absolute) or
            ``package.module:Name`` (an importable module); ``Name`` may be dotted
            (``Outer.Inner``).
        what: what the caller expects (``"strategy"``, ``"task"``), for messages.

    Raises:
        ConfigError: a malformed spec, a missing file or module, a missing name (listing what the
            module defines), a module name clash. Errors raised by the imported code itself
            propagate unchanged, with their traceback into the user's file.
    """
    source, attr = _split(spec, what)
    if _is_file(source):
        module = _import_file(Path(source).expanduser().resolve(), what)
        where = f"{what} file {source!r}"
    else:
        if not all(part.isidentifier() for part in source.split(".")):
            raise ConfigError(f"bad {what} {spec!r}: {source!r} is neither a .py file nor a "
                              "module name")
        try:
            module = importlib.import_module(source)
        except ModuleNotFoundError as err:
            if err.name is None or not source.startswith(err.name):
                raise  # the module exists; something it imports does not
            raise ConfigError(f"{what} {spec!r}: no module named {err.name!r} (a file needs its "
                              f".py suffix: path/to/file.py:Name)") from None
        where = f"module {source!r}"
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in vars(module) if not n.startswith("_")
                            and isinstance(vars(module)[n], type)
                            and vars(module)[n].__module__ == module.__name__)
            defined = f"; it defines: {', '.join(public)}" if public else ""
            raise ConfigError(f"{where} has no {attr!r}{defined}")
        obj = getattr(obj, part)
    return obj


def source_of(obj: Any) -> str:
    """The spec that loads ``obj`` (a class or function) again in a fresh process:
    ``/absolute/path/file.py:Name`` for objects of a file imported by :func:`load_object`,
    ``package.module:Name`` otherwise."""
    module, name = obj.__module__, obj.__qualname__
    path = _FROM_FILE.get(module)
    return f"{path}:{name}" if path is not None else f"{module}:{name}"
