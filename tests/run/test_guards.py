"""What a run refuses, and when: divergence, output folders, settings that do not fit N or the
machine, runs shorter than H, bad paths, bad numbers on the command line. Each check happens
before any work where it can, and says what is wrong and what is allowed."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from support.runs import sign_data
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from exogym import Classifier, Trainer
from exogym.cli import main
from exogym.lab.compare import compare
from exogym.run.output.result import NonFiniteLossError
from exogym.sim import engine as engine_module
from exogym.sim.sharding import FixedSubset, iterate_batches
from exogym.strategy import DDP, DiLoCo, FedAvg
from exogym.strategy.optim import OptimSpec


def _model() -> nn.Module:
    torch.manual_seed(0)
    return Classifier(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2)))


def _fit(strategy: object, data: object = None, **kw: object):  # type: ignore[no-untyped-def]
    data = sign_data(128) if data is None else data
    args = dict(num_nodes=2, max_steps=6, batch_size=8, progress=False, network=None)
    args.update(kw)
    return Trainer(_model(), data, sign_data(128)).fit(strategy=strategy, **args)


# -- divergence ------------------------------------------------------------------------------------
def test_a_nan_loss_on_one_node_stops_the_run_naming_step_node_and_strategy(
        tmp_path: Path) -> None:
    clean = sign_data(128)
    poisoned = TensorDataset(torch.full((128, 6), float("nan")), clean.tensors[1])

    def factory(rank: int, num_nodes: int, train: bool) -> Dataset:
        return poisoned if rank == 1 else clean  # node 1's data is NaN from its first batch

    out = tmp_path / "run"
    with pytest.raises(NonFiniteLossError, match=r"non-finite training loss at step 1 on "
                                                 r"node\(s\) 1 of 2 \(strategy diloco\)"):
        _fit(DiLoCo(H=3), factory, max_steps=6, log_interval=2, eval_interval=100, out_dir=out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2]  # the row where it was seen is written, then stop
    assert rows[0]["train_loss"] == "nan"
    assert not (out / "summary.json").exists()

    # allowed: it trains on, and the result says where it first happened
    with pytest.warns(RuntimeWarning, match="non-finite training loss at step 1"):
        result = _fit(DiLoCo(H=3), factory, max_steps=6, log_interval=2, allow_nonfinite=True,
                      eval_interval=100, out_dir=tmp_path / "on")
    assert result.steps == 6 and result.nonfinite == {"step": 1, "nodes": [1]}
    summary = json.loads((tmp_path / "on" / "summary.json").read_text())
    assert summary["nonfinite"] == {"step": 1, "nodes": [1]}


def test_a_diverging_learning_rate_is_caught_at_the_next_logged_step() -> None:
    with pytest.raises(NonFiniteLossError, match=r"at step \d+ on node\(s\) 0, 1 of 2 "
                                                 r"\(strategy ddp\)"):
        _fit(DDP(optim=OptimSpec(name="sgd", lr=1e30)), max_steps=20, log_interval=5)


class _NaNWhenEvaluated(nn.Module):
    """Trains normally; its evaluation (eval mode) returns NaN: a global model gone bad."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 2)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        loss = nn.functional.cross_entropy(self.lin(batch[0]), batch[1])
        return loss if self.training else loss * math.nan


def test_a_nan_eval_loss_stops_the_run() -> None:
    with pytest.raises(NonFiniteLossError, match="global model's eval loss is nan after step 3"):
        Trainer(_NaNWhenEvaluated(), sign_data(128), sign_data(128)).fit(
            strategy=DDP(), num_nodes=2, max_steps=6, batch_size=8, eval_interval=3,
            progress=False, network=None)


def test_cli_refuses_infinite_numbers_and_reports_divergence(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], mnist_data: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--lr", "inf", "--steps", "30"])
    assert exit_.value.code == 2
    assert "--lr: expected a finite number > 0, got 'inf'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "--lr", "nan"])
    assert main(["run", "--steps", "5", "--set", "outer_lr=inf"]) == 2
    assert "outer_lr must be a finite number > 0, got inf" in capsys.readouterr().err
    out = tmp_path / "diverged"
    rc = main(["run", "--strategy", "ddp", "--nodes", "2", "--steps", "20", "--lr", "1e30",
               "--set", "optim.name=sgd", "--batch-size", "16", "--log-interval", "5",
               "--data-dir", str(mnist_data), "--no-download", "--no-progress",
               "--out", str(out)])
    assert rc == 1  # it ran and failed: not a usage error
    err = capsys.readouterr().err
    assert "non-finite training loss at step" in err and "(strategy ddp)" in err
    assert (out / "metrics.jsonl").read_text()  # the rows so far are kept


# -- output folders and paths -------------------------------------------------------------------
def test_an_existing_folder_with_the_users_files_is_never_written(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    mine = {"config.json": "{}\n", "summary.json": '{"mine": 1}\n', "model.pt": "weights"}
    for name, text in mine.items():
        (out / name).write_text(text)
    with pytest.raises(FileExistsError, match="already exists and is not empty"):
        _fit(DDP(), out_dir=out)
    assert {p.name: p.read_text() for p in out.iterdir()} == mine
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _fit(DDP(), out_dir=empty).out_dir == empty  # an empty folder is fine
    with pytest.raises(ValueError, match="the output folder is empty"):
        _fit(DDP(), out_dir="")


def test_cli_checks_paths_before_the_data_loads(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    nowhere = tmp_path / "no-data"  # a data error would come from here if --out were not first
    base = ["run", "--data-dir", str(nowhere), "--no-download", "--steps", "100", "--no-progress"]
    assert main([*base, "--out", str(afile / "run")]) == 2
    err = capsys.readouterr().err
    assert err == (f"exogym: error: cannot create output folder '{afile / 'run'}': "
                   f"'{afile}' is a file, not a folder\n")
    with pytest.raises(SystemExit):
        main([*base, "--out", ""])
    assert "--out: expected a path, got an empty string" in capsys.readouterr().err
    assert main(["estimate", "--plot", str(afile / "p.png")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "is a file, not a folder" in captured.err


@pytest.mark.skipif(not Path("/sys").is_dir() or os.access("/sys", os.W_OK) is False,
                    reason="needs a /sys that permission bits call writable (root)")
def test_a_folder_that_root_cannot_write_is_found_by_trying(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    try:  # only where creating something in /sys really fails
        os.rmdir(__import__("tempfile").mkdtemp(dir="/sys"))
        pytest.skip("/sys is writable here")
    except OSError:
        pass
    assert main(["run", "--out", "/sys/x", "--steps", "100", "--data-dir",
                 str(tmp_path / "none"), "--no-download"]) == 2
    assert "cannot write output folder '/sys/x': creating anything in '/sys' fails" in \
        capsys.readouterr().err


# -- settings against N and the machine ----------------------------------------------------------
def test_per_node_network_lists_are_checked_before_the_folder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"node_up/node_bw lists 3 values .* but the run has 2 "
                                         "nodes: give exactly one value per node"):
        _fit(DDP(), network="bw=1Gbps,node_bw=1Gbps:10Mbps:1Mbps", out_dir=out, step_time=0.1)
    assert not out.exists()


def test_cli_checks_network_lists_before_the_data(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--nodes", "2", "--network", "bw=1Gbps,node_bw=1Gbps:10Mbps:1Mbps",
                 "--steps", "100", "--data-dir", str(tmp_path / "none"), "--no-download",
                 "--out", str(tmp_path / "run")]) == 2
    assert "lists 3 values" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_too_many_nodes_for_the_memory_is_refused_up_front(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_module, "available_memory", lambda device: 10_000)
    model = _model()
    per_node = sum(p.numel() * 4 for p in model.parameters()) * (3 + 2)  # AdamW: 2 states
    assert engine_module.stack_bytes(model, 7, 2) == 7 * per_node
    with pytest.raises(MemoryError, match=rf"num_nodes=5000 would need about "
                                          rf"{5000 * per_node / 1e9:.1f} GB .* at most about "
                                          rf"{10_000 // per_node:,} nodes fit here"):
        _fit(DDP(), num_nodes=5000, out_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


# -- runs shorter than H ---------------------------------------------------------------------------
def test_a_run_shorter_than_H_is_an_error_unless_allowed() -> None:
    with pytest.raises(ValueError, match=r"diloco: the run has 6 steps but H=10: the nodes "
                                         r"would never \(fully\) synchronise"):
        _fit(DiLoCo(H=10))
    result = _fit(DiLoCo(H=10), allow_unsynced=True)
    assert result.bytes_sent == [0.0, 0.0]  # no synchronisation happened
    with pytest.warns(UserWarning, match="fedavg: 6 steps is not a multiple of H=4"):
        _fit(FedAvg(H=4))


def test_compare_refuses_short_runs_and_repeats_warnings_per_strategy(tmp_path: Path,
                                                                      mnist_data: Path) -> None:
    with pytest.raises(ValueError, match=r"diloco: 10 steps but H=100"):
        compare("mnist", ["ddp", "diloco"], num_nodes=2, max_steps=10, out_dir=tmp_path / "a")
    assert not (tmp_path / "a").exists()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = compare("mnist", ["diloco", "fedavg", "diloco-2"], num_nodes=2, max_steps=10,
                    batch_size=8, eval_interval=5, eval_samples=200, step_time=0.01,
                    overrides={"diloco.H": 4, "fedavg.H": 4, "diloco-2.H": 4},
                    out_dir=tmp_path / "b", data_dir=mnist_data, download=False)
    said = [str(w.message) for w in caught if "not a multiple" in str(w.message)]
    assert said == [f"{label} (seed 0): {sid}: 10 steps is not a multiple of H=4: the last 2 "
                    "local steps never reach the global model"
                    for label, sid in (("diloco", "diloco"), ("fedavg", "fedavg"),
                                       ("diloco-2", "diloco"))]
    md = c.results_md.read_text()
    assert "## Warnings" in md and "- `diloco-2`: diloco: 10 steps is not a multiple" in md


def test_a_strategy_that_never_improves_is_not_called_a_success(tmp_path: Path,
                                                                mnist_data: Path) -> None:
    c = compare("mnist", ["ddp", "diloco"], num_nodes=2, max_steps=10, batch_size=16,
                eval_interval=5, eval_samples=500, step_time=0.01, allow_unsynced=True,
                overrides={"diloco.H": 1000, "ddp.optim.lr": 3e-3},  # diloco never syncs
                out_dir=tmp_path / "c", data_dir=mnist_data, download=False)
    ddp, diloco = c.row("ddp"), c.row("diloco")
    assert ddp.runs[0].improved and not diloco.runs[0].improved
    # the default target is ddp's last evaluation: diloco's unchanged global model never gets
    # there, and its row says so instead of "reached at the first evaluation"
    assert c.target_loss == ddp.runs[0].curve[-1].eval_loss and c.target_source == "default"
    assert diloco.reached == 0 and diloco.runs[0].curve[0].step == 0
    row = next(line for line in c.results_md.read_text().splitlines()
               if line.startswith("| `diloco`"))
    assert "no improvement" in row


# -- small things on the command line ------------------------------------------------------------
def test_negative_durations_reach_their_own_check(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--step-time", "-1s"])
    assert "--step-time: a duration must be >= 0, got '-1s'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["compare", "--step-time", "0s"])
    assert "expected a duration > 0, e.g. 30ms, got '0s'" in capsys.readouterr().err


def test_strategies_shows_shared_settings_once_and_takes_ids(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["strategies"]) == 0
    full = capsys.readouterr().out
    assert full.count("optim.lr") == 1 and full.count("max_grad_norm") == 1
    assert main(["strategies", "diloco", "ddp"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("shared by every strategy")
    assert "diloco  (DiLoCo)" in text and "ddp  (DDP)" in text and "fedavg" not in text
    assert "outer_lr" in text and text.count("optim.lr") == 1
    assert main(["strategies", "dilocoo"]) == 2
    assert "unknown strategy 'dilocoo'" in capsys.readouterr().err


def test_estimate_says_that_zero_syncs_is_not_distributed_training(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--H", "5000"]) == 0
    out = capsys.readouterr().out
    assert "0 syncs (diloco H=5000): H is longer than the 500 steps per node" in out
    assert "2.00x yes" not in out and "2.00x n/a" in out
    assert "seed's" not in out


# -- evaluation subset -----------------------------------------------------------------------------
def test_the_evaluation_subset_is_fixed_and_fast() -> None:
    data = sign_data(300)
    a, b = FixedSubset(data, 50), FixedSubset(data, 50)
    assert torch.equal(a.indices, b.indices) and len(a) == 50
    assert torch.equal(a.indices, a.indices.sort().values)
    (x, _y), size = next(iterate_batches(a, 50))
    assert size == 50 and torch.equal(x, data.tensors[0][a.indices])
    assert a.test_set == "50-sample fixed subset (seed 0) of the evaluation set (300)"
    with pytest.raises(ValueError, match="1 <= k <= 300"):
        FixedSubset(data, 301)
    r = _fit(DDP(), max_steps=6, eval_interval=3, eval_samples=40)
    assert r.eval_during_training == ("40-sample fixed subset (seed 0) of the evaluation set "
                                      "(128)")
    assert r.eval_set == "128 samples"
    full = _fit(DDP(), max_steps=6, eval_interval=3, eval_samples=None)
    assert full.eval_during_training is None and full.final["eval_loss"] == r.final["eval_loss"]
    assert r.history[-1]["eval_loss"] != r.final["eval_loss"]  # subset vs whole set


# -- signals ---------------------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry.name))
    return kids


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to find the workers")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_to_the_parent_of_a_process_run_stops_every_worker_at_once(
        tmp_path: Path, sig: signal.Signals, mnist_data: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "EXOGYM_DATA_DIR": str(mnist_data)}
    parent = subprocess.Popen(
        [sys.executable, "-m", "exogym", "run", "--engine", "process", "--strategy", "ddp",
         "--nodes", "2", "--steps", "100000", "--batch-size", "8", "--no-progress",
         "--log-interval", "1", "--eval-interval", "100000", "--out", str(out)],
        env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ((out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").read_text()):
            assert parent.poll() is None, parent.stderr.read() if parent.stderr else ""
            assert time.monotonic() < deadline, "the run did not start"
            time.sleep(0.2)
        workers = [k for k in _children(parent.pid)  # not multiprocessing's resource tracker
                   if "spawn_main" in Path(f"/proc/{k}/cmdline").read_text(errors="replace")]
        assert len(workers) == 2
        parent.send_signal(sig)  # the first is forwarded: stop cleanly (tests/run/test_resume.py)
        time.sleep(0.05)
        parent.send_signal(sig)  # the second: now
        _, err = parent.communicate(timeout=60)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
    assert parent.returncode == 130
    assert "asking the 2 worker process(es) to stop after their next logged step" in err
    # the workers still running (one may have finished its clean stop within the 50 ms)
    assert re.search(r"stopping [12] worker process\(es\)", err), err
    assert "all 2 workers stopped" in err
    assert "Traceback" not in err
    assert not any(Path(f"/proc/{k}").exists() and "zombie" not in
                   Path(f"/proc/{k}/status").read_text().lower() for k in workers)
    assert not (out / "summary.json").exists()  # nobody finished the run behind our back
