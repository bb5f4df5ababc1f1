"""EXO Gym's API: its README's snippets (its custom algorithm on the per-node base's path
``exogym.strategy.strategy.Strategy``) and its MNIST example's way of building strategies run
unchanged; its built-in classes are exogym's strategies with the same numbers; its ``fit``
arguments map as documented (exogym.compat.exo_gym.fit_form); a per-node class gives the same
numbers in one process and as 2 processes."""

from __future__ import annotations

import csv
import json
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from exogym import Trainer
from exogym.compat.exo_gym.conversions import ExoGymWarning, schedule
from exogym.run.launch import fit_processes
from exogym.strategy.demo import DeMo, DeMoStrategy
from exogym.strategy.diloco import DiLoCo, DiLoCoStrategy
from exogym.strategy.fedavg import FedAvg
from exogym.strategy.federated_averaging import FedAvgStrategy
from exogym.strategy.optim import LRSchedule, OptimSpec
from exogym.strategy.per_node.runner import as_stacked
from exogym.strategy.sparta import SPARTA, SPARTAStrategy
from exogym.strategy.sparta_diloco import SPARTADiLoCo, SPARTADiLoCoStrategy
from exogym.strategy.strategy import SimpleReduceStrategy

pytestmark = pytest.mark.usefixtures("single_thread")


class ModelWrapper(nn.Module):
    """EXO Gym's convention: ``forward(batch)`` returns the scalar loss."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        imgs, labels = batch
        return F.cross_entropy(self.backbone(imgs), labels)


def mlp() -> ModelWrapper:
    torch.manual_seed(0)
    return ModelWrapper(nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.ReLU(),
                                      nn.Linear(12, 4)))


def data(n: int, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 4, 4, generator=g)
    return TensorDataset(x, (x.flatten(1)[:, :4].argmax(1)))


def params(model: nn.Module) -> list[Tensor]:
    return [t.detach().clone() for t in model.state_dict().values()]


def same(a: list[Tensor], b: list[Tensor], atol: float = 0.0) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.allclose(x, y, rtol=0, atol=atol)


# -- EXO Gym's README ------------------------------------------------------------------------
def test_readme_custom_training_runs_unchanged() -> None:
    # README "Custom Training", with device='cpu' for 'mps' and data of our own
    train_dataset, val_dataset = data(6400), data(256, 1)
    model = mlp()  # model.forward() expects a batch, and returns a scalar loss

    from exogym import Trainer
    from exogym.strategy.diloco import DiLoCoStrategy

    trainer = Trainer(model, train_dataset, val_dataset)

    # Strategy for optimization & communication
    strategy = DiLoCoStrategy(
        inner_optim='adam',
        H=100
    )

    out = trainer.fit(
        strategy=strategy,
        num_nodes=4,
        device='cpu'
    )
    # EXO Gym's fit returns the trained model; one epoch of 6400 / (4 x 16) = 100 steps
    assert isinstance(out, ModelWrapper) and out is not model
    r = trainer.result
    assert r is not None and (r.strategy, r.steps, r.batch_size) == ("diloco", 100, 16)
    assert r.hyperparameters["optim.name"] == "adam"  # EXO Gym ignored inner_optim; here it is
    assert out is r.model  # the returned model is the result's global model
    first, last = r.history[0], r.history[-1]
    assert first["step"] == 0 and last["eval_loss"] < first["eval_loss"]


def test_each_base_refuses_the_other_s_step_naming_the_one_meant() -> None:
    from exogym.strategy import StackedStrategy, Strategy

    with pytest.raises(TypeError, match=r"^Quantize defines a per-node step\(self\), but it "
                                        r"subclasses StackedStrategy, a node-stacked strategy .* "
                                        r"subclass exogym.strategy.Strategy \(the per-node base, "
                                        r"EXO Gym's\) instead$"):
        class Quantize(StackedStrategy):
            def step(self) -> None:  # type: ignore[override]
                pass

    with pytest.raises(TypeError, match=r"^Quantize defines step\(self, step\), a node-stacked "
                                        r"step .* subclasses exogym.strategy.Strategy, the "
                                        r"per-node base .* subclass "
                                        r"exogym.strategy.StackedStrategy instead$"):
        class Quantize(Strategy):  # type: ignore[no-redef]
            def step(self, step: int) -> None:  # type: ignore[override]
                pass


def test_readme_custom_algorithm_runs_unchanged() -> None:
    # README "Custom Algorithms", to the letter, with EXO Gym's imports (its
    # exogym/strategy/__init__.py exports its per-node base): tests/support/exo_gym_readme.py
    from support.exo_gym_readme import QuantizationStrategy

    from exogym.strategy import Strategy

    assert issubclass(QuantizationStrategy, Strategy)
    trainer = Trainer(mlp(), data(512), data(64, 1))
    out = trainer.fit(num_epochs=1, strategy=QuantizationStrategy(
        OptimSpec(torch.optim.AdamW, lr=1e-2), 'int8'), num_nodes=2, max_steps=5, val_size=32,
        val_interval=5, device="cpu", progress=False)
    r = trainer.result
    assert isinstance(out, ModelWrapper) and r.steps == 5
    # an int32 all-reduce per parameter tensor per step: 2 (N-1)/N x 4 bytes x 256 entries x 5
    assert r.bytes_sent == [pytest.approx(2 * 1 / 2 * 4 * (16 * 12 + 12 + 12 * 4 + 4) * 5)] * 2
    assert len(r.comm_log) == 4 * 5 and sum(c.payload_bytes for c in r.comm_log) == 4 * 256 * 5


def test_an_own_per_node_strategy_in_exo_gym_s_shape_runs_unchanged() -> None:
    from exogym.strategy import PerNodeStrategy
    from exogym.strategy.communicate import all_reduce

    class MyReduce(PerNodeStrategy):  # EXO Gym's strategies build their optimizer in _init_node
        def __init__(self, optim_spec):
            super().__init__()
            self.optim_spec = optim_spec

        def _init_node(self, model, rank, num_nodes):
            super()._init_node(model, rank, num_nodes)
            self.optim = self.optim_spec.build(model)

        def step(self):
            for param in self.model.parameters():
                all_reduce(param.grad)
                param.grad /= self.num_nodes
            self.optim.step()
            super().step()

    # keywords only, both num_epochs and max_steps (as EXO Gym's example calls fit): EXO Gym's
    # form, so the model comes back and EXO Gym's defaults (batch 16) apply
    trainer = Trainer(mlp(), data(512), data(64, 1))
    out = trainer.fit(num_epochs=1, max_steps=3, strategy=MyReduce(
        OptimSpec(torch.optim.AdamW, lr=1e-2)), num_nodes=2, device="cpu", progress=False)
    assert isinstance(out, ModelWrapper)
    assert (trainer.result.steps, trainer.result.batch_size) == (3, 16)


# -- EXO Gym's example/mnist.py: its strategies, its fit call, its CSV reader -------------------
def test_mnist_example_construction_fit_and_csv_logs(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    train_ds, val_ds = data(2048), data(128, 1)
    optim_spec = OptimSpec(torch.optim.AdamW, lr=3e-4, weight_decay=1e-4)
    expected = {"ddp": ("ddp", ["H=20", "p=0.05"]), "diloco": ("diloco", ["p=0.05"]),
                "sparta": ("sparta", ["H=20", "p=0.05 .*p_sparta"])}
    for name, Strat in [
        ("ddp", SimpleReduceStrategy),
        ("diloco", DiLoCoStrategy),
        ("sparta", SPARTAStrategy),
    ]:
        run_name = f"mnist_{name}_20260101_000000"
        model = mlp()
        trainer = Trainer(model, train_ds, val_ds)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            strategy = Strat(
                optim_spec=optim_spec,
                H=20,
                p=0.05,
                lr_scheduler="lambda_cosine",
                lr_scheduler_kwargs={"warmup_steps": 100, "cosine_anneal": True},
            )
        messages = [str(w.message) for w in caught if w.category is ExoGymWarning]
        assert len(messages) == len(expected[name][1])
        for message, pattern in zip(messages, expected[name][1], strict=True):
            assert re.search(pattern, message), message

        trainer.fit(
            max_steps=20,
            num_epochs=5,
            strategy=strategy,
            num_nodes=4,
            device="cpu",
            batch_size=16,
            val_size=len(val_ds),
            val_interval=10,
            wandb_project=None,
            run_name=run_name,
            progress=False,
        )
        assert trainer.result.strategy == expected[name][0]
        # the example's reader: logs/RUN_NAME/validation.csv, global_loss by step
        with open(Path("logs") / run_name / "validation.csv") as f:
            rows = list(csv.DictReader(f))
        assert [int(r["step"]) for r in rows] == [0, 10, 20]
        assert [float(r["global_loss"]) for r in rows] == pytest.approx(
            [h["eval_loss"] for h in trainer.result.history if "eval_loss" in h])
        assert all(r["local_loss"] == "" for r in rows)
        with open(Path("logs") / run_name / "train.csv") as f:
            train = list(csv.DictReader(f))
        assert list(train[0]) == ["step", "examples_trained", "train_loss", "train_perplexity",
                                  "lr"]
        assert [int(r["step"]) for r in train] == list(range(20))
        assert int(train[-1]["examples_trained"]) == 20 * 4 * 16
        config = json.loads((Path("logs") / run_name / "config.json").read_text())
        assert (config["seed"], config["eval_interval"], config["eval_samples"]) == (42, 10, 128)
    with pytest.raises(FileExistsError, match=r"logs/mnist_sparta_20260101_000000 already "
                                              r"holds a run's logs"):
        Trainer(mlp(), train_ds, val_ds).fit(strategy=SPARTAStrategy(), num_nodes=2,
                                             max_steps=2, run_name=run_name, progress=False)


def test_playground_arguments_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # example/playground.py's strategy and fit arguments (budgets cut: H 200 -> 2, 5000 -> 4
    # steps), with run_name to read the run's settings back
    monkeypatch.chdir(tmp_path)
    strategy = DiLoCoStrategy(
        optim_spec=OptimSpec(torch.optim.AdamW, lr=0.0004),
        lr_scheduler="lambda_cosine",
        lr_scheduler_kwargs={
            "warmup_steps": 1000,
            "cosine_anneal": True,
        },
        max_norm=1.0,
        H=2,
    )
    trainer = Trainer(mlp(), data(1024), data(512, 1))
    trainer.fit(
        num_epochs=1,
        max_steps=4,
        strategy=strategy,
        num_nodes=4,
        device="cpu",
        batch_size=16,
        minibatch_size=8,  # Gradient accumulation
        shuffle=False,
        val_size=256,
        val_interval=100,
        run_name="playground",
    )
    c = json.loads((Path("logs") / "playground" / "config.json").read_text())
    assert (c["steps"], c["micro_batch_size"], c["partition"], c["eval_samples"]) == (
        4, 8, "contiguous", 256)
    h = c["hyperparameters"]
    assert (h["H"], h["max_grad_norm"], h["optim.weight_decay"], h["schedule.warmup_steps"],
            h["schedule.min_lr_ratio"]) == (2, 1.0, 0.01, 1000, 0.1)


# -- the built-ins are exogym's strategies -----------------------------------------------------
def test_built_ins_convert_to_exogym_s_strategies() -> None:
    adam = OptimSpec("adam", lr=1e-2)
    cos = {"lr_scheduler": "lambda_cosine",
           "lr_scheduler_kwargs": {"warmup_steps": 4, "cosine_anneal": True}}
    sched = LRSchedule(warmup_steps=4, cosine=True, min_lr_ratio=0.1)
    outer = OptimSpec(torch.optim.SGD, lr=0.5, momentum=0.8, nesterov=True)
    assert DiLoCoStrategy(optim_spec=adam, outer_optim_spec=outer, H=7, max_norm=1.0,
                          **cos).to_stacked() == DiLoCo(
        H=7, optim=adam, schedule=sched, max_grad_norm=1.0, outer_optimizer="nesterov",
        outer_lr=0.5, outer_momentum=0.8)
    # EXO Gym's defaults: AdamW (lr 1e-3, weight decay 0.01), outer Nesterov SGD 0.7 / 0.9
    d = DiLoCoStrategy().to_stacked()
    assert (d.H, d.optim, d.outer_optimizer, d.outer_lr, d.outer_momentum) == (
        100, OptimSpec("adamw", lr=1e-3, weight_decay=0.01), "nesterov", 0.7, 0.9)
    assert DiLoCoStrategy(outer_optim_spec=OptimSpec(torch.optim.Adam, lr=0.1, eps=0.1)) \
        .to_stacked().outer_optimizer == "adam"
    assert SPARTAStrategy(optim_spec=adam, p_sparta=0.1).to_stacked() == SPARTA(
        p=0.1, policy="random", optim=adam)
    assert FedAvgStrategy(inner_optim=adam, H=3).to_stacked() == FedAvg(H=3, optim=adam)
    assert FedAvgStrategy(optim_spec=adam).to_stacked() == FedAvg(H=1, optim=adam)
    # DeMo: optim_spec's lr is eta (EXO Gym's DeMo kept torch SGD's 1e-3 whatever it was given)
    assert DeMoStrategy(compression_decay=0.9, compression_topk=4, compression_chunk=8,
                        weight_decay=0.1, optim_spec=OptimSpec(torch.optim.SGD, lr=0.05),
                        **cos).to_stacked() == DeMo(
        beta=0.9, k=4, s=8, optim=OptimSpec(lr=0.05, weight_decay=0.1), schedule=sched)
    assert DeMoStrategy().to_stacked().optim.lr == 1e-3
    # optim_spec's other settings are not DeMo's: said, not swallowed (AdamW's class form
    # brings torch's weight decay 0.01)
    with pytest.warns(ExoGymWarning, match=r"DeMoStrategy: optim_spec's weight_decay=0\.01, "
                                           r"betas=\(0\.5, 0\.9\) not used"):
        d = DeMoStrategy(optim_spec=OptimSpec(torch.optim.AdamW, lr=0.05, betas=(0.5, 0.9)))
    assert d.to_stacked().optim == OptimSpec(lr=0.05)
    assert SPARTADiLoCoStrategy(inner_optim_spec=adam, p_sparta=0.2, H=5).to_stacked() == \
        SPARTADiLoCo(H=5, p=0.2, policy="random", optim=adam)
    assert SimpleReduceStrategy(adam, max_norm=2.0).to_stacked().max_grad_norm == 2.0


def test_lambda_cosine_becomes_exogym_s_schedule() -> None:
    s = schedule("lambda_cosine", {"warmup_steps": 4, "cosine_anneal": True}, "X")
    # (t + 1) / W during warm-up (EXO Gym's t / W starts at lr 0), then a cosine to 0.1
    assert [s.factor(t, 12) for t in (0, 3, 4, 8, 12)] == pytest.approx(
        [0.25, 1.0, 1.0, 0.55, 0.1])
    assert schedule("lambda_cosine", {"warmup_steps": 3}, "X") == LRSchedule(warmup_steps=3)
    assert schedule(None, None, "X") == LRSchedule()


def test_diloco_strategy_trains_as_diloco() -> None:
    # the same numbers and bytes as exogym's DiLoCo run with the same settings
    spec = OptimSpec("adamw", lr=1e-2)
    t = Trainer(mlp(), data(512), data(64, 1))
    out = t.fit(strategy=DiLoCoStrategy(optim_spec=spec, H=3), num_nodes=4, max_steps=6,
                batch_size=8, seed=0, progress=False)
    ref = Trainer(mlp(), data(512), data(64, 1)).fit(
        strategy=DiLoCo(H=3, optim=spec), num_nodes=4, max_steps=6, batch_size=8,
        progress=False)
    same(params(out), params(ref.model))
    assert t.result.bytes_sent == ref.bytes_sent


def test_built_in_arguments_are_checked() -> None:
    # island_size: None or at least N (EXO Gym then averaged all the nodes, as FedAvg does)
    assert as_stacked(FedAvgStrategy(island_size=4, H=2), 4) == FedAvg(
        H=2, optim=OptimSpec("adamw", lr=1e-3, weight_decay=0.01))
    with pytest.raises(ValueError, match=r"island_size=2 with 4 nodes: exogym's FedAvg "
                                         r"averages all .* allowed: None or an island_size >= 4"):
        Trainer(mlp(), data(512)).fit(strategy=FedAvgStrategy(island_size=2), num_nodes=4,
                                      max_steps=2, progress=False)
    with pytest.raises(ValueError, match=r"island_size \(or None\) must be"):
        FedAvgStrategy(island_size=0)
    with pytest.raises(ValueError, match="as inner_optim or as optim_spec, got both"):
        FedAvgStrategy(inner_optim="adam", optim_spec="sgd")
    with pytest.raises(ValueError, match="H must be"):
        DiLoCoStrategy(H=0)
    with pytest.raises(ValueError, match=r"max_steps=50 \(a cosine shorter than the run\)"):
        DiLoCoStrategy(lr_scheduler="lambda_cosine", lr_scheduler_kwargs={"max_steps": 50})
    with pytest.raises(ValueError, match=r"lr_scheduler must be None or 'lambda_cosine'"):
        SPARTAStrategy(lr_scheduler=torch.optim.lr_scheduler.StepLR)
    with pytest.raises(ValueError, match=r"outer_optim_spec weight_decay=0.01"):
        DiLoCoStrategy(outer_optim_spec=OptimSpec(torch.optim.AdamW, lr=0.1))
    with pytest.warns(ExoGymWarning, match=r"sparta_interval=3 is ignored"):
        SPARTADiLoCoStrategy(sparta_interval=3)
    with pytest.raises(TypeError, match=r"MyDiLoCo defines step, but DiLoCoStrategy runs as an "
                                        r"exogym node-stacked strategy"):
        class MyDiLoCo(DiLoCoStrategy):
            def step(self) -> None:
                pass


def test_exo_gym_s_package_exports() -> None:
    import exogym.strategy as s

    assert (s.DiLoCoStrategy, s.SPARTAStrategy, s.FedAvgStrategy, s.DeMoStrategy,
            s.SPARTADiLoCoStrategy, s.SimpleReduceStrategy, s.OptimSpec) == (
        DiLoCoStrategy, SPARTAStrategy, FedAvgStrategy, DeMoStrategy, SPARTADiLoCoStrategy,
        SimpleReduceStrategy, OptimSpec)
    from exogym.trainer import Trainer as T  # EXO Gym's module path

    assert T is Trainer


def test_exo_gym_s_paths_and_helpers() -> None:
    import exogym.aux.utils
    import exogym.trainer

    import exogym
    import exogym.compat.exo_gym.auxiliary.utils as helpers

    assert exogym.aux.utils is helpers and exogym.trainer.Trainer is exogym.Trainer is Trainer
    assert helpers.get_device() == ("cuda" if torch.cuda.is_available() else "mps"
                                    if torch.backends.mps.is_available() else "cpu")
    from exogym.compat.exo_gym import Strategy, all_reduce
    from exogym.strategy import PerNodeStrategy
    from exogym.strategy.communicate import all_reduce as path
    from exogym.strategy.strategy import Strategy as PerNodeBase

    assert path is all_reduce and PerNodeBase is Strategy is PerNodeStrategy


def test_importing_exogym_s_own_modules_loads_no_exo_gym_code() -> None:
    # EXO Gym's names in exogym's method modules are handed on when asked for, not before
    import subprocess

    code = ("import sys, exogym.strategy.diloco, exogym.strategy.demo, exogym.strategy.sparta, "
            "exogym.strategy.sparta_diloco, exogym.run.trainer, exogym.run.launch, exogym.cli; "
            "print(sorted(m for m in sys.modules if m.startswith('exogym.compat')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_trainer_s_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    kw: dict[str, Any] = {"strategy": SimpleReduceStrategy(), "num_nodes": 2, "max_steps": 1,
                          "progress": False}
    # EXO Gym's Trainer(device=) is its runs' device, in either form of fit; fit(device="")
    # (EXO Gym's "pick one", nanogpt_train.py's default) is that one, or auto
    t = Trainer(mlp(), data(64), device="cpu")
    assert t.fit(**kw, device="").parameters().__next__().device.type == "cpu"
    assert t.fit(strategy=DiLoCo(H=1), num_nodes=2, max_steps=1, batch_size=8,
                 progress=False).device == "cpu"
    assert Trainer(mlp(), data(64)).fit(**kw, device="") is not None
    with pytest.raises(ValueError, match=r"fit\(device='meta'\) and Trainer\(device='cpu'\) "
                                         r"differ"):
        t.fit(**kw, device="meta")
    with pytest.raises(ValueError, match=r"fit\(device='meta'\) and Trainer\(device='cpu'\) "
                                         r"differ"):
        t.fit(strategy=DiLoCo(H=1), num_nodes=2, max_steps=1, device="meta")
    # devices: one CUDA index for all the simulated nodes
    assert Trainer(mlp(), data(64), devices=[1]).device == "cuda:1"
    with pytest.raises(ValueError, match=r"devices=\[0, 1\]: exogym simulates every node of a "
                                         r"run on one device"):
        Trainer(mlp(), data(64), devices=[0, 1])
    with pytest.raises(ValueError, match=r"devices=\[0\] names CUDA devices, but "
                                         r"device='cpu'"):
        Trainer(mlp(), data(64), device="cpu", devices=[0])


# -- EXO Gym's fit arguments -------------------------------------------------------------------
def _config(tmp_path: Path, name: str, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    t = Trainer(mlp(), data(512), data(64, 1))
    t.fit(strategy=SimpleReduceStrategy(), num_nodes=2, progress=False,
          run_name=name, **kwargs)
    return t.result, json.loads((Path("logs") / name / "config.json").read_text())


def test_fit_maps_exo_gym_s_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # max_steps decides when given (EXO Gym's loop ignored num_epochs then)
    r, c = _config(tmp_path, "a", num_epochs=5, max_steps=7)
    assert r.steps == 7 and (c["batch_size_per_node"], c["seed"], c["partition"]) == (16, 42, "iid")
    # num_epochs alone: passes over each node's 256 samples at 16 per step
    r, c = _config(tmp_path, "b", num_epochs=2, minibatch_size=8, shuffle=False, autocast=True,
                   val_interval=4, val_size=32)
    assert r.steps == 32
    assert (c["micro_batch_size"], c["partition"], c["precision"]) == (8, "contiguous", "bf16")
    assert (c["eval_interval"], c["eval_samples"], c["eval_batch_size"]) == (4, 32, 8)
    # val_size=0: no evaluation at all
    r, c = _config(tmp_path, "c", max_steps=3, val_size=0)
    assert not any("eval_loss" in row for row in r.history) and r.final == {}
    # by position: fit(num_epochs, strategy, num_nodes, max_steps, batch_size)
    t = Trainer(mlp(), data(512), data(64, 1))
    out = t.fit(1, DiLoCoStrategy(H=2), 2, 4, 8, progress=False)
    assert isinstance(out, nn.Module) and (t.result.steps, t.result.batch_size) == (4, 8)
    # exogym's sinks go beside EXO Gym's CSV logs
    from exogym.run.output.sinks import CSVSink

    r, c = _config(tmp_path, "e", max_steps=2, sinks=[CSVSink(tmp_path / "m.csv")])
    # the header, the evaluation before the first step and both steps (logged every step)
    assert (tmp_path / "m.csv").read_text().count("\n") == 4
    # checkpoint_interval is in steps, into save_dir/run_name
    r, c = _config(tmp_path, "d", max_steps=4, checkpoint_interval=2, save_dir="ck")
    assert (c["checkpointing"]["every"], r.out_dir) == (2, Path("ck") / "d")
    assert sorted(p.name for p in (Path("ck") / "d" / "checkpoints").iterdir())[-1] == \
        "step-00000004"


def test_fit_refuses_what_has_no_meaning(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    t = Trainer(mlp(), data(512), data(64, 1))
    kw: dict[str, Any] = {"strategy": SimpleReduceStrategy(), "num_nodes": 2, "max_steps": 2,
                          "progress": False}
    with pytest.raises(ValueError, match=r"correlation_interval=5 has no equivalent"):
        t.fit(**kw, correlation_interval=5)
    # a DataLoader's speed settings change nothing here (no DataLoader): said, and ignored;
    # what would change the batches is an error
    with pytest.warns(ExoGymWarning, match=r"dataloader_kwargs \{'num_workers': 2\} are "
                                           r"ignored"):
        t.fit(**kw, dataloader_kwargs={"num_workers": 2})
    with pytest.raises(ValueError, match=r"\['drop_last'\] would change the batches"):
        t.fit(**kw, dataloader_kwargs={"num_workers": 2, "drop_last": True})
    with pytest.raises(ValueError, match=r"minibatch_size must be an integer >= 1 that divides "
                                         r"batch_size 16 .* got 6"):
        t.fit(**kw, minibatch_size=6)
    with pytest.raises(TypeError, match=r"got eval_interval=3 and EXO Gym's val_interval"):
        t.fit(**kw, val_interval=3, eval_interval=3)
    with pytest.raises(ValueError, match=r"log_x_axis must be 'step' or 'examples' .* got "
                                         r"'samples'"):
        t.fit(**kw, log_x_axis="samples")
    with pytest.warns(ExoGymWarning, match="force_minibatch_recalculate=True is ignored"):
        t.fit(**kw, force_minibatch_recalculate=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        t.fit(**kw, colour="blue")
    # EXO Gym's arguments with an exogym strategy: exogym's names
    with pytest.raises(TypeError, match=r"argument\(s\) \['val_interval'\]\), which takes an "
                                        r"EXO Gym strategy .* val_interval -> eval_interval"):
        t.fit(strategy=DiLoCo(H=2), num_nodes=2, max_steps=2, val_interval=2)
    with pytest.raises(TypeError, match="arguments by position"):
        t.fit(1, "ddp", 2)
    assert not Path("logs").exists()  # nothing ran, nothing was written


class FakeWandb:
    """``wandb`` as WandbSink calls it: records each ``init`` and each ``log``'s step."""

    def __init__(self) -> None:
        self.inits: list[dict[str, Any]] = []
        self.steps: list[int] = []

    def init(self, **kwargs: Any) -> Any:
        self.inits.append(kwargs)
        log = self.steps.append

        class Run:
            id, summary = "run-1", {}

            def log(self, metrics: dict[str, Any], step: int) -> None:
                log(step)

            def finish(self, exit_code: int) -> None:
                assert exit_code == 0

        return Run()


def test_wandb_logs_against_the_step_or_the_examples(monkeypatch: pytest.MonkeyPatch) -> None:
    # EXO Gym's log_x_axis: W&B's step is the step, or the samples trained over all the nodes
    # (example/diloco_scaling.py); the run's config gets fit's kwargs= (EXO Gym logged them)
    for axis, per_step in (("step", 1), ("examples", 2 * 16)):
        fake = FakeWandb()
        monkeypatch.setitem(sys.modules, "wandb", fake)
        Trainer(mlp(), data(512), data(64, 1)).fit(
            strategy=SimpleReduceStrategy(), num_nodes=2, max_steps=3, wandb_project="proj",
            run_name="r", log_x_axis=axis, kwargs={"dataset_name": "toy"}, progress=False)
        assert fake.steps == [0, per_step, 2 * per_step, 3 * per_step]  # rows at 0 (eval) .. 3
        (init,) = fake.inits
        assert (init["project"], init["name"], init["config"]["dataset_name"]) == (
            "proj", "r", "toy")


# -- a per-node class: the same numbers in one process and as 2 processes -----------------------
class GatherAverage(SimpleReduceStrategy):
    """Per-node: DDP's step, and every 2 steps the parameters replaced by the mean of all
    nodes' (all_gather) and then node 0's (broadcast): all three collectives across ranks."""

    def step(self) -> None:
        from exogym.strategy.communicate import all_gather, broadcast

        super().step()
        if self.local_step % 2 == 0:
            with torch.no_grad():
                for p in self.model.parameters():
                    parts = [torch.zeros_like(p) for _ in range(self.num_nodes)]
                    all_gather(parts, p)
                    p.copy_(torch.stack(parts).mean(0))
                    broadcast(p, src=0)


class BNNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.fc1, self.bn, self.fc2 = nn.Linear(16, 8, bias=False), nn.BatchNorm1d(8), \
            nn.Linear(8, 4)

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.fc2(torch.tanh(self.bn(self.fc1(x.flatten(1))))), y)


def test_a_per_node_class_gives_the_same_numbers_as_2_processes() -> None:
    kw: dict[str, Any] = {"num_nodes": 2, "max_steps": 6, "batch_size": 8, "seed": 0,
                          "progress": False, "network": None, "log_interval": 2}
    spec = OptimSpec("adamw", lr=1e-2)
    here = Trainer(BNNet(), data(256), data(64, 1)).fit(strategy=GatherAverage(spec), **kw)
    # exogym's own process launcher takes exogym's strategies: the per-node class converted
    procs = fit_processes(BNNet(), data(256), data(64, 1), strategy=as_stacked(GatherAverage(spec)),
                          backend="gloo", timeout_s=60.0, threads=1, **kw)
    assert procs.processes == 2 and here.processes == 1
    same(params(here.model), params(procs.model), atol=1e-6)
    assert procs.bytes_sent == here.bytes_sent and len(procs.comm_log) == len(here.comm_log)
    assert [r["train_loss"] for r in procs.history] == pytest.approx(
        [r["train_loss"] for r in here.history], abs=1e-6)


def test_the_processes_meet_at_the_port_given(monkeypatch: pytest.MonkeyPatch) -> None:
    # EXO Gym's start_port: Trainer keeps it (its simulated nodes open no port), and exogym's
    # processes meet at fit_processes(port=), else at a free port the OS picks
    from exogym.run import launch

    assert Trainer(mlp(), data(64), start_port=15000).start_port == 15000
    with pytest.raises(ValueError, match=r"start_port must be an integer in \[1, 65535\]"):
        Trainer(mlp(), data(64), start_port=0)
    ports: list[int] = []

    def spawn(nprocs: int, args: tuple[Any, ...]) -> Any:
        ports.append(args[1])  # (nprocs, port, ...): what every worker's init_group dials
        raise KeyboardInterrupt

    monkeypatch.setattr(launch, "_spawn", spawn)
    monkeypatch.setattr(launch, "free_port", lambda: 40001)
    for port in (15007, None):
        with pytest.raises(KeyboardInterrupt):
            fit_processes(mlp(), data(64), None, strategy=DiLoCo(H=1), num_nodes=2,
                          max_steps=1, port=port)
    assert ports == [15007, 40001]
    with pytest.raises(ValueError, match=r"port must be an integer in \[1, 65535\] or None"):
        fit_processes(mlp(), data(64), None, strategy=DiLoCo(H=1), num_nodes=2, max_steps=1,
                      port=70000)


def test_as_stacked_without_n_refuses_an_island_size_it_cannot_check() -> None:
    # through fit_processes(strategy=as_stacked(s)) an island_size below N went unchecked and
    # was ignored (found in review)
    with pytest.raises(ValueError, match=r"island_size=2\) depends on the run's N: give "
                                         r"as_stacked\(strategy, num_nodes=N\)"):
        as_stacked(FedAvgStrategy(island_size=2, H=2))
    assert isinstance(as_stacked(FedAvgStrategy(H=2)), FedAvg)


def test_the_same_device_in_two_spellings_is_not_a_conflict() -> None:
    from exogym.compat.exo_gym.fit_form import same_device

    assert same_device(torch.device("cpu"), "cpu") and same_device("cpu", "cpu")
    assert not same_device("cpu", "auto") and same_device("auto", "auto")
