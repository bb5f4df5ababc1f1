"""``bench/engines.py`` runs end to end on a tiny budget: its table rows hold numbers, the engine
``auto`` chose, and the profile's phases add up to the step."""

from __future__ import annotations

import re

import torch
from support.scripts import ROOT, load_script

from exogym.sim.engine import auto_engine

SCRIPT = ROOT / "bench" / "engines.py"


def _bench():
    return load_script("bench/engines.py", "bench_engines")


def test_the_engines_table_compares_auto_with_plain_pytorch(capsys) -> None:
    bench = _bench()
    assert bench.main(["--models", "bn_cnn", "--nodes", "2", "--repeats", "1", "--rounds", "2",
                       "--steps", "1", "--warmup", "1", "--timed-samples", "0",
                       "--procs-max-nodes", "1"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    chosen = auto_engine(torch.device("cpu"), 2)
    assert re.fullmatch(rf"[\d,]+ \({chosen}\)", cells[4]), row
    numbers = [float(cells[i].replace(",", "")) for i in (1, 2, 3, 5, 6)]
    assert all(x > 0 for x in numbers), row
    assert cells[7] == "-" and cells[8] == "-"  # no process side with --procs-max-nodes 1
    assert re.fullmatch(r"[\d,]+ / [\d,]+ / -", cells[9]), row


def test_the_profile_splits_a_step_into_its_phases(capsys) -> None:
    bench = _bench()
    for engine, alone in (("loop", r"\d+\.\d"), ("threads", "-")):
        assert bench.main(["--profile", "--engine", engine, "--models", "dropout_mlp", "--nodes",
                           "1,2", "--steps", "2", "--warmup", "1"]) == 0
        rows = [line for line in capsys.readouterr().out.splitlines()
                if re.match(r"\| [12] \|", line)]
        assert len(rows) == 2
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split("|")]
            ms = [float(c.split()[0]) for c in cells[1:6]]
            percents = [int(c.split("(")[1].rstrip("%)")) for c in cells[1:6]]
            assert abs(sum(ms) - float(cells[6])) <= 0.5 and 97 <= sum(percents) <= 103
            assert re.fullmatch(alone, cells[7]), row  # the forward alone: loop only


def test_the_optimizer_table_times_each_implementation() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(SCRIPT.parent / "optimizers.py"), "--models",
                           "mnist_cnn", "--nodes", "2", "--steps", "1"],
                          capture_output=True, text=True, timeout=120, check=True)
    row = next(line for line in done.stdout.splitlines() if line.startswith("| mnist_cnn | 2 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "430,740"  # 2 x MnistCNN's 215,370 parameters, stacked
    loop, foreach, fused, ratio = (float(c) for c in cells[3:7])
    assert min(loop, foreach, fused) > 0
    assert abs(ratio - loop / fused) <= 0.05 * ratio + 0.05
