"""The command line end to end on the real MNIST (tiny budgets), and its errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from exogym.cli import main

SHARED_DATA = Path(os.environ.get("EXOGYM_DATA_DIR") or
                   Path(__file__).resolve().parents[2] / "shared" / "data")


def run(*args: str) -> int:
    return main(["run", "--data-dir", str(SHARED_DATA), "--no-progress", "--no-download", *args])


def test_run_diloco_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    rc = run("--strategy", "diloco", "--nodes", "2", "--steps", "6", "--batch-size", "16",
             "--set", "H=3", "--eval-interval", "3", "--log-interval", "2", "--out", str(out))
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    config = json.loads((out / "config.json").read_text())

    assert summary["strategy"] == "diloco" and summary["hyperparameters"]["H"] == 3
    assert summary["steps"] == 6 and summary["num_nodes"] == 2
    assert summary["samples"] == 6 * 2 * 16
    # 2 outer steps, each a ring all-reduce of the fp32 pseudo-gradient: 2 (N-1)/N P = P bytes.
    assert summary["bytes_sent_per_node"] == [2 * 4 * 215_370] * 2
    assert 0.0 <= summary["final"]["eval_accuracy"] <= 1.0
    assert [r["step"] for r in rows] == [2, 3, 4, 6]  # log every 2, eval at 3 and 6
    assert "eval_loss" in rows[1] and "eval_loss" not in rows[0]
    # During training: a fixed 2,000-image subset of the test set; at the end: all 10,000.
    assert summary["eval_during_training"] == ("2,000-sample fixed subset (seed 0) of "
                                               "t10k-images-idx3-ubyte.gz (10,000)")
    assert summary["eval_set"] == "t10k-images-idx3-ubyte.gz (10,000)"
    assert rows[-1]["eval_accuracy"] != summary["final"]["eval_accuracy"]
    assert config["parameters"] == 215_370
    printed = capsys.readouterr().out
    assert "final eval" in printed and "samples/s" in printed and "sent" in printed


def test_run_ddp_learns(tmp_path: Path) -> None:
    out = tmp_path / "ddp"
    assert run("--strategy", "ddp", "--nodes", "2", "--steps", "40", "--batch-size", "32",
               "--lr", "2e-3", "--eval-interval", "40", "--out", str(out)) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["hyperparameters"]["optim.lr"] == 2e-3
    assert summary["final"]["eval_accuracy"] > 0.7  # chance is 0.1


def test_strategies_lists_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["strategies"]) == 0
    text = capsys.readouterr().out
    for sid in ("ddp", "fedavg", "diloco"):
        assert f"{sid}  (" in text
    assert "outer_lr" in text and "0.7" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--strategy", "dilocoo"),
         "unknown strategy 'dilocoo'; available: async_local_sgd, ddp, "),
        (("--set", "Hh=5"), "did you mean 'H'?"),
        (("--set", "H=zero"), "H takes an integer"),
        (("--set", "H=0"), "H must be an integer >= 1"),
        (("--set", "H"), "expected KEY=VALUE"),
        (("--task", "mnsit"), "unknown task 'mnsit' (did you mean 'mnist'?)"),
        (("--nodes", "0"), "--nodes: expected an integer >= 1, got 0"),
        (("--lr", "1e-3", "--set", "optim.lr=1e-2"), "give the inner learning rate once"),
        (("--engine", "jit"), "invalid choice: 'jit'"),
    ],
)
def test_bad_input_is_a_clear_error(
    args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    try:
        rc = run("--steps", "1", "--out", str(tmp_path / "x"), *args)
    except SystemExit as exit_:  # argparse errors
        rc = exit_.code
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x" / "metrics.jsonl").exists()


def test_missing_data_folder_says_where_to_put_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere"
    rc = main(["run", "--data-dir", str(missing), "--no-download", "--steps", "100",
               "--no-progress", "--out", str(tmp_path / "x")])
    assert rc == 2
    err = capsys.readouterr().err
    assert str(missing / "mnist") in err
    assert "train-images-idx3-ubyte.gz" in err and "EXOGYM_DATA_DIR" in err


def test_existing_run_folder_is_not_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    rc = run("--steps", "1", "--batch-size", "8", "--out", str(out))
    assert rc == 2
    assert "already exists" in capsys.readouterr().err
    assert (out / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_run_with_process_engine(tmp_path: Path) -> None:
    """`--engine process`: one worker process per node over gloo, the same summary fields."""
    out = tmp_path / "proc"
    assert run("--engine", "process", "--strategy", "fedavg", "--set", "H=2", "--nodes", "2",
               "--steps", "4", "--batch-size", "16", "--eval-interval", "4",
               "--out", str(out)) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["num_nodes"] == 2
    # 2 averagings of the 861,480 parameter bytes; ring with N = 2: 2 (N-1)/N P = P per sync.
    assert summary["bytes_sent_per_node"] == [2 * 861_480] * 2
    assert 0.0 <= summary["final"]["eval_accuracy"] <= 1.0
