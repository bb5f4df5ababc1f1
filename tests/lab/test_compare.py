"""``exogym compare`` on the real MNIST (tiny budgets): the table equals the runs' summaries, the
spread of repeats is hand-computed, plots and raw run folders exist, and bad input is an error.

The runs evaluate on the first 500 MNIST test images (a task registered for these tests) so that
evaluation does not dominate the runtime; training uses the full training set.
"""

from __future__ import annotations

import json
import math
import statistics
import struct
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset

from exogym.cli import main
from exogym.lab.compare import (
    PLOT_FILES,
    Comparison,
    Stat,
    compare,
    default_eval_interval,
    resolve_strategies,
)
from exogym.lab.plots import MISSING_MATPLOTLIB
from exogym.lab.report import format_table
from exogym.sim.network import parse_duration
from exogym.sim.threads import intra_op_threads
from exogym.tasks.registry import TASKS, Task, get_task
from exogym.utils.config import ConfigError

TINY = "mnist-tiny-test-v0"
P = 4 * 215_370  # fp32 bytes of the MNIST CNN


@pytest.fixture(scope="module")
def tiny_task(mnist_data: Path) -> Iterator[str]:
    """The MNIST task evaluated on its first 500 test images, registered as ``TINY``."""
    mnist = get_task("mnist")
    train, test = mnist.load_data(mnist_data, False)
    small = TensorDataset(test.images[:500], test.targets[:500])
    task = Task(id=TINY, description="MNIST, 500 test images", build_model=mnist.build_model,
                load_data=lambda _dir, _download: (train, small), batch_size=16, lr=1e-3,
                eval_interval=10)
    # tiny model on a shared machine: threads cost more than they give
    with intra_op_threads(1), pytest.MonkeyPatch.context() as mp:
        mp.setitem(TASKS, TINY, task)
        yield TINY


@pytest.fixture(scope="module")
def repeated(tiny_task: str, tmp_path_factory: pytest.TempPathFactory) -> Comparison:
    """2 strategies x 2 seeds, 20 steps on 2 nodes, evaluated every 10 steps."""
    out = tmp_path_factory.mktemp("cmp") / "results"
    return compare(tiny_task, ["ddp", "diloco"], num_nodes=2, max_steps=20, repeats=2, seed=3,
                   eval_interval=10, network="home-100mbps", out_dir=out,
                   overrides={"diloco.H": 10})


def _summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def _table(md: str) -> dict[str, dict[str, str]]:
    lines = [ln for ln in md.splitlines() if ln.startswith("|")]
    head = [h.strip() for h in lines[0].strip("|").split("|")]
    rows = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        rows[cells[0].strip("`")] = dict(zip(head, cells, strict=True))
    return rows


_BYTES = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def _number(text: str) -> float:
    """``"0.1234"``, ``"71.20%"``, ``"17.23 MB"``, ``"3.06 s"``, ``"1,234"`` -> a float."""
    text = text.strip()
    if text.endswith("%"):
        return float(text[:-1]) / 100
    value, _, unit = text.partition(" ")
    if unit in _BYTES:
        return float(value) * _BYTES[unit]
    if unit:
        return parse_duration(text)
    return float(value.replace(",", ""))


def _cell(text: str) -> tuple[float, float | None]:
    mean, _, std = text.partition(" ± ")
    return _number(mean), (_number(std) if std else None)


def test_table_and_json_equal_the_runs_summaries(repeated: Comparison) -> None:
    rows = _table(repeated.results_md.read_text())
    data = json.loads(repeated.results_json.read_text())
    assert list(rows) == ["ddp", "diloco"]
    assert data["seeds"] == [3, 4] and data["target_source"] == "default"
    # column -> (summary value of one run, absolute tolerance of the printed value)
    columns = {
        "eval loss": (lambda s: s["final"]["eval_loss"], lambda v: 5e-5),
        "eval accuracy": (lambda s: s["final"]["eval_accuracy"], lambda v: 5e-5),
        "sent per node": (lambda s: max(s["bytes_sent_per_node"]), lambda v: 5e3),
        "sim time": (lambda s: s["sim_time_s"], lambda v: 5e-3 * abs(v)),
        "utilization": (lambda s: s["utilization"], lambda v: 5e-5),
        "samples/s": (lambda s: s["samples_per_s"], lambda v: 0.5),
        "wall time": (lambda s: s["wall_time_s"], lambda v: 5e-3 * abs(v)),
    }
    json_keys = {"eval loss": "eval_loss", "eval accuracy": "eval_accuracy",
                 "sent per node": "bytes_sent_per_node", "sim time": "sim_time_s",
                 "utilization": "utilization", "samples/s": "samples_per_s",
                 "wall time": "wall_time_s"}
    for row in data["rows"]:
        label = row["label"]
        summaries = [_summary(repeated.out_dir / "runs" / f"{label}-seed{s}") for s in (3, 4)]
        assert [s["seed"] for s in summaries] == [3, 4]
        for column, (value_of, tol) in columns.items():
            a, b = (value_of(s) for s in summaries)
            # hand-computed: the mean and the sample std of two values
            mean, std = (a + b) / 2, abs(a - b) / math.sqrt(2)
            stat = row["metrics"][json_keys[column]]
            assert stat["values"] == [a, b]
            assert stat["mean"] == pytest.approx(mean, rel=1e-12, abs=1e-12)
            assert stat["std"] == pytest.approx(std, rel=1e-9, abs=1e-12)
            assert (stat["min"], stat["max"]) == (min(a, b), max(a, b))
            shown_mean, shown_std = _cell(rows[label][column])
            assert shown_mean == pytest.approx(mean, abs=tol(mean) + 1e-12), (label, column)
            if a != b:
                assert shown_std is not None
                assert shown_std == pytest.approx(std, abs=tol(std) + 1e-12), (label, column)
            else:  # identical in both runs: one value
                assert shown_std is None


def test_bytes_are_the_hand_computed_all_reduces(repeated: Comparison) -> None:
    # N = 2: a ring all-reduce of P bytes sends 2 (N-1)/N P = P per node.
    expected = {"ddp": 20 * P, "diloco": 2 * P}
    for label, sent in expected.items():
        assert repeated.row(label).metrics["bytes_sent_per_node"].values == (sent, sent)
    assert repeated.row("diloco").hyperparameters["H"] == 10
    assert repeated.row("diloco").changed == {"H": 10}  # task lr 1e-3 = the default


def test_steps_to_target_is_the_first_eval_at_or_below_the_worst_final(
        repeated: Comparison) -> None:
    data = json.loads(repeated.results_json.read_text())
    lasts, firsts = [], {}
    for row in data["rows"]:
        for s in (3, 4):
            run = repeated.out_dir / "runs" / f"{row['label']}-seed{s}"
            firsts[row["label"], s] = [json.loads(ln) for ln in
                                       (run / "metrics.jsonl").read_text().splitlines()]
            evals = [r for r in firsts[row["label"], s] if "eval_loss" in r]
            assert evals[-1]["eval_loss"] < evals[0]["eval_loss"]  # every run improved
            lasts.append(evals[-1]["eval_loss"])
    target = max(lasts)
    assert data["target_loss"] == target == repeated.target_loss
    rows = _table(repeated.results_md.read_text())
    for row in data["rows"]:
        hits = []
        for run in row["runs"]:
            evals = [r for r in firsts[row["label"], run["seed"]] if "eval_loss" in r]
            assert [r["step"] for r in evals] == [0, 10, 20]  # the initial model first
            hit = next(r for r in evals if r["eval_loss"] <= target)  # every run reaches it
            assert run["steps_to_target"] == hit["step"]
            assert run["sim_time_to_target_s"] == hit["sim_time_s"]
            hits.append(hit["step"])
        assert row["reached"] == 2
        assert row["steps_to_target"]["values"] == hits
        cell = rows[row["label"]][f"steps to loss ≤ {target:.4f}"]
        assert _cell(cell)[0] == statistics.fmean(hits)
    assert "resolution 10 steps" in repeated.results_md.read_text()


def test_plots_are_pngs_and_run_folders_hold_the_raw_metrics(repeated: Comparison) -> None:
    assert [p.name for p in repeated.plots] == list(PLOT_FILES)
    for path in repeated.plots:
        head = path.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
        width, height = struct.unpack(">II", head[16:24])
        assert width > 100 and height > 100
    md = repeated.results_md.read_text()
    assert all(f"]({name})" in md for name in PLOT_FILES)
    assert sorted(p.name for p in (repeated.out_dir / "runs").iterdir()) == [
        f"{label}-seed{s}" for label in ("ddp", "diloco") for s in (3, 4)]
    for label in ("ddp", "diloco"):
        for s in (3, 4):
            run = repeated.out_dir / "runs" / f"{label}-seed{s}"
            config = json.loads((run / "config.json").read_text())
            assert config["seed"] == s and config["num_nodes"] == 2 and config["steps"] == 20
            assert config["network"] == "home-100mbps"
            assert config["hyperparameters"]["optim.lr"] == 1e-3  # the task's lr
            rows = (run / "metrics.jsonl").read_text().splitlines()
            assert json.loads(rows[-1])["eval_loss"] == _summary(run)["final"]["eval_loss"]


def test_a_compared_run_is_the_plain_run_with_that_seed(repeated: Comparison) -> None:
    from exogym import Trainer
    from exogym.strategy import DiLoCo

    task = get_task(TINY)
    train, test = task.load_data(None, False)
    torch.manual_seed(4)
    result = Trainer(task.build_model(), train, test).fit(
        strategy=DiLoCo(H=10), num_nodes=2, max_steps=20, batch_size=16, eval_interval=10,
        seed=4, progress=False, network=None)
    run = _summary(repeated.out_dir / "runs" / "diloco-seed4")
    assert run["final"] == result.final  # bit-identical: same initial weights, data and lr
    assert repeated.row("diloco").runs[1].final == result.final


def test_cli_without_matplotlib_writes_table_and_says_why(
        tiny_task: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], mnist_data: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "cli"
    assert main([
        "compare", "--task", tiny_task, "--strategies", "diloco,diloco-h2", "--nodes", "2",
        "--steps", "10", "--eval-interval", "5", "--set", "diloco.H=5", "--set",
        "diloco-h2.H=2", "--set", "optim.lr=2e-3", "--micro-batch-size", "8",
        "--target-loss", "1e9", "--network", "cloud-10g", "--out", str(out),
        "--data-dir", str(mnist_data), "--no-download", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert f"plots not drawn: {MISSING_MATPLOTLIB}" in printed
    assert not list(out.glob("*.png"))
    md = (out / "results.md").read_text()
    assert 'pip install "matplotlib>=3.7"' in md and "1000000000.0000 (given)" in md
    data = json.loads((out / "results.json").read_text())
    assert data["plots"] == [] and data["target_loss"] == 1e9 and data["network"] == "cloud-10g"
    assert (data["micro_batch_size"], data["partition"], data["precision"]) == (8, "iid", "fp32")
    assert "batch 16 per node (micro-batches of 8), partition iid, precision fp32" in md
    config = json.loads((out / "runs" / "diloco-h2-seed0" / "config.json").read_text())
    assert (config["micro_batch_size"], config["task"]) == (8, tiny_task)
    for row in data["rows"]:  # a target above every loss: the initial model (step 0) reaches it
        assert [r["steps_to_target"] for r in row["runs"]] == [0]
        assert row["hyperparameters"]["optim.lr"] == 2e-3
    # the same strategy twice: 2 and 5 outer steps, each an all-reduce of P bytes per node
    assert [r["metrics"]["bytes_sent_per_node"]["values"] for r in data["rows"]] == [[2 * P],
                                                                                     [5 * P]]
    assert [r["hyperparameters"]["H"] for r in data["rows"]] == [5, 2]
    assert list(_table(md)) == ["diloco", "diloco-h2"]


def test_settings_reach_the_right_strategies() -> None:
    built = resolve_strategies(
        ["ddp", "diloco", "diloco-fast"],
        [("optim.lr", "2e-3"), ("diloco-fast.H", "5"), ("diloco-fast.lr", "1e-2"),
         ("max_grad_norm", "1")], lr=5e-4)
    assert [b.id for b in built.values()] == ["ddp", "diloco", "diloco"]
    assert built["ddp"].optim.lr == built["diloco"].optim.lr == 2e-3  # bare beats the task's
    assert built["diloco-fast"].optim.lr == 1e-2  # the label's own beats the bare one
    assert (built["diloco"].H, built["diloco-fast"].H) == (100, 5)
    assert all(b.max_grad_norm == 1.0 for b in built.values())
    assert resolve_strategies(["fedavg"], lr=5e-4)["fedavg"].optim.lr == 5e-4  # the task's


@pytest.mark.parametrize(
    ("labels", "settings", "message"),
    [
        (["ddp", "dilocoo"], [], "unknown strategy 'dilocoo' in label 'dilocoo' (did you mean "
                                 "'diloco'?)"),
        (["ddp", "diloco"], [("diloco.Hh", "5")], "diloco: setting diloco.Hh=5: unknown key 'Hh' "
                                                  "(did you mean 'H'?)"),
        (["diloco"], [("diloco.H", "0")], "H must be an integer >= 1"),
        (["ddp", "diloco"], [("H", "5")], "setting H=5 applies to every strategy, but ddp (ddp) "
                                          "has no key 'H'"),
        (["ddp", "diloco"], [("fedavg.H", "5")], "names strategy 'fedavg', which is not compared"),
        (["diloco", "diloco"], [], "strategy 'diloco' is listed twice; give the others names, "
                                   "e.g. diloco-2"),
        (["diloco.x"], [], "bad strategy label 'diloco.x'"),
        ([], [], "non-empty list"),
        (["ddp"], [("lr", "1e-3"), ("optim.lr", "2e-3")], "both set optim.lr; give it once"),
    ],
)
def test_bad_strategies_and_settings_are_errors(
        labels: list[str], settings: list[tuple[str, str]], message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        compare("mnist", labels, num_nodes=2, max_steps=1, overrides=settings,
                out_dir=tmp_path / "x")
    assert message in str(err.value)
    assert not (tmp_path / "x").exists()  # checked before any data or folder


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"repeats": 0}, "repeats must be an integer >= 1, got 0"),
        ({"num_nodes": 0}, "num_nodes must be an integer >= 1, got 0"),
        ({"target_loss": math.nan}, "target_loss must be a finite number or None, got nan"),
        ({"eval_interval": 0}, "eval_interval must be an integer >= 1, got 0"),
        ({"network": "home-1mbps"}, "home-1mbps"),
        ({"partition": "dirichet:0.1"}, "partition 'dirichet:0.1' is not valid"),
        ({"micro_batch_size": 0}, "micro_batch_size must be an integer >= 1, got 0"),
        ({"precision": "fp16"}, "precision must be one of fp32, bf16, got 'fp16'"),
    ],
)
def test_bad_arguments_are_errors(kwargs: dict[str, Any], message: str, tmp_path: Path) -> None:
    args: dict[str, Any] = {"num_nodes": 2, "max_steps": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        compare("mnist", ["ddp"], out_dir=tmp_path / "x", **args)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--repeats", "0"), "--repeats: expected an integer >= 1, got 0"),
        (("--seed", "-1"), "--seed: expected an integer >= 0, got -1"),
        (("--target-loss", "inf"), "--target-loss: expected a finite number, got 'inf'"),
        (("--strategies", "ddp,,diloco"), "expected a comma-separated list of strategies"),
        (("--partition", "dirichlet:0"), "dirichlet alpha must be a finite float > 0"),
        (("--micro-batch-size", "0"), "--micro-batch-size: expected an integer >= 1, got 0"),
        (("--precision", "fp16"), "--precision: invalid choice: 'fp16'"),
        (("--set", "diloco.H"), "--set: expected KEY=VALUE, got 'diloco.H'"),
    ],
)
def test_cli_rejects_bad_options(args: tuple[str, ...], message: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["compare", *args])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_existing_folder_is_never_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "done"
    out.mkdir()
    (out / "results.md").write_text("earlier results\n")
    with pytest.raises(FileExistsError, match=f"output folder '{out}' already exists and is not "
                                              "empty"):
        compare("mnist", ["ddp"], num_nodes=2, max_steps=1, out_dir=out)
    assert [p.name for p in out.iterdir()] == ["results.md"]
    assert (out / "results.md").read_text() == "earlier results\n"


def test_default_eval_interval() -> None:
    assert default_eval_interval(100, 500) == 50  # about 10 evaluations
    assert default_eval_interval(100, 5000) == 100  # never coarser than the task's
    assert default_eval_interval(100, 10) == 1


def test_partition_reaches_every_run_and_the_results(tiny_task: str, tmp_path: Path) -> None:
    out = tmp_path / "niid"
    c = compare(tiny_task, ["fedavg"], num_nodes=2, max_steps=4, eval_interval=2,
                partition="Dirichlet:0.5", step_time="10ms", out_dir=out,
                overrides={"H": 2})
    config = json.loads((out / "runs" / "fedavg-seed0" / "config.json").read_text())
    assert config["partition"] == "dirichlet:0.5"  # the canonical spec, as Trainer.fit writes it
    assert (config["micro_batch_size"], config["precision"]) == (None, "fp32")
    sizes = config["partition_stats"]["sizes"]
    assert sum(sizes) == 60_000 and sizes[0] != sizes[1]  # every image once, unequal shards
    data = json.loads(c.results_json.read_text())
    assert (data["partition"], data["micro_batch_size"], data["precision"]) == (
        "dirichlet:0.5", None, "fp32")
    assert c.partition == "dirichlet:0.5"
    assert "batch 16 per node, partition dirichlet:0.5, precision fp32, network" in (
        c.results_md.read_text())


def test_a_diverged_run_gives_nan_cells_not_a_crash(repeated: Comparison) -> None:
    assert Stat((1.0, 3.0)).std == math.sqrt(2)  # mean 2, (1 + 1) / (2 - 1) = 2
    diverged = Stat((math.nan, 0.5))
    assert math.isnan(diverged.mean) and math.isnan(diverged.std)  # type: ignore[arg-type]
    assert math.isnan(diverged.min) and math.isnan(diverged.max)
    assert Stat((0.5, math.nan)).to_dict()["min"] != 0.5  # not min()'s order-dependent answer
    row = repeated.row("ddp")
    bad = replace(row, metrics={**row.metrics, "eval_loss": diverged})
    cells = _table("\n".join(format_table(replace(repeated, rows=(bad,)))))["ddp"]
    assert cells["eval loss"] == "nan ± nan"
    assert cells["eval accuracy"] == _table(repeated.results_md.read_text())["ddp"][
        "eval accuracy"]


def test_the_bytes_and_time_plots_keep_the_points_before_the_first_sync(
        repeated: Comparison, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.axes

    from exogym.lab.plots import plot_comparison

    drawn: list[tuple[str, list[float]]] = []
    scales: list[str] = []
    plot, set_xscale = matplotlib.axes.Axes.plot, matplotlib.axes.Axes.set_xscale

    def record_plot(self, xs, *args, **kwargs):  # type: ignore[no-untyped-def]
        drawn.append((kwargs.get("label", ""), [float(x) for x in xs]))
        return plot(self, xs, *args, **kwargs)

    def record_scale(self, value, **kwargs):  # type: ignore[no-untyped-def]
        scales.append(value)
        return set_xscale(self, value, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", record_plot)
    monkeypatch.setattr(matplotlib.axes.Axes, "set_xscale", record_scale)
    plot_comparison(repeated, tmp_path)
    assert scales == ["symlog", "symlog"]  # bytes and simulated time; steps stay linear
    by_plot = [drawn[i:i + 2] for i in range(0, 6, 2)]  # 3 plots x (ddp, diloco)
    steps, sent, _time = by_plot
    assert [x for _, x in steps] == [[0.0, 10.0, 20.0]] * 2
    for label, xs in sent:  # DiLoCo has sent nothing until its first sync at step 10
        assert xs[0] == 0.0 and len(xs) == 3, label


def test_a_setting_for_an_unknown_label_names_it_and_the_labels(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``dilocco.H=10`` names a label that is not compared (a typo of ``diloco``): an error that
    says so, not "every strategy lacks the key 'dilocco.H'"."""
    with pytest.raises(ConfigError) as err:
        resolve_strategies(["ddp", "diloco"], [("dilocco.H", "10")])
    assert str(err.value) == (
        "setting dilocco.H=10 names label 'dilocco', which is not compared (did you mean "
        "'diloco'?); labels: ddp, diloco (a setting for every strategy has no label: H=10)")
    with pytest.raises(ConfigError, match=r"names strategy 'diloco-h1', which is not compared "
                                          r"\(did you mean 'diloco-h10'\?\); labels: diloco, "
                                          r"diloco-h10"):
        resolve_strategies(["diloco", "diloco-h10"], [("diloco-h1.H", "10")])
    assert resolve_strategies(["diloco"], [("optim.lr", "2e-3")])["diloco"].optim.lr == 2e-3
    assert main(["compare", "--strategies", "ddp,diloco", "--set", "dilocco.H=10", "--steps", "1",
                 "--out", str(tmp_path / "x")]) == 2
    assert "names label 'dilocco', which is not compared (did you mean 'diloco'?)" in (
        capsys.readouterr().err)
    assert not (tmp_path / "x").exists()


def test_overrides_given_as_a_generator_reach_every_run(tiny_task: str, tmp_path: Path) -> None:
    # the check of every setting before training used a generator up: the runs then trained
    # with the defaults (H = 100 here, so 4 steps would be refused without allow_unsynced)
    out = tmp_path / "gen"
    compare(tiny_task, ["fedavg"], num_nodes=2, max_steps=4, eval_interval=2, step_time="10ms",
            out_dir=out, overrides=(item for item in [("H", 2)]))
    config = json.loads((out / "runs" / "fedavg-seed0" / "config.json").read_text())
    assert config["hyperparameters"]["H"] == 2
