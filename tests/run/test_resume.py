"""Stopping and resuming: a run continued from a checkpoint, in a fresh process, is bit-identical
to one that never stopped (every metrics row, the bytes, the clock, the final model and every
node's state); checkpoints are atomic, verified, pruned; a bad one is named and skipped; resuming
another run is an error listing the differences; Ctrl-C ends a run cleanly."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from support.resume_cases import (
    T,
    assert_same_state,
    build,
    cases,
    fit_case,
    run_rows,
    run_summary,
)
from support.scripts import child_env

from exogym.run.loop import drive as drive_module
from exogym.run.loop.drive import RunInterrupted
from exogym.run.output import checkpoint as checkpoint_module
from exogym.run.output.checkpoint import (
    Checkpointer,
    CheckpointError,
    checkpoint_steps,
    load_checkpoint,
)
from exogym.strategy import make


def _crash_after_first_checkpoint(src: Path, dst: Path) -> None:
    """``dst``: ``src`` as a run killed after its checkpoint at step T would have left it (its
    later rows still in metrics.jsonl, no summary, no later checkpoint)."""
    shutil.copytree(src, dst)
    shutil.rmtree(dst / "checkpoints" / f"step-{2 * T:08d}")
    (dst / "summary.json").unlink()


@pytest.mark.parametrize("engine", ["loop", "vmap"])
def test_every_strategy_resumes_bit_for_bit_in_a_fresh_process(
        engine: str, tmp_path: Path, single_thread: None) -> None:
    names = list(cases())
    resumed = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short runs: "not a multiple of H"
        for name in names:
            fit_case(name, engine, tmp_path / "full" / name)
            _crash_after_first_checkpoint(tmp_path / "full" / name, tmp_path / "cut" / name)
            resumed[name] = tmp_path / "cut" / name
    subprocess.run([sys.executable, "-m", "support.resume_cases",
                    *(f"{n}={d}" for n, d in resumed.items())], check=True,
                   env=child_env(PYTHONWARNINGS="ignore"), timeout=600)
    for name in names:
        full, cut = tmp_path / "full" / name, tmp_path / "cut" / name
        assert run_rows(cut) == run_rows(full), name  # every row, none duplicated or missing
        assert run_summary(cut) == run_summary(full), name  # bytes, collectives, clock, final eval
        a = torch.load(full / "model.pt", weights_only=True)
        b = torch.load(cut / "model.pt", weights_only=True)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
        # every node's parameters, buffers, optimizer and strategy state at the end
        end_a, _ = load_checkpoint(full)
        end_b, _ = load_checkpoint(cut)
        assert_same_state(end_a, end_b, name)


def test_the_special_cases_really_are_special(tmp_path: Path) -> None:
    """The cases above exercise what they claim (a codec's residuals, dropped rows, BatchNorm
    buffers, dropout randomness, unequal Dirichlet shards): each changes the numbers."""
    plain = fit_case("diloco", "loop", tmp_path / "plain")
    for name in ("diloco-topk-ef", "diloco-q", "diloco-batchnorm", "diloco-dropout",
                 "diloco-cosine"):
        other = fit_case(name, "loop", tmp_path / name)
        assert other.final != plain.final, name
    state, _ = load_checkpoint(tmp_path / "diloco-topk-ef")
    assert state["strategy"]["transport_codec"]["residuals"]  # error feedback was saved
    fit_case("fedavg-dirichlet", "loop", tmp_path / "dirichlet")
    state, _ = load_checkpoint(tmp_path / "dirichlet")
    assert len(set(state["data"]["node_pos"])) > 1 or len(set(state["data"]["passes"])) > 1


def test_a_resumed_run_may_be_extended_and_a_finished_run_continued(tmp_path: Path) -> None:
    run = tmp_path / "run"
    fit_case("diloco", "loop", run)  # finished at 2T with a final checkpoint
    longer = build(cases()["diloco"]).fit(resume=run, max_steps=3 * T, progress=False)
    assert longer.steps == 3 * T and longer.history[-1]["step"] == 3 * T
    assert checkpoint_steps(run)[0] == 3 * T
    with pytest.raises(ValueError, match=r"max_steps=3 is before the checkpoint's step 12"):
        build(cases()["diloco"]).fit(resume=run, max_steps=3, progress=False)


def test_an_extended_run_warns_about_h_and_its_summary_says_where_it_resumed(
        tmp_path: Path) -> None:
    # DiLoCo H = 2: 2T = 8 steps, extended to 3T + 1 = 13 (not a multiple of H)
    run = tmp_path / "run"
    first = fit_case("diloco", "loop", run)
    with pytest.warns(UserWarning, match=r"13 steps is not a multiple of H=2: the last 1 "):
        longer = build(cases()["diloco"]).fit(resume=run, max_steps=3 * T + 1, progress=False)
    assert longer.resumed_from == {"step": 2 * T, "checkpoint": str(
        run / "checkpoints" / f"step-{2 * T:08d}")}
    assert f"resumed     at step {2 * T} from {run}" in longer.summary()
    assert first.resumed_from is None and "resumed" not in first.summary()
    # wall time adds up the sessions: never less than the training time in it
    assert longer.wall_time_s >= longer.train_time_s >= first.train_time_s
    walls = [r["wall_s"] for r in longer.history]
    assert walls == sorted(walls)


def test_resuming_another_run_is_an_error_listing_the_differences(tmp_path: Path) -> None:
    run = tmp_path / "run"
    fit_case("diloco", "loop", run)
    with pytest.raises(ValueError, match=r"this is not the run of .*: hyperparameters.H: "
                                         r"checkpoint 2, now 3; num_nodes: checkpoint 3, now 6; "
                                         r"seed: checkpoint 5, now 1$"):
        build(cases()["diloco"]).fit(resume=run, strategy=make("diloco", H=3), num_nodes=6,
                                     seed=1, progress=False)
    with pytest.raises(ValueError, match=r"takes max_steps .* not num_epochs"):
        build(cases()["diloco"]).fit(resume=run, num_epochs=2, progress=False)
    with pytest.raises(ValueError, match="continues that folder; out_dir="):
        build(cases()["diloco"]).fit(resume=run, out_dir=tmp_path / "other", progress=False)


def test_a_corrupted_checkpoint_is_named_and_the_previous_one_used(tmp_path: Path) -> None:
    run = tmp_path / "run"
    fit_case("diloco", "loop", run)
    newest = run / "checkpoints" / f"step-{2 * T:08d}" / "rank-0.pt"
    data_ = bytearray(newest.read_bytes())
    data_[len(data_) // 2] ^= 0xFF
    newest.write_bytes(bytes(data_))
    with pytest.warns(RuntimeWarning, match=rf"checkpoint of step {2 * T} skipped: .*"
                                            r"rank-0.pt is corrupted or truncated"):
        state, where = load_checkpoint(run)
    assert state["step"] == T and where.name == f"step-{T:08d}"
    previous = run / "checkpoints" / f"step-{T:08d}" / "rank-0.pt"
    previous.write_bytes(previous.read_bytes()[:100])  # truncated
    with pytest.warns(RuntimeWarning), pytest.raises(CheckpointError) as err:
        load_checkpoint(run)
    text = str(err.value)
    assert f"step-{2 * T:08d}/rank-0.pt is corrupted" in text
    assert f"step-{T:08d}/rank-0.pt is corrupted or truncated" in text
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        load_checkpoint(tmp_path / "nothing")


def test_a_crash_while_writing_leaves_the_previous_checkpoint_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"step": 1, "x": torch.arange(10)}
    for asynchronous in (False, True):
        run = tmp_path / f"async-{asynchronous}"
        ck = Checkpointer(run, keep=2, asynchronous=asynchronous)
        ck.save(state, 1)
        ck.wait()

        def broken(path: Path, obj: Any) -> str:
            path.write_bytes(b"half a checkpoint")
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(checkpoint_module, "_write_file", broken)
        with pytest.raises(CheckpointError, match=r"writing the checkpoint of step 2 under .* "
                                                  r"failed \(OSError: \[Errno 28\] No space "
                                                  r"left on device\); the previous checkpoints "
                                                  "are intact"):
            ck.save({**state, "step": 2}, 2)  # synchronous: at once; asynchronous: in wait()
            ck.wait()
        monkeypatch.undo()
        assert checkpoint_steps(run) == [1]  # the half-written one is not a checkpoint
        loaded, _ = load_checkpoint(run)
        assert torch.equal(loaded["x"], state["x"])


def test_async_and_sync_checkpoints_hold_the_same_state_and_old_ones_are_pruned(
        tmp_path: Path) -> None:
    for asynchronous in (True, False):
        build(cases()["diloco"]).fit(
            strategy=make("diloco", H=2), num_nodes=3, max_steps=10, batch_size=8,
            checkpoint_every=2, keep_checkpoints=2, async_checkpoint=asynchronous,
            out_dir=tmp_path / str(asynchronous), progress=False, network=None)
        assert checkpoint_steps(tmp_path / str(asynchronous)) == [10, 8]
    a, _ = load_checkpoint(tmp_path / "True")
    b, _ = load_checkpoint(tmp_path / "False")
    assert_same_state(a, b, ignore=frozenset({"checkpointing"}))


def test_checkpoint_interval_in_wall_time(tmp_path: Path) -> None:
    build(cases()["ddp"]).fit(strategy="ddp", num_nodes=2, max_steps=6, batch_size=8,
                              checkpoint_interval="1us", out_dir=tmp_path / "run",
                              keep_checkpoints=10, progress=False, network=None)
    assert checkpoint_steps(tmp_path / "run") == [6, 5, 4, 3, 2, 1]
    with pytest.raises(ValueError, match="checkpoint_interval must be > 0 seconds"):
        build(cases()["ddp"]).fit(strategy="ddp", max_steps=2, checkpoint_interval=0)


class _Interrupt:
    """A sink that sends this process SIGINT when a given step is logged (a user's Ctrl-C)."""

    def __init__(self, at: int, times: int = 1) -> None:
        self.at, self.times = at, times

    def start(self, config: dict[str, Any], run_dir: Path | None) -> None: ...

    def log(self, row: dict[str, Any]) -> None:
        if row["step"] == self.at:
            for _ in range(self.times):
                os.kill(os.getpid(), signal.SIGINT)

    def finish(self, summary: dict[str, Any] | None) -> None: ...


def test_ctrl_c_checkpoints_and_says_how_to_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    trainer = build(cases()["diloco"])
    with pytest.raises(RunInterrupted, match=rf"interrupted after step 3 of 8; checkpoint "
                                             rf"written to {run}/checkpoints/step-00000003; "
                                             rf"continue with: exogym run --resume {run}"):
        trainer.fit(strategy=make("diloco", H=2), num_nodes=3, max_steps=8, batch_size=8,
                    out_dir=run, progress=False, network=None, sinks=[_Interrupt(3)],
                    log_interval=1)
    assert checkpoint_steps(run) == [3] and not (run / "summary.json").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored
    done = build(cases()["diloco"]).fit(resume=run, progress=False)
    plain = build(cases()["diloco"]).fit(strategy=make("diloco", H=2), num_nodes=3, max_steps=8,
                                         batch_size=8, progress=False, network=None,
                                         log_interval=1)
    assert done.final == plain.final
    # a second Ctrl-C aborts at once: a plain KeyboardInterrupt, no checkpoint
    with pytest.raises(KeyboardInterrupt) as err:
        build(cases()["diloco"]).fit(strategy=make("diloco", H=2), num_nodes=3, max_steps=8,
                                     batch_size=8, out_dir=tmp_path / "twice", progress=False,
                                     network=None, sinks=[_Interrupt(3, times=2)],
                                     log_interval=1)
    assert not isinstance(err.value, RunInterrupted)
    assert checkpoint_steps(tmp_path / "twice") == []


def test_a_signal_before_the_loop_starts_stops_the_run_at_its_first_step(tmp_path: Path) -> None:
    """A worker process defers signals from its start: one that arrives while it loads (its
    peers already waiting in a collective) stops the run cleanly at the first step instead of
    killing the worker."""
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        drive_module.defer_stop_signals()
        os.kill(os.getpid(), signal.SIGTERM)  # handled: noted, no exception
        run = tmp_path / "run"
        with pytest.raises(RunInterrupted, match="interrupted after step 1 of 8"):
            build(cases()["diloco"]).fit(strategy=make("diloco", H=2), num_nodes=2, max_steps=8,
                                         batch_size=8, out_dir=run, progress=False,
                                         network=None, log_interval=1)
        assert checkpoint_steps(run) == [1]
        assert drive_module._early_signals == []
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def test_csv_and_tensorboard_continue_without_duplicates(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard",
                        reason='the tensorboard extra: pip install -e ".[tensorboard]"')
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from exogym.run.output.sinks import CSVSink, TensorBoardSink

    def fit(**kw: Any) -> None:
        build(cases()["ddp"]).fit(progress=False, sinks=[CSVSink(), TensorBoardSink()], **kw)

    full, cut = tmp_path / "full", tmp_path / "cut"
    args = dict(strategy="ddp", num_nodes=2, max_steps=8, batch_size=8, log_interval=1,
                network=None, checkpoint_every=4)
    fit(out_dir=full, **args)
    _crash_after_first_checkpoint(full, cut)
    fit(resume=cut)
    assert (full / "metrics.csv").read_text().count("\n") == (cut / "metrics.csv").read_text(
    ).count("\n") == 9  # a header and 8 rows, not 12
    acc = EventAccumulator(str(cut / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train_loss")] == list(range(1, 9))


# -- the command line, real processes and real signals ---------------------------------------
RUN = ["--task", "mnist", "--strategy", "diloco", "--nodes", "2", "--set", "H=4",
       "--batch-size", "16", "--no-progress", "--log-interval", "2", "--eval-interval", "8",
       "--eval-samples", "200", "--step-time", "10ms", "--checkpoint-every", "8"]


def _exogym(data: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "EXOGYM_DATA_DIR": str(data)}
    return subprocess.Popen([sys.executable, "-m", "exogym", "run", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_a_killed_cli_run_resumes_to_the_uninterrupted_summary(tmp_path: Path,
                                                               mnist_data: Path) -> None:
    full, killed = tmp_path / "full", tmp_path / "killed"
    done = _exogym(mnist_data, *RUN, "--steps", "24", "--out", str(full))
    assert done.wait(timeout=300) == 0, done.communicate()[1]
    proc = _exogym(mnist_data, *RUN, "--steps", "24", "--out", str(killed))
    _wait_for(killed / "checkpoints" / "step-00000016", proc)
    proc.send_signal(signal.SIGKILL)  # no chance to clean up: power loss
    proc.wait(timeout=60)
    assert not (killed / "summary.json").exists()
    resumed = _exogym(mnist_data, "--resume", str(killed), "--no-progress")
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert run_summary(killed) == run_summary(full)
    assert run_rows(killed) == run_rows(full)


def test_sigint_to_a_cli_run_prints_no_traceback_and_leaves_a_resumable_folder(
        tmp_path: Path, mnist_data: Path) -> None:
    run = tmp_path / "run"
    proc = _exogym(mnist_data, *RUN, "--steps", "4000", "--out", str(run))
    _wait_for(run / "metrics.jsonl", proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert "Traceback" not in err and "exogym: SIGINT: stopping after this step" in err
    assert f"continue with: exogym run --resume {run}" in err
    (step,) = checkpoint_steps(run)
    more = _exogym(mnist_data, "--resume", str(run), "--steps", str(step + 4), "--no-progress")
    assert more.wait(timeout=300) == 0, more.communicate()[1]
    assert json.loads((run / "summary.json").read_text())["steps"] == step + 4
    bad = _exogym(mnist_data, "--resume", str(run), "--nodes", "3")
    _, err = bad.communicate(timeout=120)
    assert bad.returncode == 2 and "drop --nodes" in err


def test_a_process_run_stops_on_sigterm_and_resumes_as_processes(tmp_path: Path,
                                                                  mnist_data: Path) -> None:
    run, full = tmp_path / "run", tmp_path / "full"
    args = [*(a for a in RUN if a != "H=4" and a != "--set"), "--engine", "process", "--strategy",
            "ddp", "--steps", "24"]
    done = _exogym(mnist_data, *args, "--out", str(full))
    assert done.wait(timeout=300) == 0, done.communicate()[1]
    proc = _exogym(mnist_data, *args, "--out", str(run))
    _wait_for(run / "metrics.jsonl", proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "asking the 2 worker process(es) to stop after their next logged step" in err
    (step,) = checkpoint_steps(run)
    assert sorted(p.name for p in (run / "checkpoints" / f"step-{step:08d}").iterdir()) == [
        "manifest.json", "rank-0.pt", "rank-1.pt"]
    resumed = _exogym(mnist_data, "--resume", str(run), "--no-progress")
    assert resumed.wait(timeout=300) == 0, resumed.communicate()[1]
    a, b = run_summary(run), run_summary(full)
    assert a["bytes_sent_per_node"] == b["bytes_sent_per_node"] and a["steps"] == b["steps"]
    # gloo sums across processes in its own order: the losses agree to round-off, not bits
    assert a["final"]["eval_loss"] == pytest.approx(b["final"]["eval_loss"], rel=1e-4)
