"""Where exogym looks for (and stores) datasets.

Precedence, highest first:

1. an explicit ``data_dir`` argument (the CLI flag ``--data-dir``);
2. the environment variable ``EXOGYM_DATA_DIR`` (if set and non-empty);
3. the user cache: ``$XDG_CACHE_HOME/exogym/data``, or ``~/.cache/exogym/data``.

Each dataset lives in its own sub-folder of the data dir, e.g. ``<data_dir>/mnist/``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENV_VAR", "default_cache_dir", "resolve_data_dir"]

ENV_VAR = "EXOGYM_DATA_DIR"
"""Environment variable naming the data directory when no explicit one is given."""


def default_cache_dir() -> Path:
    """Return the default data directory (absolute, not created).

    ``$XDG_CACHE_HOME/exogym/data`` when ``XDG_CACHE_HOME`` is set and non-empty,
    otherwise ``~/.cache/exogym/data``.
    """
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "exogym" / "data").absolute()


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """Resolve the data directory to use.

    Args:
        data_dir: explicit directory (e.g. from ``--data-dir``); wins over everything else.
            ``None`` or ``""`` means "not given".

    Returns:
        An absolute path with ``~`` expanded. The directory is not created and need not exist.

    Raises:
        ValueError: if the chosen path exists but is not a directory.
    """
    if data_dir is not None and os.fspath(data_dir) != "":
        path, source = Path(os.fspath(data_dir)), "data_dir argument (--data-dir)"
    elif os.environ.get(ENV_VAR):
        path, source = Path(os.environ[ENV_VAR]), f"environment variable {ENV_VAR}"
    else:
        path, source = default_cache_dir(), "default cache directory"
    path = path.expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"data directory {str(path)!r} (from {source}) exists but is not a directory; "
            "pass a directory path (it may be missing, it will be created when needed)"
        )
    return path
