"""The README's Python code runs as written (on tiny budgets), and its main example gives the
command line's numbers for the same seed.

Every ```python block of README.md is executed in a fresh namespace, in a temporary folder, with
the substitutions below (each must still match the README: a changed example fails here until
this table follows it). A block right after an ``<!-- fragment ... -->`` comment continues an
earlier one (``trainer.fit(..., sinks=...)``): it is only compiled.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from exogym.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
# a block naming a dataset reads it (from $EXOGYM_DATA_DIR, set to the tests' data folder)
DATASETS = {"mnist": "mnist_data", "cifar": "cifar10_data", "shakespeare": "shakespeare_data"}

# README text -> what runs here (budgets only; the code is otherwise the README's own).
TINY = {
    "max_steps=500": "max_steps=20",
    "DiLoCo(H=100)": "DiLoCo(H=10)",
    "num_epochs=10)": "max_local_step=20, diloco_interval=10)",
}

_BLOCK = re.compile(r"(?P<before>[^\n]*)\n```python\n(?P<code>.*?)```", re.S)


def _blocks() -> list[tuple[int, str, bool]]:
    """``(line, code, fragment)`` for every python block of the README."""
    text = README.read_text(encoding="utf-8")
    out = []
    for m in _BLOCK.finditer(text):
        line = text[: m.start("code")].count("\n") + 1
        out.append((line, m.group("code"), m.group("before").startswith("<!-- fragment")))
    return out


def test_every_substitution_still_matches_the_readme() -> None:
    text = README.read_text(encoding="utf-8")
    for old in TINY:
        assert old in text, f"README no longer contains {old!r}: update TINY in {__file__}"
    assert len(_blocks()) >= 2


@pytest.mark.parametrize(("line", "code", "fragment"), _blocks(),
                         ids=[f"README.md:{line}" for line, _, _ in _blocks()])
def test_readme_python_block_runs(line: int, code: str, fragment: bool, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch, data_dir: Path,
                                  request: pytest.FixtureRequest) -> None:
    compiled = compile(code, f"README.md:{line}", "exec")
    if fragment:
        return  # continues an earlier block: compiling it is the check
    for name, fixture in DATASETS.items():
        if name in code.lower():
            request.getfixturevalue(fixture)
    for old, new in TINY.items():
        code = code.replace(old, new)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EXOGYM_DATA_DIR", str(data_dir))
    namespace: dict[str, Any] = {"__name__": "__readme__"}
    exec(compile(code, f"README.md:{line}", "exec"), namespace)
    assert compiled is not None


def test_the_python_example_gives_the_cli_numbers(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  mnist_data: Path) -> None:
    """The "From Python" example (seed, then the model) equals `exogym run` with that seed."""
    line, code, _ = _blocks()[0]
    assert "Trainer(" in code and "torch.manual_seed(0)" in code
    for old, new in TINY.items():
        code = code.replace(old, new)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EXOGYM_DATA_DIR", str(mnist_data))
    namespace: dict[str, Any] = {}
    exec(compile(code, f"README.md:{line}", "exec"), namespace)
    python_final = namespace["result"].final
    out = tmp_path / "cli"
    assert main(["run", "--task", "mnist", "--strategy", "diloco", "--nodes", "4", "--steps",
                 "20", "--set", "H=10", "--seed", "0", "--no-progress", "--out", str(out)]) == 0
    cli_final = json.loads((out / "summary.json").read_text())["final"]
    assert python_final == cli_final  # bit for bit: same weights, data order, strategy
