"""Metrics sinks: CSV content with changing columns and after a crash, TensorBoard scalars read
back from the event file, a W&B run in offline mode read back from its ``.wandb`` file, the
errors of ``make_sink``, and the ImportError naming the extra when a dependency is missing."""

from __future__ import annotations

import csv
import json
import math
import struct
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from exogym.run.output.sinks import (
    CSVSink,
    MultiSink,
    Sink,
    TensorBoardSink,
    WandbSink,
    make_sink,
    numeric_metrics,
)

CONFIG: dict[str, Any] = {"strategy": "diloco", "num_nodes": 2, "seed": 0, "network": None,
                          "hyperparameters": {"H": 5, "optim.lr": 0.001, "optim.betas": (0.9, 0.99),
                                              "codec": None}}
ROWS: list[dict[str, Any]] = [
    {"step": 10, "epoch": 0, "train_loss": 2.25, "lr": 0.1, "wall_s": 0.5},
    {"step": 20, "epoch": 0, "train_loss": 1.125, "lr": 0.05, "wall_s": 1.0,
     "eval_loss": 0.75, "eval_accuracy": 0.625},
    {"step": 30, "epoch": 1, "train_loss": float("nan"), "lr": 0.025, "wall_s": 1.5,
     "sim_time_s": 3.0, "note": "text", "missing": None},
]
SUMMARY: dict[str, Any] = {"strategy": "diloco", "samples_per_s": 400.0, "steps": 30,
                           "final": {"eval_loss": 0.75, "eval_accuracy": 0.625},
                           "bytes_sent_per_node": [1.0, 2.0], "clock": {"report": {"x": 1}}}

# the skip reasons of the tests that need an optional extra (as tests/project/test_hf_rows.py's)
TENSORBOARD = 'the tensorboard extra: pip install -e ".[tensorboard]"'
WANDB = 'the wandb extra: pip install -e ".[wandb]"'


def _csv(path: Path) -> list[list[str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


# -- numeric_metrics ------------------------------------------------------------------------------
def test_numeric_metrics_keeps_numbers_only():
    row = {"step": 5, "a": 1, "b": 0.5, "c": None, "d": "x", "e": True, "f": [1], "g": math.inf}
    assert numeric_metrics(row) == {"a": 1, "b": 0.5, "g": math.inf}


# -- CSV ------------------------------------------------------------------------------------------
def test_csv_widens_header_and_keeps_exact_values(tmp_path):
    sink = CSVSink()
    sink.start(CONFIG, tmp_path)
    path = tmp_path / "metrics.csv"
    sink.log(ROWS[0])
    assert _csv(path) == [["step", "epoch", "train_loss", "lr", "wall_s"],
                          ["10", "0", "2.25", "0.1", "0.5"]]
    sink.log(ROWS[1])  # two new columns: the file is rewritten with the wider header
    header = ["step", "epoch", "train_loss", "lr", "wall_s", "eval_loss", "eval_accuracy"]
    assert _csv(path) == [header, ["10", "0", "2.25", "0.1", "0.5", "", ""],
                          ["20", "0", "1.125", "0.05", "1.0", "0.75", "0.625"]]
    sink.log(ROWS[2])
    sink.finish(SUMMARY)
    header += ["sim_time_s", "note", "missing"]
    assert _csv(path) == [
        header,
        ["10", "0", "2.25", "0.1", "0.5", "", "", "", "", ""],
        ["20", "0", "1.125", "0.05", "1.0", "0.75", "0.625", "", "", ""],
        ["30", "1", "nan", "0.025", "1.5", "", "", "3.0", "text", ""],
    ]
    assert not (tmp_path / ".metrics.csv.tmp").exists()
    # Every logged number reads back as exactly the value logged.
    with path.open(newline="", encoding="utf-8") as f:
        back = list(csv.DictReader(f))
    for row, got in zip(ROWS, back, strict=True):
        for k, v in numeric_metrics(row).items():
            assert float(got[k]) == v or (math.isnan(v) and math.isnan(float(got[k])))
    third = 1 / 3  # a float with no short decimal form survives too
    sink2 = CSVSink(tmp_path / "b.csv")
    sink2.start(CONFIG, None)
    sink2.log({"step": 1, "x": third, "per_node": [1, 2]})
    sink2.finish(None)
    assert _csv(tmp_path / "b.csv")[1] == ["1", repr(third), "[1, 2]"]
    assert float(_csv(tmp_path / "b.csv")[1][1]) == third


def test_csv_crash_keeps_rows_and_refuses_existing_file(tmp_path):
    sink = CSVSink()
    sink.start(CONFIG, tmp_path)
    sink.log(ROWS[0])
    sink.log(ROWS[1])
    # Readable while the run goes on (flushed per row), and after a failed run.
    assert len(_csv(tmp_path / "metrics.csv")) == 3
    sink.finish(None)
    assert [r[0] for r in _csv(tmp_path / "metrics.csv")] == ["step", "10", "20"]
    with pytest.raises(RuntimeError, match="start"):
        sink.log(ROWS[2])
    with pytest.raises(FileExistsError, match=r"metrics\.csv"):
        CSVSink().start(CONFIG, tmp_path)
    with pytest.raises(ValueError, match="out_dir"):
        CSVSink().start(CONFIG, None)
    with pytest.raises(ValueError, match="path must be"):
        CSVSink(3)  # type: ignore[arg-type]


# -- MultiSink ------------------------------------------------------------------------------------
class _Recorder:
    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail = fail

    def start(self, config: dict[str, Any], run_dir: Path | None) -> None:
        self.calls.append(("start", run_dir))
        if self.fail == "start":
            raise OSError("start failed")

    def log(self, row: dict[str, Any]) -> None:
        self.calls.append(("log", row["step"]))

    def finish(self, summary: dict[str, Any] | None) -> None:
        self.calls.append(("finish", summary))
        if self.fail == "finish":
            raise OSError("finish failed")


def test_multisink_fans_out_and_finishes_everyone(tmp_path):
    a, b = _Recorder(), _Recorder(fail="finish")
    c = _Recorder()
    multi = MultiSink([a, b, c])
    assert isinstance(multi, Sink)
    multi.start(CONFIG, tmp_path)
    multi.log(ROWS[0])
    with pytest.raises(OSError, match="finish failed"):
        multi.finish(None)
    expected = [("start", tmp_path), ("log", 10), ("finish", None)]
    assert a.calls == expected and b.calls == expected and c.calls == expected
    # A failed start finishes, as failed, the sinks already started; later ones never start.
    a, b, c = _Recorder(), _Recorder(fail="start"), _Recorder()
    with pytest.raises(OSError, match="start failed"):
        MultiSink([a, b, c]).start(CONFIG, None)
    assert a.calls == [("start", None), ("finish", None)]
    assert b.calls == [("start", None)] and c.calls == []
    with pytest.raises(TypeError, match=r"sinks\[1\]"):
        MultiSink([a, "csv"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="list or tuple of sinks"):
        MultiSink(CSVSink())  # type: ignore[arg-type]


# -- make_sink ------------------------------------------------------------------------------------
def test_make_sink_forms_and_errors():
    assert isinstance(make_sink("csv"), CSVSink)
    for bad, msg in [("json", "unknown sink 'json': use one of csv, tensorboard, wandb:PROJECT"),
                     ("wandb", "bad W&B sink"), ("wandb:", "bad W&B sink"),
                     ("wandb:/p", "bad W&B sink"), ("wandb:a/b/c", "bad W&B sink"),
                     ("wandb:p:", "bad W&B mode ''"), ("wandb:p:cloud", "bad W&B mode 'cloud'"),
                     ("tensorboard:x", "unknown sink")]:
        with pytest.raises(ValueError, match=msg):
            make_sink(bad)
    with pytest.raises(ValueError, match=r"mode must be one of .* got 'cloud'"):
        WandbSink("p", mode="cloud")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="project must be"):
        WandbSink("")
    with pytest.raises(ValueError, match="entity must be"):
        WandbSink("p", entity="")
    pytest.importorskip("tensorboard", reason=TENSORBOARD)
    assert isinstance(make_sink("tensorboard"), TensorBoardSink)
    pytest.importorskip("wandb", reason=WANDB)
    w = make_sink("wandb:proj")
    assert isinstance(w, WandbSink) and (w.project, w.entity, w.mode) == ("proj", None, None)
    w = make_sink("wandb:team/proj:offline")
    assert isinstance(w, WandbSink)
    assert (w.project, w.entity, w.mode) == ("proj", "team", "offline")


# -- missing optional dependencies ----------------------------------------------------------------
def test_missing_dependency_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ImportError, match=r'pip install "exogym\[tensorboard\]"'):
        TensorBoardSink()
    with pytest.raises(ImportError, match=r'pip install "exogym\[tensorboard\]"'):
        make_sink("tensorboard")
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r'pip install "exogym\[wandb\]"'):
        WandbSink("p")
    with pytest.raises(ImportError, match=r'pip install "exogym\[wandb\]"'):
        make_sink("wandb:p:offline")


# -- TensorBoard ----------------------------------------------------------------------------------
def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]  # TensorBoard stores scalars as float32


def test_tensorboard_scalars_text_and_hparams(tmp_path):
    pytest.importorskip("tensorboard", reason=TENSORBOARD)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    sink = TensorBoardSink()
    sink.start(CONFIG, tmp_path)
    for row in ROWS:
        sink.log(row)
    sink.finish(SUMMARY)
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    got = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    expected: dict[str, list[tuple[int, float]]] = {}
    for row in ROWS:
        for k, v in numeric_metrics(row).items():
            expected.setdefault(k, []).append((row["step"], _f32(v)))
    nan = got.pop("train_loss")
    assert [s for s, _ in nan] == [10, 20, 30] and math.isnan(nan[2][1])
    assert nan[:2] == [(10, 2.25), (20, 1.125)]
    expected.pop("train_loss")
    assert got == expected  # note, missing (a string, a None) are not scalars
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert json.loads(text) == json.loads(json.dumps(CONFIG))
    hp = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(hp["_hparams_/session_start_info"])
    values = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
              for k, v in start.session_start_info.hparams.items()}
    assert values == {"strategy": "diloco", "num_nodes": 2.0, "seed": 0.0,
                      "hyperparameters.H": 5.0, "hyperparameters.optim.lr": 0.001,
                      "hyperparameters.optim.betas": "[0.9, 0.99]"}
    exp = plugin_data_pb2.HParamsPluginData.FromString(hp["_hparams_/experiment"]).experiment
    assert [m.name.tag for m in exp.metric_infos] == ["eval_loss", "eval_accuracy"]


def test_tensorboard_crash_keeps_scalars_without_hparams(tmp_path):
    pytest.importorskip("tensorboard", reason=TENSORBOARD)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path / "tb")
    sink.start(CONFIG, None)
    sink.log(ROWS[0])
    with pytest.raises(ValueError, match="integer 'step'"):
        sink.log({"train_loss": 1.0})
    sink.finish(None)
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train_loss")] == [(10, 2.25)]
    with pytest.raises(KeyError, match="hparams"):  # no hparams for a failed run
        acc.PluginTagToContent("hparams")
    with pytest.raises(ValueError, match="out_dir"):
        TensorBoardSink().start(CONFIG, None)


# -- Weights & Biases, offline ---------------------------------------------------------------------
def _wandb_records(path: Path) -> list[Any]:
    """The protobuf records of a ``.wandb`` file: a 7-byte header (``:W&B``, magic, version),
    then the LevelDB log format: 32 KiB blocks of chunks ``crc32 (4) | length (2) | type (1) |
    data``, type 1 a whole record, 2/3/4 its first/middle/last part; a block's tail shorter
    than a chunk header is zero padding."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, part, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # padding up to the next block
            pos += left
            continue
        part += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            out.append(wandb_internal_pb2.Record.FromString(part))
            part = b""
    return out


def _key(item: Any) -> str:
    return item.key or ".".join(item.nested_key)


def _wandb_run(tmp_path: Path, summary: dict[str, Any] | None) -> dict[str, Any]:
    sink = WandbSink("exogym-test", mode="offline")
    sink.start(CONFIG, tmp_path)
    for row in ROWS:
        sink.log(row)
    sink.finish(summary)
    (file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    # W&B's service process may still be writing the file when finish() returns: wait for the
    # run's exit record (what finish() sends last).
    deadline = time.monotonic() + 30.0
    records = _wandb_records(file)
    while not any(r.WhichOneof("record_type") == "exit" for r in records):
        assert time.monotonic() < deadline, "the offline .wandb file never got its exit record"
        time.sleep(0.2)
        records = _wandb_records(file)
    history, summaries, config, exit_code, name = [], {}, {}, None, None
    for rec in records:
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            history.append({_key(i): json.loads(i.value_json) for i in rec.history.item
                            if not _key(i).startswith("_") or _key(i) == "_step"})
        elif kind == "summary":
            summaries.update({_key(i): json.loads(i.value_json) for i in rec.summary.update})
        elif kind == "run":  # the run, then updates: keep the last non-empty name and config
            name = rec.run.display_name or name
            config = {i.key: json.loads(i.value_json) for i in rec.run.config.update
                      if i.key != "_wandb"} or config
        elif kind == "exit":
            exit_code = rec.exit.exit_code
    return {"history": history, "summary": summaries, "config": config, "exit": exit_code,
            "name": name}


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path):
    pytest.importorskip("wandb", reason=WANDB)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))  # nothing lands in the working folder
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "data"))
    return tmp_path


def test_wandb_offline_logs_rows_summary_and_crash(wandb_offline):
    run_dir = wandb_offline / "mnist-ddp-n2"
    run_dir.mkdir()
    got = _wandb_run(run_dir, SUMMARY)
    assert got["name"] == "mnist-ddp-n2"
    assert got["config"] == json.loads(json.dumps(CONFIG))
    losses = [h.pop("train_loss") for h in got["history"]]
    assert losses[:2] == [2.25, 1.125] and math.isnan(losses[2])
    assert got["history"] == [
        {"_step": 10, "epoch": 0, "lr": 0.1, "wall_s": 0.5},
        {"_step": 20, "epoch": 0, "lr": 0.05, "wall_s": 1.0, "eval_loss": 0.75,
         "eval_accuracy": 0.625},
        {"_step": 30, "epoch": 1, "lr": 0.025, "wall_s": 1.5, "sim_time_s": 3.0},
    ]
    summary = got["summary"]
    assert (summary["samples_per_s"], summary["steps"], summary["strategy"]) == (400.0, 30,
                                                                                 "diloco")
    assert (summary["eval_loss"], summary["eval_accuracy"]) == (0.75, 0.625)
    assert "bytes_sent_per_node" not in summary and "clock" not in summary
    assert got["exit"] == 0

    crashed = wandb_offline / "crashed"
    crashed.mkdir()
    got = _wandb_run(crashed, None)
    assert got["exit"] == 1
    assert [h["_step"] for h in got["history"]] == [10, 20, 30]
    assert "samples_per_s" not in got["summary"]


# -- the trainer's own rows -----------------------------------------------------------------------
@pytest.mark.usefixtures("single_thread")
def test_trainer_rows_through_csv_and_tensorboard(tmp_path):
    """A real run folder replayed through the sinks (as ``fit(sinks=...)`` feeds them): the CSV
    holds exactly the rows of ``metrics.jsonl``, TensorBoard every numeric value."""
    pytest.importorskip("tensorboard", reason=TENSORBOARD)
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.data import TensorDataset

    from exogym import Classifier, Trainer

    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 4, generator=gen), torch.randint(0, 3, (64,),
                                                                          generator=gen))
    torch.manual_seed(0)
    run = tmp_path / "run"
    Trainer(Classifier(torch.nn.Linear(4, 3)), data, data).fit(
        strategy="ddp", num_nodes=2, max_steps=6, batch_size=4, log_interval=2, eval_interval=4,
        device="cpu", progress=False, out_dir=run, step_time=0.01)
    config = json.loads((run / "config.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4, 6] and "eval_loss" not in rows[0]
    sinks = MultiSink([CSVSink(), TensorBoardSink()])
    sinks.start(config, run)
    for row in rows:
        sinks.log(row)
    sinks.finish(json.loads((run / "summary.json").read_text()))
    with (run / "metrics.csv").open(newline="", encoding="utf-8") as f:
        back = list(csv.DictReader(f))
    assert list(back[0]) == list(rows[0]) + [k for k in rows[1] if k not in rows[0]]
    for row, got in zip(rows, back, strict=True):
        assert {k: float(v) for k, v in got.items() if v != ""} == row
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("eval_loss")] == [
        (4, _f32(rows[1]["eval_loss"])), (6, _f32(rows[2]["eval_loss"]))]
    assert set(acc.Tags()["scalars"]) == set(numeric_metrics(rows[2]))


# -- the skips of the tests above without their extra ---------------------------------------------
@pytest.mark.parametrize(("module", "test"), [
    pytest.param("tensorboard", lambda tmp: test_make_sink_forms_and_errors(), id="make_sink"),
    pytest.param("wandb", lambda tmp: test_make_sink_forms_and_errors(), id="make_sink-wandb"),
    ("tensorboard", test_tensorboard_scalars_text_and_hparams),
    ("tensorboard", test_tensorboard_crash_keeps_scalars_without_hparams),
    ("tensorboard", test_trainer_rows_through_csv_and_tensorboard),
])  # (the W&B fixture's skip, wandb_offline, gives the same reason, WANDB)
def test_a_test_that_needs_an_extra_skips_naming_it(
        module: str, test: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as if the extra were not installed
    with pytest.raises(pytest.skip.Exception) as skipped:
        test(tmp_path)
    assert skipped.value.msg == f'the {module} extra: pip install -e ".[{module}]"'


# -- the progress of a run whose stderr is no terminal --------------------------------------------
def test_without_a_terminal_a_run_s_progress_is_a_few_whole_lines(
        capsys: pytest.CaptureFixture[str]) -> None:
    """500 steps, a row each (tqdm's bar redraws at every row, after a carriage return): a line
    when it starts and one when it ends, within 30 s."""
    from exogym.run.output.record import Recorder

    record = Recorder(None, CONFIG, MultiSink(()), lead=True, progress=True, total_steps=500)
    record.open(0, resumed=False)
    for step in range(1, 501):
        record.advanced()
        record.advanced({"step": step, "train_loss": 1.0 / step, "lr": 0.1})
    record.close(None)
    err = capsys.readouterr().err  # pytest's capture: not a terminal
    assert "\r" not in err
    start, end = err.splitlines()
    assert start == "training: 500 steps (a line every 30 s)"
    assert end.startswith("step 500/500 (100%), ") and end.endswith(", train_loss 0.002")
    assert len(err) < 200


def test_progress_lines_every_interval_with_the_time_left(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A run resumed at step 100 of 500, 2 steps a second: a line every 30 s (60 steps), the
    time left by the pace so far: after 60 s, 120 steps done and 280 left, 140 s (2.33 min);
    the last line 10 s later: 120 steps in 70 s, 1.71 step/s."""
    from exogym.run.output import progress

    now = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    lines = progress.LogLines(500, initial=100)
    for _ in range(120):
        now[0] += 0.5
        lines.update()
        lines.set_postfix({"train_loss": "0.5"})
    now[0] += 10
    lines.close()
    lines.close()  # once
    assert capsys.readouterr().err.splitlines() == [
        "training: 400 steps from step 100 (a line every 30 s)",
        "step 160/500 (32%), 2 step/s, 30 s spent, about 2.83 min left, train_loss 0.5",
        "step 220/500 (44%), 2 step/s, 1 min spent, about 2.33 min left, train_loss 0.5",
        "step 220/500 (44%), 1.71 step/s, 1.17 min in all, train_loss 0.5"]
