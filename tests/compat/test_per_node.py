"""Per-node strategies (EXO Gym's form): code for one node, run on N simulated nodes in threads.

A per-node DDP and DiLoCo written as EXO Gym users write them give exogym's ``ddp`` and
``diloco`` numbers and bytes; the collectives follow torch.distributed's semantics; a node that
skips a collective is an error naming it, not a hang.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support.runs import noise_data
from support.scripts import ROOT, load_script
from torch import nn

from exogym import Classifier, Trainer
from exogym.strategy.communicate import ReduceOp, all_gather, all_reduce, broadcast
from exogym.strategy.ddp import DDP
from exogym.strategy.diloco import DiLoCo
from exogym.strategy.optim import OptimSpec
from exogym.strategy.per_node.rendezvous import CollectiveMismatch
from exogym.strategy.strategy import SimpleReduceStrategy, Strategy

PerNodeDiLoCo = load_script("examples/per_node.py").PerNodeDiLoCo

pytestmark = pytest.mark.usefixtures("single_thread")

DATA = noise_data(256)
FIT = dict(num_nodes=4, max_steps=6, batch_size=8, progress=False, step_time=0.01,
           eval_interval=6)


def model() -> Classifier:
    torch.manual_seed(0)
    return Classifier(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))


def fit(strategy: Any, **kwargs: Any) -> Any:
    trainer = Trainer(model(), DATA, DATA)
    trainer.fit(strategy=strategy, **{**FIT, **kwargs})
    return trainer.result  # a SimpleReduceStrategy call is EXO Gym's form: fit returns the model


def same_parameters(a: Any, b: Any, atol: float = 1e-6) -> None:
    for (k, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values(),
                         strict=True):
        assert torch.allclose(x, y, rtol=0, atol=atol), k


class QuantizedReduce(Strategy):
    """EXO Gym's README example, to the letter: rebinds ``param.grad``."""

    def __init__(self, optim_spec: OptimSpec) -> None:
        super().__init__()
        self.optim_spec = optim_spec

    def step(self) -> None:
        for param in self.model.parameters():
            if param.grad is not None:
                q = param.grad.clone()  # an identity "quantizer": the math of DDP
                all_reduce(q)
                param.grad = q / self.num_nodes
        self.optim.step()
        super().step()


class PerNodeReduce(SimpleReduceStrategy):
    """SimpleReduceStrategy with its step overridden (unchanged math): runs per-node."""

    def step(self) -> None:
        super().step()


def test_per_node_ddp_is_exogym_ddp() -> None:
    ddp = fit(DDP(optim=OptimSpec("adamw", lr=1e-2)))
    for strategy in (PerNodeReduce(OptimSpec("adamw", lr=1e-2)),
                     QuantizedReduce(OptimSpec("adamw", lr=1e-2))):
        r = fit(strategy)
        same_parameters(r, ddp)
        assert r.bytes_sent == ddp.bytes_sent  # 2 (N-1)/N x 4 x 212 x 6 = 7,632 per node
        assert r.bytes_sent == [pytest.approx(2 * 3 / 4 * 4 * 212 * 6)] * 4
        assert r.strategy == type(strategy).__name__
        # one all-reduce per parameter tensor and step (4 x 6), DDP one per step
        assert (len(r.comm_log), len(ddp.comm_log)) == (24, 6)
    # SimpleReduceStrategy used as it is runs as exogym's DDP (without buffer broadcasts, as
    # EXO Gym's): the same parameters, one all-reduce per step
    # EXO Gym's form (EXO Gym's defaults: seed 42, so the seed is given)
    r = fit(SimpleReduceStrategy(OptimSpec("adamw", lr=1e-2)), seed=0)
    same_parameters(r, ddp)
    assert (r.strategy, len(r.comm_log), r.bytes_sent) == ("ddp", 6, ddp.bytes_sent)
    assert r.hyperparameters["broadcast_buffers"] is False


def test_per_node_diloco_is_exogym_diloco() -> None:
    ref = fit(DiLoCo(H=3, optim=OptimSpec("adamw", lr=1e-2)))
    r = fit(PerNodeDiLoCo(OptimSpec("adamw", lr=1e-2), H=3))
    same_parameters(r, ref)
    assert r.bytes_sent == pytest.approx(ref.bytes_sent)


def test_a_per_node_run_resumes_exactly(tmp_path: Any) -> None:
    # PerNodeDiLoCo's state is its own attributes too (the master copy, the outer optimizer's
    # momentum): a run resumed from its step-3 checkpoint ends where the uninterrupted one does.
    full, cut = tmp_path / "full", tmp_path / "cut"
    spec = OptimSpec(torch.optim.AdamW, lr=1e-2)
    a = fit(PerNodeDiLoCo(spec, H=2), out_dir=full, checkpoint_every=3, log_interval=1)
    fit(PerNodeDiLoCo(spec, H=2), out_dir=cut, checkpoint_every=3, log_interval=1, max_steps=3)
    b = Trainer(model(), DATA, DATA).fit(resume=cut, strategy=PerNodeDiLoCo(spec, H=2),
                                         max_steps=6, progress=False)
    same_parameters(a, b, atol=0.0)
    assert a.bytes_sent == b.bytes_sent


def test_engine_auto_runs_the_nodes_steps_on_the_loop_engine() -> None:
    # with 2 intra-op threads, auto picks the threads engine for node-stacked strategies; a
    # per-node one takes the loop engine (each node's replica), the numbers of DDP's
    from exogym.sim.threads import intra_op_threads

    with intra_op_threads(2):
        r = fit(PerNodeReduce(OptimSpec("adamw", lr=1e-2)), engine="auto")
        assert fit(DDP(optim=OptimSpec("adamw", lr=1e-2)), engine="auto").engine == "threads"
    assert r.engine == "loop"
    same_parameters(r, fit(DDP(optim=OptimSpec("adamw", lr=1e-2))))
    with pytest.raises(ValueError, match=r"per-node strategies run on the loop engine, got "
                                         r"engine='threads'; allowed: loop or auto"):
        fit(PerNodeReduce(), engine="threads")


def test_the_trainer_runs_a_per_node_strategy_as_its_stacked_form() -> None:
    # exogym.Trainer is exogym's own trainer; a per-node strategy runs as as_stacked's PerNode
    import exogym
    from exogym.run.trainer import Trainer as CoreTrainer
    from exogym.strategy.per_node import PerNode, as_stacked

    assert exogym.Trainer is CoreTrainer
    converted = as_stacked(PerNodeReduce(OptimSpec("adamw", lr=1e-2)))
    assert isinstance(converted, PerNode)
    same_parameters(CoreTrainer(model(), DATA, DATA).fit(strategy=converted, **FIT),
                    fit(PerNodeReduce(OptimSpec("adamw", lr=1e-2))), atol=0.0)
    # arguments by position are EXO Gym's form, which takes EXO Gym's kind of strategy
    with pytest.raises(TypeError, match=r"fit\(\) got EXO Gym's form \(arguments by position\), "
                                        r"which takes an EXO Gym strategy"):
        CoreTrainer(model(), DATA, DATA).fit(1, DDP(), 4)
    assert as_stacked(SimpleReduceStrategy()) == DDP(
        optim=OptimSpec("adamw", lr=1e-3, weight_decay=0.01), broadcast_buffers=False)
    ddp = DDP()
    assert as_stacked(ddp) is ddp and as_stacked("ddp") == "ddp"


def test_a_per_node_optimizer_is_elementwise() -> None:
    with pytest.raises(ValueError, match=r"name='muon' is a node-stacked optimizer; a per-node "
                                         r"strategy's optimizer is one of \['adam', 'adamw'"):
        fit(QuantizedReduce(OptimSpec("muon")))


RESULTS: dict[tuple[str, int], Any] = {}


class Collectives(Strategy):
    """At its first step, node r: all_gather of [r, 10 r], broadcast from node 2 of
    [r + 0.5], all_reduce SUM and AVG of [r]."""

    def step(self) -> None:
        if self.local_step == 0:
            r, n = float(self.rank), self.num_nodes
            mine = torch.tensor([r, 10 * r])
            out = [torch.zeros(2) for _ in range(n)]
            all_gather(out, mine)
            RESULTS["gather", self.rank] = torch.stack(out)
            b = torch.tensor([r + 0.5])
            broadcast(b, src=2)
            RESULTS["broadcast", self.rank] = b
            s, a = torch.tensor([r]), torch.tensor([r])
            all_reduce(s)
            all_reduce(a, op=ReduceOp.AVG)
            RESULTS["sum", self.rank], RESULTS["avg", self.rank] = s, a
        super().step()


def test_collectives_follow_torch_distributed_semantics() -> None:
    RESULTS.clear()
    r = fit(Collectives(), max_steps=1, eval_interval=1)
    gathered = torch.tensor([[0.0, 0.0], [1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])
    for rank in range(4):
        assert torch.equal(RESULTS["gather", rank], gathered)
        assert torch.equal(RESULTS["broadcast", rank], torch.tensor([2.5]))
        assert torch.equal(RESULTS["sum", rank], torch.tensor([6.0]))
        assert torch.equal(RESULTS["avg", rank], torch.tensor([1.5]))
    # all_gather of 8 bytes: (N-1) x 8 per node; broadcast: the source sends (N-1) x 4;
    # two all-reduces of 4 bytes: 2 x 2 (N-1)/N x 4
    sent = [3 * 8 + 2 * 1.5 * 4 + (3 * 4 if i == 2 else 0) for i in range(4)]
    assert r.bytes_sent == pytest.approx(sent)


class SkipsOnNode1(Strategy):
    def step(self) -> None:
        if self.rank != 1:
            all_reduce(torch.ones(3))
        super().step()


class RaisesOnNode3(Strategy):
    def step(self) -> None:
        if self.rank == 3:
            raise FloatingPointError("node 3 is broken")
        all_reduce(torch.ones(3))
        super().step()


def test_a_skipped_collective_is_an_error_naming_the_nodes_not_a_hang() -> None:
    with pytest.raises(CollectiveMismatch, match=(
            r"at step 0: node 0 called all_reduce \(collective #1 of its step\) on a "
            r"torch.float32 tensor of shape \[3\].*; node 1 reached the end of its step after "
            r"0 collectives")):
        fit(SkipsOnNode1())
    with pytest.raises(FloatingPointError, match="node 3 is broken"):
        fit(RaisesOnNode3())
    # nothing of the failed steps stays behind: the next run trains as DDP does
    same_parameters(fit(PerNodeReduce(OptimSpec("adamw", lr=1e-2))),
                    fit(DDP(optim=OptimSpec("adamw", lr=1e-2))))


class NoisyReduce(SimpleReduceStrategy):
    """Adds noise from torch's global generator to each gradient before reducing it."""

    def step(self) -> None:
        for param in self.model.parameters():
            param.grad.add_(torch.randn_like(param.grad), alpha=1e-3)
        super().step()


class ReducesInInferenceMode(Strategy):
    def step(self) -> None:
        with torch.inference_mode():
            all_reduce(torch.ones(2))
        super().step()


def test_nodes_run_in_a_fixed_order_and_keep_their_own_grad_mode() -> None:
    # The global generator is drawn from in node order: the same seed, the same numbers.
    a, b = fit(NoisyReduce(), seed=3), fit(NoisyReduce(), seed=3)
    same_parameters(a, b, atol=0.0)
    assert not torch.equal(next(iter(a.model.state_dict().values())),
                           next(iter(fit(SimpleReduceStrategy(), seed=3).model.state_dict()
                                     .values())))
    with pytest.raises(RuntimeError, match=r"node 0 calls all_reduce inside "
                                           r"torch.inference_mode\(\)"):
        fit(ReducesInInferenceMode())
    assert torch.is_grad_enabled()


def test_the_two_bases_are_not_mixed() -> None:
    from dataclasses import dataclass

    from exogym.strategy import PerNodeStrategy
    from exogym.strategy import StackedStrategy as Stacked

    # a per-node step(self) on the node-stacked base: refused when defined, naming the per-node
    # base; the same code on that base runs per-node
    with pytest.raises(TypeError, match=r"^ExoGymStyle defines a per-node step\(self\), but it "
                                        r"subclasses StackedStrategy, a node-stacked strategy "
                                        r"whose step\(self, step\) updates all the nodes at once; "
                                        r"for code written for one node, subclass "
                                        r"exogym.strategy.Strategy \(the per-node base, EXO "
                                        r"Gym's\) instead$"):
        class ExoGymStyle(Stacked):
            def step(self) -> None:  # type: ignore[override]
                pass

    class PerNodeStyle(PerNodeStrategy):
        def __init__(self, optim_spec: OptimSpec) -> None:
            super().__init__()
            self.optim_spec = optim_spec

        def step(self) -> None:
            for param in self.model.parameters():
                all_reduce(param.grad, op=ReduceOp.AVG)
            self.optim.step()
            super().step()

    assert PerNodeStrategy is Strategy and not issubclass(PerNodeStyle, Stacked)
    same_parameters(fit(PerNodeStyle(OptimSpec("adamw", lr=1e-2))),
                    fit(DDP(optim=OptimSpec("adamw", lr=1e-2))))
    # a step(self) under a node-stacked method: the same rule at any depth
    with pytest.raises(TypeError, match=r"^Mixed defines a per-node step\(self\), but it "
                                        r"subclasses DiLoCo, a node-stacked strategy .* subclass "
                                        r"exogym.strategy.Strategy \(the per-node base, EXO "
                                        r"Gym's\) instead$"):
        @dataclass(kw_only=True)
        class Mixed(DiLoCo):
            def step(self) -> None:  # type: ignore[override]
                pass
    with pytest.raises(TypeError, match=r"a per-node strategy \(exogym.strategy.Strategy, EXO"):
        fit(object())


def test_optim_spec_takes_exo_gym_s_forms() -> None:
    # the class form takes torch's defaults, as EXO Gym's did (AdamW: weight decay 0.01)
    assert OptimSpec(torch.optim.AdamW, lr=3e-4) == OptimSpec("adamw", lr=3e-4,
                                                               weight_decay=0.01)
    assert OptimSpec(torch.optim.AdamW, weight_decay=0.0) == OptimSpec("adamw")
    assert OptimSpec(torch.optim.Adam).weight_decay == OptimSpec("adamw").weight_decay == 0.0
    assert OptimSpec.from_string("SGD", lr=0.1, momentum=0.9) == OptimSpec(
        "sgd", lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match=r"RMSprop has no exogym equivalent; allowed: "
                                         r"torch.optim.adamw.AdamW"):
        OptimSpec(torch.optim.RMSprop)
    with pytest.raises(TypeError):
        OptimSpec(torch.optim.AdamW, amsgrad=True)  # an argument exogym does not have


def test_collectives_outside_a_run_say_where_they_work() -> None:
    with pytest.raises(RuntimeError, match="a collective outside a run"):
        all_reduce(torch.ones(2))
    with pytest.raises(ValueError, match=r"op must be ReduceOp.SUM or ReduceOp.AVG"):
        all_reduce(torch.ones(2), op=ReduceOp.MAX)


def test_lambda_cosine_is_exo_gym_s_schedule() -> None:
    s = SimpleReduceStrategy(lr_scheduler="lambda_cosine",
                             lr_scheduler_kwargs={"warmup_steps": 2, "cosine_anneal": True})
    s.max_steps = 10
    # warm-up (t + 1) / 2: 0.5, 1 (the built-ins' LRSchedule; EXO Gym's t / 2 began at 0);
    # then 0.1 + 0.9 * (1 + cos(pi (t - 2) / 8)) / 2
    assert [s._lambda_cosine(t) for t in (0, 1, 2, 6, 10)] == pytest.approx(
        [0.5, 1.0, 1.0, 0.55, 0.1])
    with pytest.raises(ValueError, match=r"unknown \['warmup'\]"):
        SimpleReduceStrategy(lr_scheduler="lambda_cosine", lr_scheduler_kwargs={"warmup": 2})


def test_a_per_node_schedule_is_the_built_in_s() -> None:
    # SimpleReduceStrategy as it is runs as exogym's DDP with LRSchedule; its per-node subclass
    # runs its own LambdaLR: the same learning rates step by step, so the same parameters
    kw = dict(lr_scheduler="lambda_cosine",
              lr_scheduler_kwargs={"warmup_steps": 3, "cosine_anneal": True})
    built_in = fit(SimpleReduceStrategy(OptimSpec("adamw", lr=1e-2), **kw), seed=0,
                   log_interval=1)
    per_node = fit(PerNodeReduce(OptimSpec("adamw", lr=1e-2), **kw), seed=0, log_interval=1)
    assert built_in.strategy == "ddp" and per_node.strategy == "PerNodeReduce"
    lrs = [row["lr"] for row in per_node.history if "lr" in row]
    assert lrs == pytest.approx([row["lr"] for row in built_in.history if "lr" in row])
    # a row's lr is the next step's: steps 1 and 2 at 2/3 and 3/3 of lr (step 0 at 1/3, not 0:
    # the parameters agree only if it was)
    assert lrs[:2] == pytest.approx([2e-2 / 3, 1e-2])
    same_parameters(per_node, built_in)


def test_optim_spec_builds_over_a_module_as_exo_gym_s() -> None:
    # EXO Gym's strategies build their own optimizers: self.optim_spec.build(self.model)
    net = nn.Linear(3, 2)
    optim = OptimSpec(torch.optim.AdamW, lr=0.5).build(net)
    assert isinstance(optim, torch.optim.AdamW)
    assert optim.param_groups[0]["params"] == list(net.parameters())
    assert (optim.param_groups[0]["lr"], optim.param_groups[0]["weight_decay"]) == (0.5, 0.01)


class KeepsGradients(SimpleReduceStrategy):
    def zero_grad(self) -> None:  # gradient accumulation in EXO Gym: not zeroing
        pass

    def step(self) -> None:
        super().step()


def test_an_overridden_zero_grad_is_refused_not_ignored() -> None:
    with pytest.raises(TypeError, match=r"KeepsGradients overrides zero_grad\(\)"):
        fit(KeepsGradients(OptimSpec("adamw", lr=1e-2)))


def test_the_tutorial_s_per_node_strategy_is_its_node_stacked_one() -> None:
    # docs/writing-a-strategy.md section 9 against examples/custom_strategy.py (rounds end after
    # steps 2 and 6 for H=2, rho=2): the same parameters, the same bytes (a model without
    # buffers: the node-stacked one also averages float buffers)
    import re

    text = (ROOT / "docs" / "writing-a-strategy.md").read_text()
    code = re.search(r"## 9\..*?```python\n(.*?)```", text, re.S).group(1)
    scope: dict[str, Any] = {}
    exec(compile(code, "writing-a-strategy.md", "exec"), scope)
    GrowingLocalSGD = load_script("examples/custom_strategy.py").GrowingLocalSGD
    spec = OptimSpec("adamw", lr=1e-2)
    ref = fit(GrowingLocalSGD(H=2, rho=2.0, H_max=5, optim=spec))
    r = fit(scope["GrowingLocalSGDPerNode"](spec, H=2, rho=2.0, H_max=5))
    same_parameters(r, ref)
    assert r.bytes_sent == pytest.approx(ref.bytes_sent)
    assert sorted({c.step for c in r.comm_log}) == sorted({c.step for c in ref.comm_log}) == [1, 5]
