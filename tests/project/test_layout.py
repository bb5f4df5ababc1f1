"""The package layout: layers that never import upwards (but the two hand-ons to EXO Gym's
compatibility that pyproject.toml lists), no import cycle between modules, and EXO Gym's module
paths (exogym.trainer, exogym.aux) as aliases."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest

import exogym
from exogym._aliases import ALIASES, target

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: tomli, the same parser (pytest depends on it there)
    import tomli as tomllib

ROOT = Path(exogym.__file__).resolve().parent
# The layering is declared once, for import-linter, in pyproject.toml ([tool.importlinter]): its
# layers, top first ("a | b": one layer of two independent packages), and the only imports
# upwards (EXO Gym's names under exogym's paths, EXO Gym's form of the fit call), each by its
# modules' names (no wildcards: they are matched as they are).
_LAYERS = next(c for c in tomllib.loads((ROOT.parent / "pyproject.toml").read_text(
    encoding="utf-8"))["tool"]["importlinter"]["contracts"] if c["id"] == "layers")
# A module may import its own layer and the layers below it, never one above.
RANK = {name.strip().removeprefix("exogym."): len(_LAYERS["layers"]) - 1 - i
        for i, layer in enumerate(_LAYERS["layers"]) for name in re.split(r"[|:]", layer)}
EXO_GYM_PATHS = {tuple(side.strip() for side in entry.split("->"))
                 for entry in _LAYERS["ignore_imports"]}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "exogym" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in RANK else None


def _imports(path: Path) -> list[str]:
    """The modules ``path`` imports, at run time: not those under ``if TYPE_CHECKING:`` (as
    import-linter's exclude_type_checking_imports)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                   for stmt in block.body for n in ast.walk(stmt)}
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
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
            if there is not None and RANK[there] > RANK[here] \
                    and (".".join(rel.parts), imported) not in EXO_GYM_PATHS:
                bad.append(f"{'/'.join(rel.parts)}.py ({here}) imports {imported} ({there})")
    assert not bad, "\n".join(bad)


def _module_graph() -> dict[str, set[str]]:
    """Each exogym module -> the exogym modules it imports, at module level or inside a
    function (as grimp and import-linter count them), but not under ``if TYPE_CHECKING:``."""
    paths = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str:  # a module, or the package whose attribute it is
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        found: set[str] = set()
        todo: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"))]
        while todo:
            node = todo.pop()
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                todo.extend(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.update(known(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.update(known(f"{node.module}.{a.name}") for a in node.names)
            todo.extend(ast.iter_child_nodes(node))
        graph[module] = {m for m in found if m and m != module}
    return graph


def test_no_import_cycles() -> None:
    # every cycle runs through an edge whose target reaches back to its source
    graph = _module_graph()
    # the graph holds the imports made inside functions too (EXO Gym's names, on first use)
    assert len(graph) > 100 and "exogym.compat.exo_gym" in graph["exogym.strategy._exo_gym"]

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            m = todo.pop()
            if m == goal:
                return True
            if m not in seen:
                seen.add(m)
                todo.extend(graph[m])
        return False

    cycles = sorted(f"{a} -> {b} -> ... -> {a}" for a in graph for b in graph[a]
                    if reaches(b, a))
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("old", sorted(k for k in ALIASES if not k.endswith(".")))
def test_aliased_module_paths_are_the_new_modules(old: str) -> None:
    new = target(old)
    assert new is not None
    assert importlib.import_module(old) is importlib.import_module(new)


def test_the_run_layer_s_documented_names_import_from_old_and_new_paths() -> None:
    from exogym.run.ft_launch import fit_ft
    from exogym.run.ft_replay import world_of
    from exogym.run.result import FitResult
    from exogym.run.sinks import CSVSink

    import exogym.run as run
    import exogym.run.ft as ft

    assert (run.FitResult, run.CSVSink, ft.fit_ft, ft.world_of) == (
        FitResult, CSVSink, fit_ft, world_of)
    assert set(run.__all__) <= set(dir(run)) and set(ft.__all__) <= set(dir(ft))
    for name in run.__all__:
        assert getattr(run, name).__module__.startswith("exogym.run."), name


def test_exo_gym_s_package_path_aliases_every_submodule() -> None:
    import exogym.aux.utils

    import exogym.compat.exo_gym.auxiliary.utils

    assert exogym.aux.utils is exogym.compat.exo_gym.auxiliary.utils
    from exogym.aux.utils import get_device

    from exogym.compat.exo_gym import get_device as same

    assert get_device is same
    assert target("exogym.aux.logger") == "exogym.compat.exo_gym.auxiliary.logger"
    assert target("exogym.trainerx") is None


def test_exogym_s_own_old_flat_paths_are_gone() -> None:
    for old, missing in [("exogym.engine", "exogym.engine"), ("exogym.result", "exogym.result"),
                         ("exogym.optim", "exogym.optim"), ("exogym.data.mnist", "exogym.data")]:
        assert target(old) is None
        with pytest.raises(ModuleNotFoundError, match=rf"No module named '{missing}'$"):
            importlib.import_module(old)
