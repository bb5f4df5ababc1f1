"""DiLoCo with a delayed or eager outer step (Kale, Douillard, Donchev, arXiv:2502.12996).

Closed-form tests: a 2-parameter vector ``w`` on N nodes (float64), per-node gradients written
by hand, inner SGD (``x_m = theta_m - lr * sum of g_m`` over the phase, so an outer gradient
``Delta_m = lr * sum g_m`` does not depend on where the phase started), expectations worked out in
the comments. Then the reductions the equations give (one node: DiLoCo; ``delay=0``: DiLoCo bit
for bit), the simulated clock, the world, recovery and exact resume.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from support.by_hand import TOL, Heard, build, sgd, step_with, t
from support.resume_cases import WALL, Net, assert_same_state, data, run_rows, run_summary

from exogym import Trainer
from exogym.run.output.checkpoint import load_checkpoint
from exogym.strategy import make
from exogym.strategy.diloco_eager import DiLoCoEager
from exogym.utils.config import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")

# Three rounds of H = 2 inner steps (lr 0.1) on N = 2 nodes, each node's gradient constant
# within a round, so Delta_m^(r) = 0.2 g_m^(r):
#   r1: g = [1, 0], [0, 2]  -> Delta = [0.2, 0], [0, 0.4]   mean D1 = [0.1, 0.2]
#   r2: g = [3, 0], [0, -1] -> Delta = [0.6, 0], [0, -0.2]  mean D2 = [0.3, -0.1]
#   r3: g = [-1, 1], [2, 0] -> Delta = [-0.2, 0.2], [0.4, 0] mean D3 = [0.1, 0.1]
ROUNDS = [[[1.0, 0.0], [0.0, 2.0]], [[3.0, 0.0], [0.0, -1.0]], [[-1.0, 1.0], [2.0, 0.0]]]


def heavy_ball(**kw: Any) -> DiLoCoEager:
    """H = 2, inner SGD lr 0.1, outer heavy-ball SGD: b <- 0.5 b + g; theta <- theta - 0.5 b."""
    return DiLoCoEager(H=2, outer_optimizer="sgd", outer_lr=0.5, outer_momentum=0.5,
                       optim=sgd(0.1), **kw)


def run_round(strategy, nodes, comm, grads, first_step: int, H: int = 2) -> None:
    for step in range(first_step, first_step + H):
        comm.attendance.step = step
        step_with(strategy, nodes, grads, step)


def momentum(opt: torch.optim.Optimizer, p: torch.Tensor) -> torch.Tensor:
    return opt.state[p]["momentum_buffer"]


# -- the two forms, by hand -----------------------------------------------------------------------
def test_naive_delayed_outer_gradient_trace_by_hand():
    # Algorithm 2: theta^(t) = OuterOpt(theta^(t-1), D_{t-1}); every node restarts from theta.
    s = heavy_ball(eager=False)
    nodes, comm = build(s, (1.0, 2.0))
    w = nodes.params["w"]

    # r1: nothing has arrived: no outer step, and both nodes restart from theta^(0) = [1, 2]
    # although they trained (their progress is the in-flight D1)
    run_round(s, nodes, comm, ROUNDS[0], 0)
    assert torch.allclose(w, t([[1.0, 2.0], [1.0, 2.0]]), **TOL)
    assert not s.outer_opt.state and len(s.in_flight) == 1
    assert torch.allclose(s.in_flight[0]["grads"][0], t([0.1, 0.2]), **TOL)

    # r2: D1 applied: b = [0.1, 0.2]; theta = [1, 2] - 0.5 b = [0.95, 1.9]
    run_round(s, nodes, comm, ROUNDS[1], 2)
    assert torch.allclose(w, t([[0.95, 1.9], [0.95, 1.9]]), **TOL)
    assert torch.allclose(momentum(s.outer_opt, s.global_params["w"]), t([0.1, 0.2]), **TOL)

    # r3: D2 = [0.3, -0.1]: b = 0.5 [0.1, 0.2] + D2 = [0.35, 0]; theta = [0.95 - 0.175, 1.9]
    run_round(s, nodes, comm, ROUNDS[2], 4)
    assert torch.allclose(w, t([[0.775, 1.9], [0.775, 1.9]]), **TOL)
    assert torch.allclose(s.global_state()["w"], t([0.775, 1.9]), **TOL)
    # D3 is still in flight: never applied in a 6-step run
    assert torch.allclose(s.in_flight[0]["grads"][0], t([0.1, 0.1]), **TOL)
    # one overlapped all-reduce per round, DiLoCo's bytes: 2 (N-1)/N * 16 = 16 per node per round
    assert [(r.op, r.step, r.tag, r.overlap) for r in comm.log] == [
        ("all_reduce", 1, "pseudo_grads", True), ("all_reduce", 3, "pseudo_grads", True),
        ("all_reduce", 5, "pseudo_grads", True)]
    assert comm.bytes_sent == [48.0, 48.0]


def test_eager_outer_gradient_trace_by_hand():
    # Algorithm 3: D_m^(t) = (1/N) (Delta_m^(t) + sum_{k != m} Delta_k^(t-1)), each node with its
    # own theta_m and its own momentum b_m.
    s = heavy_ball()
    nodes, comm = build(s, (1.0, 2.0))
    w, theta = nodes.params["w"], s.outer_params["w"]

    # r1 (Delta^(0) = 0): D_0 = [0.2, 0] / 2 = [0.1, 0], D_1 = [0, 0.4] / 2 = [0, 0.2];
    # b_m = D_m; theta_0 = [1 - 0.05, 2] = [0.95, 2], theta_1 = [1, 2 - 0.1] = [1, 1.9]
    run_round(s, nodes, comm, ROUNDS[0], 0)
    assert torch.allclose(w, t([[0.95, 2.0], [1.0, 1.9]]), **TOL)
    assert torch.allclose(momentum(s.node_outer_opt, theta), t([[0.1, 0.0], [0.0, 0.2]]), **TOL)

    # r2: D_0 = ([0.6, 0] + [0, 0.4]) / 2 = [0.3, 0.2], D_1 = ([0, -0.2] + [0.2, 0]) / 2
    # = [0.1, -0.1] (= D1 - own stale / 2 + own fresh / 2);
    # b_0 = 0.5 [0.1, 0] + [0.3, 0.2] = [0.35, 0.2] -> theta_0 = [0.95, 2] - 0.5 b_0
    # = [0.775, 1.9]; b_1 = 0.5 [0, 0.2] + [0.1, -0.1] = [0.1, 0] -> theta_1 = [0.95, 1.9]
    run_round(s, nodes, comm, ROUNDS[1], 2)
    assert torch.allclose(w, t([[0.775, 1.9], [0.95, 1.9]]), **TOL)
    assert torch.allclose(momentum(s.node_outer_opt, theta), t([[0.35, 0.2], [0.1, 0.0]]), **TOL)

    # r3: D_0 = ([-0.2, 0.2] + [0, -0.2]) / 2 = [-0.1, 0], D_1 = ([0.4, 0] + [0.6, 0]) / 2
    # = [0.5, 0]; b_0 = [0.175, 0.1] + [-0.1, 0] = [0.075, 0.1] -> theta_0 = [0.7375, 1.85];
    # b_1 = [0.05, 0] + [0.5, 0] = [0.55, 0] -> theta_1 = [0.95 - 0.275, 1.9] = [0.675, 1.9]
    run_round(s, nodes, comm, ROUNDS[2], 4)
    assert torch.allclose(w, t([[0.7375, 1.85], [0.675, 1.9]]), **TOL)
    assert torch.equal(theta, w)  # the nodes restart from their own outer parameters
    # the global model: the node mean [0.70625, 1.875]
    assert torch.allclose(s.global_state()["w"], t([0.70625, 1.875]), **TOL)
    assert [r.overlap for r in comm.log] == [True] * 3 and comm.bytes_sent == [48.0, 48.0]


@pytest.mark.parametrize("outer", ["nesterov", "adam"])
def test_first_round_naive_steps_nothing_and_eager_applies_its_own_share(outer: str):
    # Prepare: 2 nodes, H = 1, one round: x = [1, 2] - 0.1 g, Delta_0 = [0.1, 0], Delta_1 =
    # [0, 0.2]
    grads = [[1.0, 0.0], [0.0, 2.0]]
    naive = DiLoCoEager(H=1, eager=False, outer_optimizer=outer, outer_lr=0.7, optim=sgd(0.1))
    nodes, comm = build(naive, (1.0, 2.0))
    step_with(naive, nodes, grads, 0)
    # naive: no outer step (no Adam count either), nodes back at theta^(0), D1 in flight
    assert not naive.outer_opt.state
    assert torch.equal(naive.global_params["w"], t([1.0, 2.0]))
    assert torch.equal(nodes.params["w"], t([[1.0, 2.0], [1.0, 2.0]]))
    assert naive.in_flight[0]["count"] == 2 and comm.bytes_sent == [16.0, 16.0]

    eager = DiLoCoEager(H=1, outer_optimizer=outer, outer_lr=0.7, optim=sgd(0.1))
    nodes, _ = build(eager, (1.0, 2.0))
    step_with(eager, nodes, grads, 0)
    # eager: D_m = Delta_m / 2 = [0.05, 0], [0, 0.1]; Nesterov's first step (lr 0.7, mu 0.9):
    # theta - 0.7 (1 + 0.9) D_m; Adam's first step (eps 0.1): theta - 0.7 D / (|D| + 0.1)
    if outer == "nesterov":
        expected = [[1.0 - 1.33 * 0.05, 2.0], [1.0, 2.0 - 1.33 * 0.1]]
    else:
        expected = [[1.0 - 0.7 * 0.05 / 0.15, 2.0], [1.0, 2.0 - 0.7 * 0.1 / 0.2]]
    assert torch.allclose(nodes.params["w"], t(expected), **TOL)
    assert eager.outer_counts.tolist() == [1, 1]


def test_delay_two_applies_each_mean_two_rounds_later():
    # H = 1, outer SGD lr 1 (theta -= D), 2 nodes, d = 2: the tags alternate, the clock may run
    # each all-reduce under 2 H steps; Delta^(r) = 0.1 g
    grads = [[[1.0, 0.0], [0.0, 2.0]], [[2.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [4.0, 0.0]]]
    naive = DiLoCoEager(H=1, delay=2, eager=False, outer_optimizer="sgd", outer_lr=1.0,
                        outer_momentum=0.0, optim=sgd(0.1))
    nodes, comm = build(naive, (1.0, 2.0))
    for step, g in enumerate(grads):
        comm.attendance.step = step
        step_with(naive, nodes, g, step)
    # rounds 1 and 2 apply nothing; round 3 applies D1 = [0.05, 0.1]
    assert torch.allclose(nodes.params["w"], t([[0.95, 1.9], [0.95, 1.9]]), **TOL)
    assert [r.tag for r in comm.log] == ["pseudo_grads0", "pseudo_grads1", "pseudo_grads0"]
    assert naive.overlap_steps == 2 and len(naive.in_flight) == 2

    eager = DiLoCoEager(H=1, delay=2, outer_optimizer="sgd", outer_lr=1.0, outer_momentum=0.0,
                        optim=sgd(0.1))
    nodes, _ = build(eager, (1.0, 2.0))
    for step, g in enumerate(grads):
        step_with(eager, nodes, g, step)
    # r1, r2: Delta_m / 2: node 0 [0.05, 0] + [0.1, 0], node 1 [0, 0.1] + [0, 0];
    # r3: D1 - Delta_m^(1) / 2 + Delta_m^(3) / 2: node 0 [0.05, 0.1] - [0.05, 0] + 0 = [0, 0.1];
    # node 1 [0.05, 0.1] - [0, 0.1] + [0.2, 0] = [0.25, 0]
    # theta_0 = [1 - 0.15, 2 - 0.1] = [0.85, 1.9], theta_1 = [1 - 0.25, 2 - 0.1] = [0.75, 1.9]
    assert torch.allclose(nodes.params["w"], t([[0.85, 1.9], [0.75, 1.9]]), **TOL)


# -- what the equations give -----------------------------------------------------------------------
def test_eager_node_mean_is_nesterov_on_the_mean_eager_gradient():
    # Nesterov is linear in its gradients, so mean_m theta_m follows one Nesterov run on
    # mean_m D_m = (1/N) Delta^(t) + (1 - 1/N) Delta^(t-1) (Delta^(0) = 0). N = 3, H = 2, 4 rounds.
    n, rounds = 3, 4
    gen = torch.Generator().manual_seed(0)
    grads = torch.randn(rounds, 2, n, 2, generator=gen, dtype=torch.float64)  # [r, h, node, w]
    s = DiLoCoEager(H=2, outer_lr=0.7, optim=sgd(0.1))
    nodes, _ = build(s, (1.0, 2.0), n=n)
    ref = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True)
    previous = torch.zeros(2, dtype=torch.float64)
    for r in range(rounds):
        for h in range(2):
            step_with(s, nodes, grads[r, h].tolist(), 2 * r + h)
        mean = 0.1 * grads[r].sum(0).mean(0)  # Delta^(r) = lr * mean over nodes of sum over h
        ref.grad = mean / n + previous * (1 - 1 / n)
        opt.step()
        previous = mean
        torch.testing.assert_close(s.global_state()["w"], ref.detach(), rtol=0, atol=1e-12)
    assert not bool((nodes.params["w"] == nodes.params["w"][0]).all())  # the nodes do differ


def _fit(sid: str, *, n: int, steps: int, norm: bool = False, network: str | None = None,
         step_time: float | None = None, eval_interval: int = 2, **kw: Any):
    torch.manual_seed(1)
    return Trainer(Net(norm=norm), data(), data()).fit(
        strategy=make(sid, **kw), num_nodes=n, max_steps=steps, batch_size=8,
        eval_interval=eval_interval, eval_samples=40, log_interval=1, engine="loop", seed=3,
        progress=False, network=network, step_time=step_time)


def _same_run(a, b) -> None:
    strip = [{k: v for k, v in r.items() if k not in WALL} for r in a.history]
    assert strip == [{k: v for k, v in r.items() if k not in WALL} for r in b.history]
    assert a.final == b.final and a.bytes_sent == b.bytes_sent
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_one_node_eager_is_diloco_and_naive_is_not():
    # N = 1: Delta^(t-1) = Delta_1^(t-1), so D_1^(t) = Delta_1^(t): DiLoCo, bit for bit (AdamW
    # inner, Nesterov outer, H = 3, 9 steps, evaluated at each outer step)
    ref = _fit("diloco", n=1, steps=9, H=3, eval_interval=3)
    # (DiLoCo's outer learning rate: the eager form's default is lower)
    _same_run(_fit("diloco_eager", n=1, steps=9, H=3, eval_interval=3, outer_lr=0.7), ref)
    naive = _fit("diloco_eager", n=1, steps=9, H=3, eval_interval=3, eager=False,
                 outer_lr=0.7)
    assert naive.final != ref.final  # one round late even alone


@pytest.mark.parametrize("eager", [True, False])
def test_delay_zero_is_diloco_bit_for_bit(eager: bool):
    # 3 nodes with BatchNorm (buffers averaged with the pseudo-gradients), H = 2, 8 steps
    ref = _fit("diloco", n=3, steps=8, norm=True, H=2)
    ours = _fit("diloco_eager", n=3, steps=8, norm=True, H=2, delay=0, eager=eager,
                outer_lr=0.7)
    _same_run(ours, ref)
    assert ours.comm_log == ref.comm_log and not any(r.overlap for r in ours.comm_log)


# -- the clock -------------------------------------------------------------------------------------
@pytest.mark.parametrize("eager", [True, False])
def test_the_outer_all_reduce_runs_under_the_next_inner_phase(eager: bool):
    # 1 s of compute per step, H = 2: each all-reduce of the tiny model (T, well under 2 s on
    # home-100mbps) is hidden by the next phase, except the last, awaited at the end of the run.
    # DiLoCo waits T at each of its 4 outer steps.
    diloco = _fit("diloco", n=3, steps=8, H=2, network="home-100mbps", step_time=1.0)
    ours = _fit("diloco_eager", n=3, steps=8, H=2, eager=eager, network="home-100mbps",
                step_time=1.0)
    compute = 8.0
    assert diloco.clock.compute_s == ours.clock.compute_s == compute
    T = (diloco.clock.total_s - compute) / 4
    assert T > 0.0
    assert ours.clock.total_s == pytest.approx(compute + T, rel=1e-12)
    assert ours.clock.comm_s == pytest.approx(T, rel=1e-12)
    assert ours.bytes_sent == diloco.bytes_sent
    assert all(r.overlap for r in ours.comm_log) and make("diloco_eager", H=2).overlap_steps == 2


# -- the world -------------------------------------------------------------------------------------
def test_a_lost_outer_gradient_by_hand():
    # Prepare: N = 2, H = 1, inner SGD lr 0.1, outer SGD lr 1 (theta -= D); node 1's outer
    # gradient is lost at round 2.
    def run(strategy):
        nodes, comm = build(strategy, (1.0, 2.0))
        step_with(strategy, nodes, [[1.0, 0.0], [0.0, 2.0]], 0)  # Delta = [0.1, 0], [0, 0.2]
        comm.attendance.heard = Heard([True, False])
        comm.attendance.step = 1
        step_with(strategy, nodes, [[2.0, 0.0], [0.0, 4.0]], 1)  # Delta = [0.2, 0], [0, 0.4]
        comm.attendance.heard = None
        comm.attendance.step = 2
        step_with(strategy, nodes, [[0.0, 0.0], [0.0, 0.0]], 2)
        return nodes, comm

    outer = {"H": 1, "outer_optimizer": "sgd", "outer_lr": 1.0, "outer_momentum": 0.0,
             "optim": sgd(0.1)}
    eager = DiLoCoEager(**outer)
    nodes, comm = run(eager)
    # r1: D_m = Delta_m / 2 -> theta_0 = [0.95, 2], theta_1 = [1, 1.9]; mean D1 = [0.05, 0.1]
    # r2: mean over M2 = 1: D2 = [0.2, 0]. Node 0: D1 - [0.1, 0] / 2 + [0.2, 0] / 1 = [0.2, 0.1]
    #     -> theta_0 = [0.75, 1.9], restarts. Node 1 (not heard): D1 - [0, 0.2] / 2 = [0.05, 0]
    #     -> theta_1 = [0.95, 1.9]; keeps its parameters x_1 = [1, 1.5]
    # r3: node 1 sends theta_1 - x_1 = [-0.05, 0.4]; D3 = [-0.025, 0.2]. Node 0: D2 - [0.2, 0]
    #     / 1 + 0 = 0 -> [0.75, 1.9] = theta^(0) - D1 - D2. Node 1: D2 - 0 + [-0.05, 0.4] / 2
    #     = [0.175, 0.2] -> [0.775, 1.7] = theta^(0) - D1 - D2 - (its own share of D3)
    assert torch.allclose(nodes.params["w"], t([[0.75, 1.9], [0.775, 1.7]]), **TOL)
    assert comm.bytes_sent == [32.0, 32.0] and comm.log[1].members == 0b01
    assert eager.pending_recovery == []  # node 1 computed: it applied the mean itself

    naive = DiLoCoEager(eager=False, **outer)
    nodes, _ = run(naive)
    # r1: no step, both at [1, 2]. r2: D1 = [0.05, 0.1] -> theta = [0.95, 1.9]; node 0 restarts,
    # node 1 keeps x_1 = [1, 1.6]. r3: node 1 sends theta - x_1 = [-0.05, 0.3]; D2 = [0.2, 0]
    # -> theta = [0.75, 1.9], both restart
    assert torch.allclose(nodes.params["w"], t([[0.75, 1.9], [0.75, 1.9]]), **TOL)


def test_a_node_that_computed_nothing_is_recovered_with_the_donors_outer_state():
    # Eager, Nesterov, N = 2, H = 1, inner SGD without state: two rounds, node 1 down in the
    # second (it misses the mean the others apply: marked out of sync), then recovered
    s = DiLoCoEager(H=1, optim=sgd(0.1))
    nodes, comm = build(s, (1.0, 2.0))
    step_with(s, nodes, [[1.0, 0.0], [0.0, 2.0]], 0)
    comm.attendance.active = [True, False]
    step_with(s, nodes, [[2.0, 1.0], [0.0, 0.0]], 1)
    assert s.pending_recovery == [1] and s.outer_counts.tolist() == [2, 1]
    comm.attendance.active = None
    before = comm.bytes_received[1]
    s.recover(1, donor=0)
    # node 1: the donor's theta_0 (its parameters too), momentum, record of what it sent
    for tensor in (s.outer_params["w"], nodes.params["w"],
                   momentum(s.node_outer_opt, s.outer_params["w"]), s.sent[0][0]):
        assert torch.equal(tensor[1], tensor[0])
    assert s.outer_counts.tolist() == [2, 2]
    # bytes: the mean in flight (16) + theta_0 (16) + momentum (16) + sent record (16)
    assert comm.bytes_received[1] - before == 64.0

    naive = DiLoCoEager(H=1, eager=False, optim=sgd(0.1))
    nodes, comm = build(naive, (1.0, 2.0))
    step_with(naive, nodes, [[1.0, 0.0], [0.0, 2.0]], 0)
    step_with(naive, nodes, [[2.0, 1.0], [0.0, 0.0]], 1)
    with torch.no_grad():
        nodes.params["w"][1].fill_(7.0)
    before = comm.bytes_received[1]
    naive.recover(1, donor=0)
    assert torch.equal(nodes.params["w"][1], naive.global_state()["w"])
    # global w (16) + outer momentum (16) + the mean in flight (16)
    assert comm.bytes_received[1] - before == 48.0


# -- checkpoints -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("overrides", "norm", "world"), [
    ({"eager": False, "H": 3}, False, None),  # checkpoint mid-phase, a mean in flight
    ({"delay": 2, "H": 2}, True, None),  # two means in flight, BatchNorm
    ({"H": 3}, False, "drop=0.3,seed=2"),  # lost messages
], ids=["naive", "delay2-bn", "eager-drop"])
def test_a_run_resumes_bit_for_bit(tmp_path: Path, overrides: dict[str, Any], norm: bool,
                                   world: str | None) -> None:
    def fit(**kw: Any):
        torch.manual_seed(1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return Trainer(Net(norm=norm), data(), data()).fit(
                progress=False, **kw)

    full, cut = tmp_path / "full", tmp_path / "cut"
    fit(strategy=make("diloco_eager", **overrides), num_nodes=3, max_steps=8, batch_size=8,
        log_interval=1, eval_interval=2, eval_samples=40, network="home-100mbps",
        step_time=0.01, seed=5, world=world, out_dir=full, checkpoint_every=4,
        keep_checkpoints=3)
    shutil.copytree(full, cut)  # as a run killed after its checkpoint at step 4
    shutil.rmtree(cut / "checkpoints" / f"step-{8:08d}")
    (cut / "summary.json").unlink()
    fit(resume=cut)
    assert run_rows(cut) == run_rows(full) and run_summary(cut) == run_summary(full)
    assert_same_state(load_checkpoint(full)[0], load_checkpoint(cut)[0], "state")


# -- configuration ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"delay": -1}, "delay must be an integer >= 0"),
    ({"delay": True}, "delay must be an integer >= 0"),
    ({"eager": 1}, "eager must be True or False"),
])
def test_invalid_hyperparameters_are_errors(kwargs: dict[str, Any], match: str):
    with pytest.raises(ValueError, match=match):
        DiLoCoEager(**kwargs)


def test_cli_overrides():
    s = make("diloco_eager", delay="2", eager="false", H="30")
    assert (s.delay, s.eager, s.H, s.overlap_steps) == (2, False, 30, 60)
    assert make("diloco_eager", delay="0").overlap_steps is None
    with pytest.raises(ConfigError):
        make("diloco_eager", delays="2")
