"""The repository's scripts imported by path, and fresh processes that import the tests' helpers.

A test imports a script of ``bench/`` or ``examples/`` with :func:`load_script`
(``importlib.util.spec_from_file_location``), never by putting its folder on ``sys.path``. A
Python process a test starts finds ``support`` (and any test folder named) through the
``PYTHONPATH`` of :func:`child_env`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root folder."""
TESTS = ROOT / "tests"


def load_script(path: str, name: str | None = None) -> ModuleType:
    """The script at ``path`` (relative to the repository, ``"bench/clock_fidelity.py"``) as a
    module named ``name`` (default: the file's stem, as ``python path`` and exogym's
    ``file.py:Name`` name it), registered in ``sys.modules`` (dataclasses look their module up
    there); the module already loaded from that file when there is one."""
    file = (ROOT / path).resolve()
    name = name or file.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        where = getattr(loaded, "__file__", None)
        if where is not None and Path(where).resolve() == file:
            return loaded
        raise ImportError(f"{path}: the module name {name!r} is taken by {where or loaded!r}; "
                          "give load_script another name")
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def child_env(*folders: Path, **variables: str) -> dict[str, str]:
    """``os.environ`` for a fresh Python process that imports ``support`` (``tests/`` first on its
    ``PYTHONPATH``, then ``folders``, then the inherited entries), with ``variables`` set."""
    inherited = os.environ.get("PYTHONPATH", "")
    entries = [str(TESTS), *(str(f) for f in folders), *([inherited] if inherited else [])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(entries), **variables}
