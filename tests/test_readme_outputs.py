"""The README's recorded outputs are not stale: every command they show still parses, they say
the machine they were recorded on, and (slow, a CI step of its own) the main job run again gives
the recorded numbers: what does not depend on the machine exactly (samples, bytes,
collectives), the final accuracy and loss within what another CPU's float round-off moves them
(0.5 percentage points; 10% of the loss)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import readme_outputs  # noqa: E402

from exogym.cli import main  # noqa: E402


def test_every_recorded_command_parses_and_the_machine_is_stated() -> None:
    text = readme_outputs.README.read_text(encoding="utf-8")
    found = readme_outputs.blocks(text)
    assert len(found) >= 8
    assert readme_outputs.check(found) == 0
    stated = readme_outputs.MACHINE.search(text)
    assert stated is not None and "recorded" in stated.group(2)


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


def _numbers(lines: list[str]) -> dict[str, float]:
    text = "\n".join(lines)
    pick = {
        "samples": r"\(([\d,]+) samples in", "sent": r"sent ([\d.]+) MB",
        "collectives": r"; (\d+) collectives\)", "loss": r"final eval  loss ([\d.]+)",
        "accuracy": r"accuracy ([\d.]+)%",
    }
    out = {}
    for key, pattern in pick.items():
        m = re.search(pattern, text)
        assert m is not None, f"no {key} in {text}"
        out[key] = float(m.group(1).replace(",", ""))
    return out


@pytest.mark.slow
def test_the_main_job_gives_the_recorded_numbers(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str],
                                                 mnist_data: Path) -> None:
    text = readme_outputs.README.read_text(encoding="utf-8")
    block = readme_outputs.blocks(text)[0]
    cmd, shown = block.commands[0]
    assert cmd == "exogym run --task mnist --strategy diloco --nodes 4 --steps 500"
    argv = [*cmd.split()[1:], "--out", str(tmp_path / "run"), "--data-dir", str(mnist_data),
            "--no-progress"]
    assert main(argv) == 0
    got, want = _numbers(capsys.readouterr().out.splitlines()), _numbers(shown)
    for key in ("samples", "sent", "collectives"):
        assert got[key] == want[key], key
    assert got["accuracy"] == pytest.approx(want["accuracy"], abs=0.5)
    assert got["loss"] == pytest.approx(want["loss"], rel=0.1)
