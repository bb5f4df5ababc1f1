"""DilocoSimulator: the diloco-sim interface runs DiLoCo through the same machinery."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support.runs import sign_data
from torch import nn

from exogym import Classifier, DilocoSimulator, Trainer
from exogym.strategy import DiLoCo
from exogym.strategy.optim import LRSchedule, OptimSpec


class TinyNet(nn.Module):
    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def test_simulator_equals_trainer_with_diloco() -> None:
    train, test = sign_data(256, 0), sign_data(64, 1)
    torch.manual_seed(3)
    sim = DilocoSimulator(
        model_cls=TinyNet, model_kwargs={"in_features": 6, "num_classes": 2},
        optimizer_kwargs={"lr": 0.01}, num_nodes=2, train_dataset=train, eval_dataset=test,
        loss_fn=F.cross_entropy, num_epochs=2, batch_size=16, diloco_interval=4,
        eval_interval=8, warmup_steps=2, cosine_anneal=True, max_norm=1.0, device="cpu",
    )
    got = sim.train(progress=False)

    torch.manual_seed(3)
    model = Classifier(TinyNet(6, 2), F.cross_entropy)
    strategy = DiLoCo(H=4, optim=OptimSpec(name="adamw", lr=0.01),
                      schedule=LRSchedule(warmup_steps=2, cosine=True), max_grad_norm=1.0)
    want = Trainer(model, train, test).fit(strategy=strategy, num_nodes=2, num_epochs=2,
                                           batch_size=16, eval_interval=8, device="cpu",
                                           progress=False)
    # 256 samples / 2 nodes / batch 16 = 8 steps per epoch, 2 epochs.
    assert got.steps == want.steps == 16
    assert got.final == want.final
    for a, b in zip(got.model.parameters(), want.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert got.hyperparameters["H"] == 4 and got.hyperparameters["outer_lr"] == 0.7


def test_simulator_defaults_follow_diloco_sim() -> None:
    sim = DilocoSimulator(model_cls=TinyNet, model_kwargs={"in_features": 6, "num_classes": 2},
                          optimizer_kwargs={"lr": 1e-3}, train_dataset=sign_data(64, 0),
                          loss_fn=F.cross_entropy)
    assert (sim.strategy.H, sim.strategy.outer_lr, sim.strategy.outer_momentum) == (500, 0.7, 0.9)
    assert sim.strategy.outer_optimizer == "nesterov"
    assert sim.batch_size == 16 and sim.num_nodes == 4
    assert sim.strategy.optim.name == "adamw"


def test_simulator_max_local_step_caps_steps() -> None:
    sim = DilocoSimulator(model_cls=TinyNet, model_kwargs={"in_features": 6, "num_classes": 2},
                          optimizer_kwargs={"lr": 1e-3}, train_dataset=sign_data(256, 0),
                          loss_fn=F.cross_entropy, num_nodes=2, diloco_interval=2,
                          max_local_step=6, device="cpu")
    assert sim.train(progress=False).steps == 6


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"optimizer_cls": torch.optim.Adagrad}, "optimizer_cls must be one of"),
        ({"outer_optimizer_cls": torch.optim.Adam}, "outer_optimizer_cls must be torch.optim.SGD"),
        ({"outer_optimizer_kwargs": {"lr": 0.5, "dampening": 0.1}}, "dampening"),
        ({"optimizer_kwargs": {"lr": -1.0}}, "lr must be a finite number > 0"),
        ({"diloco_interval": 0}, "H must be an integer >= 1"),
    ],
)
def test_simulator_rejects_what_it_cannot_honour(kwargs: dict, message: str) -> None:
    args = {"model_cls": TinyNet, "model_kwargs": {"in_features": 6, "num_classes": 2},
            "optimizer_kwargs": {"lr": 1e-3}, "train_dataset": sign_data(64, 0),
            "loss_fn": F.cross_entropy, **kwargs}
    with pytest.raises(ValueError, match=message):
        DilocoSimulator(**args)
