"""The recorded outputs of README.md and docs/ are not stale: every command they show still
parses, every file that shows them says the machine they were recorded on, and (slow, a CI step
of its own) the README's main job run again gives the recorded table: what does not depend on
the machine exactly (bytes sent per node), the final accuracy and loss within what another CPU's
float round-off moves them (0.5 percentage points; 10% of the loss)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.scripts import load_script

from exogym.cli import main

readme_outputs = load_script("bench/readme_outputs.py")


def test_every_recorded_command_parses_and_the_machine_is_stated() -> None:
    shown = 0
    for path in readme_outputs.FILES:
        text = path.read_text(encoding="utf-8")
        found = readme_outputs.blocks(text)
        if not found:
            continue
        shown += len(found)
        assert readme_outputs.check(found) == 0, path
        stated = readme_outputs.MACHINE.search(text)
        assert stated is not None and "recorded" in stated.group(2), path
    assert shown >= 9


def test_the_readme_shows_the_main_job() -> None:
    block = readme_outputs.blocks(readme_outputs.README.read_text(encoding="utf-8"))[0]
    cmd, shown = block.commands[0]
    assert cmd.startswith("exogym compare --task mnist") and len(_table(shown)) == 5


def test_fill_keeps_the_lines_a_trimmed_block_shows() -> None:
    shown = ["...", "traffic     old", "sim clock   old", "            old compute"]
    got = ["strategy x", "traffic     new", "world       w", "sim clock   new",
           "            new compute", "            on another network"]
    assert readme_outputs.fill(shown, got) == ["...", "traffic     new", "sim clock   new",
                                               "            new compute"]
    bar = ["100%|##| 5/5 [old]", "strategy x"]
    assert readme_outputs.fill(bar, ["  0%|  | 0/5", "100%|##| 5/5 [new]", "strategy y",
                                     "exogym: warning: w"]) == ["100%|##| 5/5 [new]",
                                                                "strategy y"]
    table = ["...", "| a | b |", "|---|---|", "| `x` | 1 |"]
    assert readme_outputs.fill(table, ["[1/1] x", "| a | b |", "|---|---|", "| `x` | 2 |",
                                       "written to  out"]) == ["...", "| a | b |", "|---|---|",
                                                               "| `x` | 2 |"]


def test_a_command_shown_twice_runs_once(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    monkeypatch.setattr(readme_outputs, "run", lambda cmd: ran.append(cmd) or ["out"])
    text = ("<!-- readme-machine -->\nold\n<!-- /readme-machine -->\n"
            "```\n$ exogym tasks\nold\n```\n\n```\n$ exogym tasks\nold\n```\n")
    outputs: dict[str, list[str]] = {}
    new = readme_outputs.regenerate(text, readme_outputs.blocks(text), outputs)
    assert ran == ["exogym tasks"] and new.count("$ exogym tasks\nout\n") == 2
    assert "old" not in new and "recorded on" in new


def test_a_table_block_becomes_the_table_the_command_prints(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readme_outputs, "run",
                        lambda cmd: ["[1/1] x", "| a | b |", "|---|---|", "| `x` | 2 |", "done"])
    text = ("<!-- readme-machine -->\nold\n<!-- /readme-machine -->\n"
            "<!-- readme-table: exogym tasks -->\n| a | b |\n|---|---|\n| `x` | 1 |\n\nprose\n")
    found = readme_outputs.blocks(text)
    assert [b.table for b in found] == [True]
    new = readme_outputs.regenerate(text, found, {})
    assert new.endswith("<!-- readme-table: exogym tasks -->\n| a | b |\n|---|---|\n"
                        "| `x` | 2 |\n\nprose\n")


def _table(lines: list[str]) -> dict[str, dict[str, float]]:
    """The comparison table's numbers by strategy: sent per node (MB), accuracy (%), loss."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines
            if line.startswith("| `")]
    return {r[0].strip("`"): {"loss": float(r[1]), "accuracy": float(r[2].rstrip("%")),
                              "sent": float(re.sub(r" MB$", "", r[5]))} for r in rows}


@pytest.mark.slow
def test_the_main_job_gives_the_recorded_numbers(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str],
                                                 mnist_data: Path) -> None:
    block = readme_outputs.blocks(readme_outputs.README.read_text(encoding="utf-8"))[0]
    cmd, shown = block.commands[0]
    argv = [*cmd.split()[1:], "--out", str(tmp_path / "cmp"), "--data-dir", str(mnist_data),
            "--no-progress"]
    assert main(argv) == 0
    got, want = _table(capsys.readouterr().out.splitlines()), _table(shown)
    assert sorted(got) == sorted(want)
    for strategy, numbers in want.items():
        assert got[strategy]["sent"] == numbers["sent"], strategy
        assert got[strategy]["accuracy"] == pytest.approx(numbers["accuracy"], abs=0.5)
        assert got[strategy]["loss"] == pytest.approx(numbers["loss"], rel=0.1)
