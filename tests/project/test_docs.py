"""Every command and code block of the documentation works as written: README.md,
CONTRIBUTING.md and every page of ``docs/`` (the site ``mkdocs build --strict`` builds in CI).

- A ```python block runs in a fresh namespace, in a temporary folder, with the budget cuts of
  :data:`TINY` (each must still match its file: a changed example fails here until the table
  follows it). A block right after ``<!-- fragment ... -->`` continues an earlier one or is a
  method shown alone: it is compiled. One after ``<!-- excerpt: PATH -->`` shows lines of that
  file: they must be lines of it, in its order (:func:`excerpt_mismatch`).
- A command of a ```bash block or of a ``$ `` line: ``exogym ...`` (also under ``torchrun ... -m
  exogym``) parses with today's command line (``...`` stands for options left out); ``python
  FILE`` and ``bash FILE`` name a file of the repository.
- A path of the repository named in backticks (``examples/my_method.py``, ``bench/...``,
  ``tests/...``, ``exogym/run/...``) exists.
- The README's Python example gives the numbers of the command line for the same seed.
"""

from __future__ import annotations

import json
import re
import shlex
import textwrap
from pathlib import Path
from typing import Any

import pytest
from support.scripts import ROOT

from exogym.cli import build_parser, main
from exogym.sim.network import parse_network, write_network_file

README = ROOT / "README.md"
DOCS = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
# a block naming a dataset reads it (from $EXOGYM_DATA_DIR, set to the tests' data folder)
DATASETS = {"mnist": "mnist_data", "cifar": "cifar10_data", "shakespeare": "shakespeare_data"}

# file -> {text: what runs here}: budgets only; the code is otherwise the documentation's own
_MNIST_EXAMPLE = {"max_steps=500": "max_steps=20", "DiLoCo(H=100)": "DiLoCo(H=10)"}
TINY: dict[str, dict[str, str]] = {
    "README.md": _MNIST_EXAMPLE,
    "docs/python.md": _MNIST_EXAMPLE,
    "docs/from-exo-gym.md": {"num_epochs=10)": "max_local_step=20, diloco_interval=10)"},
    "docs/claims.md": {'"runs/claims", suite=SUITE)': '"runs/claims", suite=SUITE, quick=True)'},
}

_BLOCK = re.compile(r"(?P<before>[^\n]*)\n```(?P<lang>[a-z]*)\n(?P<code>.*?)```", re.S)
_PATH = re.compile(r"`((?:examples|bench|tests|docs|exogym/(?:sim|strategy|run|lab|tasks|utils"
                   r"|compat|cli))/[\w./-]*)`")
# programs whose commands are not exogym's: set-up, other tools, shell
_OTHER = {"pip", "ruff", "lint-imports", "mkdocs", "tensorboard", "torchft_lighthouse", "for",
          "done", "wait", "head", "cd", "git", "export", "wandb", "sysctl"}


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _blocks(lang: str) -> list[tuple[str, int, str, str]]:
    """``(file, line, code, the line before)`` of every ```lang block of the documentation."""
    out = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in _BLOCK.finditer(text):
            if m.group("lang") == lang:
                line = text[: m.start("code")].count("\n") + 1
                out.append((_name(path), line, m.group("code"), m.group("before")))
    return out


PYTHON = _blocks("python")


def excerpt_mismatch(code: str, source: str) -> str:
    """"" when the block ``code`` is an excerpt of the file text ``source``: its lines, trailing
    whitespace stripped and ``...`` lines (elisions) left out, are lines of ``source`` in the
    file's order (a subsequence: any number of the file's lines may lie between two shown ones,
    where ``...`` says so or not). Else the first line not found in order, and why."""
    lines = [line.rstrip() for line in source.splitlines()]
    after = 0  # the block's next line is looked for from the file's line after + 1 on
    for number, shown in enumerate(code.splitlines(), 1):
        shown = shown.rstrip()
        if shown.strip() == "...":
            continue
        try:
            after = lines.index(shown, after) + 1
        except ValueError:
            why = (f"out of order: the file has it only up to its line {after}, which an earlier "
                   "line of the block matched" if shown in lines else "not a line of the file")
            return f"line {number} of the block, {shown!r}: {why}"
    return ""


SOURCE = "def f(x):\n    a = 1\n    b = (\n        2)\n    return a + b  \n"


def test_an_excerpt_with_elisions_passes() -> None:
    assert excerpt_mismatch("def f(x):\n    ...\n    return a + b\n", SOURCE) == ""
    assert excerpt_mismatch("    a = 1   \n        2)\n", SOURCE) == ""  # skipped without ...
    assert excerpt_mismatch("...\n    return a + b\n...\n", SOURCE) == ""


def test_an_excerpt_out_of_order_fails_naming_the_line() -> None:
    assert excerpt_mismatch("    b = (\n    a = 1\n", SOURCE) == (
        "line 2 of the block, '    a = 1': out of order: the file has it only up to its line 3, "
        "which an earlier line of the block matched")
    # a line shown twice must be in the file twice
    assert excerpt_mismatch("    a = 1\n    a = 1\n", SOURCE).startswith("line 2 of the block")


def test_an_excerpt_with_a_line_not_in_the_file_fails_naming_it() -> None:
    assert excerpt_mismatch("def f(x):\n    c = 3\n", SOURCE) == (
        "line 2 of the block, '    c = 3': not a line of the file")
    # a part of a line, or a line at another indentation, is not that line
    assert excerpt_mismatch(")\n", SOURCE) == "line 1 of the block, ')': not a line of the file"
    assert excerpt_mismatch("a = 1\n", SOURCE).endswith("not a line of the file")


def test_every_substitution_still_matches_its_file() -> None:
    for name, table in TINY.items():
        text = (ROOT / name).read_text(encoding="utf-8")
        for old in table:
            assert old in text, f"{name} no longer contains {old!r}: update TINY in {__file__}"
    assert len(PYTHON) >= 10


@pytest.mark.parametrize(("name", "line", "code", "before"), PYTHON,
                         ids=[f"{n}:{line}" for n, line, _, _ in PYTHON])
def test_python_block_runs(name: str, line: int, code: str, before: str, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch, data_dir: Path,
                           request: pytest.FixtureRequest) -> None:
    where = f"{name}:{line}"
    if before.startswith("<!-- excerpt:"):
        path = before.split(":", 1)[1].strip(" ->")
        problem = excerpt_mismatch(code, (ROOT / path).read_text(encoding="utf-8"))
        assert not problem, f"{where} is no excerpt of {path}: {problem}"
        return
    compile(textwrap.dedent(code), where, "exec")  # a SyntaxError fails every kind of block
    if before.startswith("<!-- fragment"):
        return  # continues an earlier block or shows a method alone: compiling is the check
    for dataset, fixture in DATASETS.items():
        if dataset in code.lower():
            request.getfixturevalue(fixture)
    for old, new in TINY.get(name, {}).items():
        code = code.replace(old, new)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EXOGYM_DATA_DIR", str(data_dir))
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    exec(compile(code, where, "exec"), namespace)


def _commands() -> list[tuple[str, str]]:
    """``(where, command)`` for every command line of the documentation's shell blocks: a
    ```bash block's lines, and the ``$ `` lines of a block of commands and their output."""
    out = []
    for lang in ("bash", ""):
        for name, line, code, _ in _blocks(lang):
            lines = code.split("\n")
            prompt = lines[0].startswith("$ ")
            if lang == "" and not prompt:
                continue  # an output, not commands
            i = 0
            while i < len(lines):
                cmd, at = lines[i], line + i
                while cmd.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    cmd = cmd.rstrip()[:-1] + " " + lines[i].strip()
                i += 1
                if prompt and not cmd.startswith("$ "):
                    continue  # a line of a command's output
                words = shlex.split(cmd.removeprefix("$ "), comments=True)
                while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                    words.pop(0)  # VAR=value before the command
                if words:
                    out.append((f"{name}:{at}", shlex.join(words)))
    return out


COMMANDS = _commands()


def test_the_documentation_shows_commands() -> None:
    exogym = [c for _, c in COMMANDS if c.startswith("exogym ")]
    assert len(exogym) >= 40 and any("torchrun" in c for _, c in COMMANDS)


def _inputs(words: list[str], folder: Path) -> list[str]:
    """``words`` with the files a documented command reads that an earlier documented step
    writes (a calibrated network, an availability trace) made in ``folder``, valid ones."""
    out = []
    for i, w in enumerate(words):
        name = w.split(",")[0]
        if i and words[i - 1] == "--network" and name.endswith(".json"):
            write_network_file(folder / name, parse_network("datacenter"))
            w = str(folder / w)
        elif w.startswith("trace:") and not (ROOT / name[len("trace:"):]).exists():
            trace = {"format": "exogym-availability-v1", "nodes": [[[0, None]]]}
            (folder / name[len("trace:"):]).write_text(json.dumps(trace))
            w = "trace:" + str(folder / w[len("trace:"):])
        out.append(w)
    return out


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_command_parses(where: str, command: str, tmp_path: Path) -> None:
    words = [w for w in shlex.split(command) if w != "..."]
    if words[0] == "sudo":  # sudo [-E] $(command -v python) FILE ...
        words = [w for w in words[1:] if not w.startswith("-")]
        words = ["python" if w == "$(command -v python)" else w for w in words]
    if "-m" in words and words[words.index("-m") + 1] == "exogym":  # torchrun / python -m
        words = ["exogym", *words[words.index("-m") + 2:]]
    program = words[0]
    if program == "exogym":
        try:
            build_parser().parse_args(_inputs(words[1:], tmp_path))
        except SystemExit as e:
            pytest.fail(f"{where}: {command!r} does not parse (exit {e.code})")
    elif program in ("python", "bash") and words[1] != "-m":
        assert (ROOT / words[1]).is_file(), f"{where}: {words[1]} is not a file"
    elif program == "python":  # python -m MODULE: pytest's paths exist
        for w in words[3:]:
            if w.startswith("tests/"):
                assert (ROOT / w.split("::")[0]).exists(), f"{where}: {w} does not exist"
    else:
        assert program in _OTHER, f"{where}: {command!r}: a program this test does not know"


def test_every_path_named_exists() -> None:
    missing = []
    for path in DOCS:
        for m in _PATH.finditer(path.read_text(encoding="utf-8")):
            named = m.group(1)
            if "*" in named or re.search(r"[A-Z]{3,}", named):
                continue  # a pattern or a placeholder (RUN_DIR)
            if not (ROOT / named.rstrip("/")).exists():
                missing.append(f"{_name(path)}: {named}")
    assert not missing, missing


def test_the_python_example_gives_the_cli_numbers(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  mnist_data: Path) -> None:
    """The README's example (seed, then the model) equals `exogym run` with that seed."""
    name, line, code, _ = PYTHON[0]
    assert name == "README.md" and "Trainer(" in code and "torch.manual_seed(0)" in code
    for old, new in TINY[name].items():
        code = code.replace(old, new)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EXOGYM_DATA_DIR", str(mnist_data))
    namespace: dict[str, Any] = {}
    exec(compile(code, f"{name}:{line}", "exec"), namespace)
    python_final = namespace["result"].final
    out = tmp_path / "cli"
    assert main(["run", "--task", "mnist", "--strategy", "diloco", "--nodes", "4", "--steps",
                 "20", "--set", "H=10", "--network", "home-100mbps", "--seed", "0",
                 "--no-progress", "--out", str(out)]) == 0
    cli_final = json.loads((out / "summary.json").read_text())["final"]
    assert python_final == cli_final  # bit for bit: same weights, data order, strategy


_SECTION = re.compile(r"(Args|Arguments|Attributes)( \(.*\))?:")
_GROUPED = re.compile(r"\s+([A-Za-z_]\w*(?:, [A-Za-z_]\w*)+):\s")


def test_no_docstring_entry_documents_several_names_at_once() -> None:
    """An ``Args`` / ``Attributes`` entry names one parameter: ``a, b: ...`` renders in the API
    reference as an attribute ``a,`` of type ``b`` (mkdocstrings' Google parser)."""
    import ast

    grouped = []
    for path in sorted((ROOT / "exogym").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                     ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node, clean=False) or ""
            in_section = False
            for line in doc.splitlines():
                if re.fullmatch(r"[A-Z][a-z]+( \(.*\))?:", line.strip()):
                    in_section = bool(_SECTION.fullmatch(line.strip()))
                elif in_section and _GROUPED.match(line):
                    grouped.append(f"{_name(path)}: {line.strip()[:60]}")
    assert not grouped, "one name per entry:\n" + "\n".join(grouped)
