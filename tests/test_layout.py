"""The package layout: layers that never import upwards, and the old flat module paths."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import exogym
from exogym._aliases import ALIASES, target

ROOT = Path(exogym.__file__).resolve().parent
# A module may import its own layer and the layers below it, never one above.
RANK = {"utils": 0, "sim": 1, "tasks": 1, "strategy": 2, "run": 3, "compat": 4, "lab": 4,
        "cli": 5}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "exogym" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in RANK else None


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
    return out


def test_nothing_imports_upwards() -> None:
    bad = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        here = _layer(".".join(rel.parts))
        if here is None:
            continue
        for imported in _imports(path):
            there = _layer(imported)
            if there is not None and RANK[there] > RANK[here]:
                bad.append(f"{'/'.join(rel.parts)}.py ({here}) imports {imported} ({there})")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("old", sorted(k for k in ALIASES if not k.endswith(".")))
def test_old_module_paths_are_the_new_modules(old: str) -> None:
    new = target(old)
    assert new is not None
    assert importlib.import_module(old) is importlib.import_module(new)


def test_old_package_paths_alias_every_submodule() -> None:
    import exogym.data.mnist

    import exogym.tasks.data.mnist

    assert exogym.data.mnist is exogym.tasks.data.mnist
    from exogym.data.sharding import NodeBatches

    from exogym.sim.sharding import NodeBatches as Same

    assert NodeBatches is Same
    assert target("exogym.data.cifar10") == "exogym.tasks.data.cifar10"
    assert target("exogym.trainerx") is None
