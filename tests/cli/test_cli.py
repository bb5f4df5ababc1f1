"""The command line end to end on the real MNIST (tiny budgets), and its errors."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from exogym.cli import main


def run(data: Path, *args: str) -> int:
    return main(["run", "--data-dir", str(data), "--no-progress", "--no-download", *args])


def test_run_diloco_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               mnist_data: Path) -> None:
    out = tmp_path / "run"
    rc = run(mnist_data, "--strategy", "diloco", "--nodes", "2", "--steps", "6", "--batch-size",
             "16", "--set", "H=3", "--eval-interval", "3", "--log-interval", "2", "--out",
             str(out))
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


def test_run_ddp_learns(tmp_path: Path, mnist_data: Path) -> None:
    out = tmp_path / "ddp"
    assert run(mnist_data, "--strategy", "ddp", "--nodes", "2", "--steps", "40", "--batch-size",
               "32", "--lr", "2e-3", "--eval-interval", "40", "--out", str(out)) == 0
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
         "unknown strategy 'dilocoo' (did you mean 'diloco'?); available: async_local_sgd, "),
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
    args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    data_dir: Path,
) -> None:
    try:
        rc = run(data_dir, "--steps", "1", "--out", str(tmp_path / "x"), *args)
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
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data_dir: Path
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    rc = run(data_dir, "--steps", "1", "--batch-size", "8", "--out", str(out))
    assert rc == 2
    assert "already exists" in capsys.readouterr().err
    assert (out / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_run_with_process_engine(tmp_path: Path, mnist_data: Path) -> None:
    """`--engine process`: one worker process per node over gloo, the same summary fields."""
    out = tmp_path / "proc"
    assert run(mnist_data, "--engine", "process", "--strategy", "fedavg", "--set", "H=2",
               "--nodes", "2", "--steps", "4", "--batch-size", "16", "--eval-interval", "4",
               "--out", str(out)) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["num_nodes"] == 2
    # 2 averagings of the 861,480 parameter bytes; ring with N = 2: 2 (N-1)/N P = P per sync.
    assert summary["bytes_sent_per_node"] == [2 * 861_480] * 2
    assert 0.0 <= summary["final"]["eval_accuracy"] <= 1.0


# -- issue 25: the command line's messages ----------------------------------------------------
def test_recost_refuses_a_run_whose_world_ran_on_simulated_time(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], mnist_data: Path) -> None:
    """A world decided by simulated time (mtbf) cannot be replayed on another network, nor with
    another compute time: the command refuses as FitResult.recost does, with its message."""
    from exogym.sim.clock import ClockTrace
    from exogym.sim.network import parse_network

    out = tmp_path / "world"
    assert run(mnist_data, "--strategy", "ddp", "--nodes", "2", "--steps", "4", "--batch-size",
               "8", "--world", "mtbf=1s,mttr=0.5s", "--step-time", "10ms", "--eval-interval", "4",
               "--out", str(out)) == 0
    capsys.readouterr()
    trace = ClockTrace.from_dict(json.loads((out / "summary.json").read_text())["clock"]["trace"])
    assert trace.not_recostable is not None
    with pytest.raises(ValueError) as expected:  # what the Python API says
        trace.check_recostable(parse_network("home-100mbps"))
    for args, message in (
            (["--network", "home-100mbps"], str(expected.value)),
            ([], "cannot be re-costed on another network: its world (mtbf=1s,mttr=0.5s) decides "
                 "who is up by simulated time"),
            (["--network", "datacenter", "--step-time", "1s"],
             "cannot be re-costed with another compute time per step")):
        assert main(["recost", str(out), *args]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""  # no table
        assert captured.err.startswith("exogym: error: ") and captured.err.count("\n") == 1
        assert message in captured.err
    assert main(["recost", str(out), "--network", "datacenter"]) == 0  # its own: the recorded


def test_recost_takes_one_network_per_flag_and_a_spec_s_own_commas(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], mnist_data: Path) -> None:
    out = tmp_path / "run"
    assert run(mnist_data, "--strategy", "ddp", "--nodes", "2", "--steps", "2", "--batch-size",
               "8", "--eval-interval", "2", "--out", str(out)) == 0
    capsys.readouterr()
    for names in (["home-100mbps", "datacenter"], ["home-100mbps", "mobile", " datacenter"]):
        with pytest.raises(SystemExit) as exit_:
            main(["recost", str(out), "--network", ",".join(names)])
        assert exit_.value.code == 2
        first, hint = capsys.readouterr().err.splitlines()
        assert first == (f"exogym recost: error: argument --network: {','.join(names)!r} names "
                         f"{len(names)} networks: repeat --network for each, "
                         + " ".join(f"--network {n.strip()}" for n in names))
        assert hint == "see `exogym recost --help`"
    # commas inside one spec (key=value items after a name) are one network
    assert main(["recost", str(out), "--network", "home-100mbps,topology=peer",
                 "--network", "datacenter"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0] for line in table[3:]] == [
        "datacenter (the run)", "home-100mbps+", "datacenter"]


def test_strategies_shows_a_user_class_without_docstrings(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # the file's folder goes first on it
    (tmp_path / "nodoc_strategies.py").write_text(
        "from dataclasses import dataclass\n\nfrom exogym.strategy import DiLoCo\n\n\n"
        "@dataclass(kw_only=True)\nclass Bare(DiLoCo):\n    pass\n\n\n"
        "@dataclass(kw_only=True)\nclass Told(DiLoCo):\n"
        '    """DiLoCo, told apart.\n\n    More.\n    """\n')
    assert main(["strategies", f"{tmp_path}/nodoc_strategies.py:Bare",
                 f"{tmp_path}/nodoc_strategies.py:Told"]) == 0
    text = capsys.readouterr().out
    assert "Bare  (Bare): (no docstring)\n" in text
    assert "Told  (Told): DiLoCo, told apart.\n" in text
    sys.modules.pop("nodoc_strategies", None)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("--nodes", "0"), "argument --nodes: expected an integer >= 1, got 0"),
        (("--stpes", "10"), "unrecognized arguments: --stpes 10 (did you mean --steps?)"),
        (("--network", "home-100mb"), "unknown network profile 'home-100mb'"),
        (("--lr", "inf"), "argument --lr: expected a finite number > 0, got 'inf'"),
        (("--precision", "bf61"), "invalid choice: 'bf61' (choose from 'fp32', 'bf16') (did you "
                                  "mean 'bf16'?)"),
    ],
)
def test_usage_errors_are_one_line_and_a_hint(
        args: tuple[str, ...], error: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", *args])
    assert exit_.value.code == 2
    first, hint = capsys.readouterr().err.splitlines()  # not argparse's usage block
    assert first.startswith("exogym run: error: ") and error in first
    assert hint == "see `exogym run --help`"
    if args[0] == "--network":
        assert first.endswith("(did you mean 'home-100mbps'?)")


def test_a_misspelled_command_is_one_line_with_a_suggestion(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["rnu"])
    assert exit_.value.code == 2
    first, hint = capsys.readouterr().err.splitlines()
    assert first.startswith("exogym: error: argument COMMAND: invalid choice: 'rnu'")
    assert first.endswith("(did you mean 'run'?)") and hint == "see `exogym --help`"


def test_warnings_are_one_line_in_the_cli_only(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], mnist_data: Path) -> None:
    shown = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert run(mnist_data, "--strategy", "diloco", "--set", "H=2", "--nodes", "2",
                   "--steps", "3", "--batch-size", "8", "--eval-interval", "3", "--out",
                   str(tmp_path / "r")) == 0
    err = capsys.readouterr().err
    assert ("exogym: warning: diloco: 3 steps is not a multiple of H=2: the last 1 local steps "
            "never reach the global model\n") in err
    assert "warnings.warn" not in err and "UserWarning" not in err and ".py:" not in err
    assert warnings.showwarning is shown  # a library user's warnings are left alone


_SIGNALLED = """
import os, signal, sys
import exogym.cli as cli
import exogym.cli.run as run_command

real = run_command.make_sink
def make_sink(spec):  # the first sink is made before the data loads: set-up, not training
    os.kill(os.getpid(), signal.SIGTERM)
    return real(spec)
run_command.make_sink = make_sink
sys.exit(cli.main(sys.argv[1:]))
"""


def test_sigterm_while_a_run_sets_up_stops_it_with_a_message(tmp_path: Path,
                                                             data_dir: Path) -> None:
    """A SIGTERM that arrives before the training loop (here: from the process itself while it
    makes its sinks, so no timing is assumed) ends the run with a message and status 130, as
    Ctrl-C does, never a silent death by the signal (-15 / 143)."""
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", _SIGNALLED, "run", "--data-dir", str(data_dir),
         "--no-download", "--no-progress", "--steps", "2", "--nodes", "2", "--batch-size", "8",
         "--csv", "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert done.returncode != -signal.SIGTERM
    assert done.stderr == ("exogym: SIGTERM: stopped (no training step was running, nothing to "
                           "checkpoint)\n"), done.stderr
    assert not (out / "metrics.jsonl").exists()


def test_main_restores_the_signal_handlers() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    assert main(["networks"]) == 0
    assert {sig: signal.getsignal(sig) for sig in before} == before


# -- a signal in the seconds torch takes to import ----------------------------------------------
_HEAVY = ("torch", "numpy")


def test_importing_the_cli_or_the_package_imports_no_torch() -> None:
    """``exogym.cli`` (what the console script and ``python -m exogym`` import before ``main``
    runs) and ``exogym`` import neither torch nor numpy; the package's public names come on first
    use, and are the very objects of their modules."""
    code = (
        "import sys\n"
        "import exogym, exogym.cli\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({_HEAVY!r})))\n"
        "print(sorted(set(exogym.__all__) - set(dir(exogym))))\n"
        "from exogym import Trainer, FitResult, register\n"
        "import exogym.run.trainer, exogym.run.output.result, exogym.strategy\n"
        "import exogym.trainer\n"
        "print('torch' in sys.modules, Trainer is exogym.run.trainer.Trainer,\n"
        "      FitResult is exogym.run.output.result.FitResult,\n"
        "      register is exogym.strategy.register,\n"
        "      exogym.trainer is exogym.run.trainer)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "[]", "True True True True True"]


_WAITS_FOR_A_SIGNAL = '''
import time

from torch import nn

from exogym.tasks import Task
from exogym.tasks.models import Classifier


def _wait(data_dir, download):  # never returns: the run can only end by the test's signal
    while True:
        time.sleep(1)


def make_task():
    return Task(id="waits", description="waits for a signal", load_data=_wait,
                build_model=lambda: Classifier(nn.Linear(2, 2)))
'''


def _imported(line: str) -> str:
    """The module of a ``-X importtime`` line (``import time: 12 | 34 |   torch.version``); ``""``
    for another line (the table's header, the command's own output)."""
    fields = line.removeprefix("import time:").split("|")
    return fields[2].strip() if len(fields) == 3 and fields[0].strip().isdigit() else ""


def test_sigterm_while_torch_imports_stops_with_a_message(tmp_path: Path) -> None:
    """``python -m exogym run`` handles SIGTERM before it imports torch: the test sends it as
    soon as the child reports (``-X importtime``) that the first torch module has been imported,
    i.e. while torch is still importing. Whenever the signal lands from then on (torch's import,
    parsing, set-up: the task's data never loads, so the run cannot end on its own), the process
    ends with one message and status 130, never silently by the signal (-15 / 143)."""
    (tmp_path / "waits_task.py").write_text(_WAITS_FOR_A_SIGNAL)
    child = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "exogym", "run", "--no-progress",
         "--task", f"{tmp_path}/waits_task.py:make_task", "--strategy", "ddp", "--nodes", "2",
         "--steps", "2", "--out", str(tmp_path / "run")],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stderr is not None
        seen: list[str] = []
        while not (seen and seen[-1].split(".")[0] == "torch"):
            line = child.stderr.readline()
            assert line, f"the child ended before importing torch: {''.join(seen)}"
            if _imported(line):
                seen.append(_imported(line))
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert "exogym.cli" in seen and "exogym.utils.signals" in seen  # before any torch module
    assert child.returncode == 130, (child.returncode, err[-2000:])
    messages = [line for line in err.splitlines() if not line.startswith("import time:")]
    assert messages == ["exogym: SIGTERM: stopped (no training step was running, nothing to "
                        "checkpoint)"], err[-2000:]
    assert out == ""
    assert not (tmp_path / "run").exists()


def test_run_help_is_in_sections(capsys: pytest.CaptureFixture[str]) -> None:
    from exogym.cli.run import SECTIONS

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    shown = capsys.readouterr().out
    titles = [line[:-1] for line in shown.splitlines() if line and line[0] != " "
              and line.endswith(":")]
    assert titles == ["options", *(title for title, _ in SECTIONS)]
    nodes = shown.split("\nnodes and population:\n")[1].split("\n\n")[0]
    assert "--concurrency" in nodes and "--round-policy" in nodes and "--world" not in nodes
