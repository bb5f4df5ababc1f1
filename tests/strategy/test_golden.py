"""Golden trajectories (torchft's regression tests; STYLE point 8c): every strategy's numbers on a
tiny fixed run, recorded in ``tests/strategy/golden/trajectories.json``, must not change unless a
change means to change them, on any machine.

The runs are in float64: data, initial weights (drawn in float64: float32 draws differ between
ATen's kernels, data by up to 4e-5), every strategy's state, MuLoCo's Newton-Schulz iteration
(``optim.muon_ns_dtype=fp64``). The summation orders that differ between CPUs, kernel choices
(``ATEN_CPU_CAPABILITY``, MKL's code paths) and thread counts then move a number by float64
rounding errors (1.1e-16 each), not float32 ones (6e-8). What is compared (:data:`TOLERANCES`):

- ``counts``: steps, logged steps, bytes sent and received per node (floats where a ring's share
  divides, the same Python arithmetic everywhere), collectives, world events, an asynchronous
  run's per-node steps and staleness: exactly. They follow from the schedule and tensor sizes.
- ``sim_time_s``: the simulated clock's total, computed from bytes, the network and the given
  ``step_time`` only: within 1e-9 relative.
- ``model``: per tensor of the final state dict, the sum, the sum of squares and the elements at
  flat indices 0, n//2 and n-1 (integer tensors: the values, exactly): within 1e-8 relative plus
  1e-12 absolute (for sums near zero). Measured over kernel choices and thread counts: at most
  1.7e-13 relative; the mildest mutation of ``bench/golden_mutations.py`` moves a number 3,000
  times the tolerance (docs/design/golden.md).
- ``metrics``: the logged train losses, eval losses and accuracies, and the final evaluation:
  within 5e-7 relative. The engine accumulates these in float32 whatever the model's dtype
  (``RunState.loss_sum`` and ``_evaluate``'s ``.float()`` in ``exogym/run/loop/run.py``): a float64
  drift of 1e-13 can, rarely, flip one float32 rounding; 5e-7 is four float32 ulps.

``EXOGYM_GOLDEN_THREADS`` (default 1) sets the intra-op threads of the runs.

Regenerate (and review the diff) with ``EXOGYM_REGEN_GOLDEN=1 python -m pytest
tests/strategy/test_golden.py``; ``-k desloc`` rewrites only ``desloc/loop`` and ``desloc/vmap``. A
strategy missing from the file is skipped, saying so.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from support.resume_cases import Labelled, Net
from support.runs import small
from torch import nn
from torch.utils.data import TensorDataset

from exogym import Trainer
from exogym.sim.threads import intra_op_threads
from exogym.strategy import make, registry

GOLDEN = Path(__file__).resolve().parent / "golden" / "trajectories.json"
REGEN = os.environ.get("EXOGYM_REGEN_GOLDEN") == "1"
ENGINES = ("loop", "vmap")

# section of a record -> (relative, absolute) tolerance; the module docstring says why.
TOLERANCES: dict[str, tuple[float, float]] = {
    "counts": (0.0, 0.0),
    "sim_time_s": (1e-9, 0.0),
    "model": (1e-8, 1e-12),
    "metrics": (5e-7, 0.0),
}


def golden_threads() -> int:
    """The intra-op thread count of the golden runs: ``EXOGYM_GOLDEN_THREADS``, default 1."""
    raw = os.environ.get("EXOGYM_GOLDEN_THREADS", "1")
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"EXOGYM_GOLDEN_THREADS must be a positive integer, got {raw!r}")
    return int(raw)


@pytest.fixture
def threads() -> Iterator[None]:
    """The runs on :func:`golden_threads` intra-op threads; the previous count is restored."""
    with intra_op_threads(golden_threads()):
        yield


def golden_data() -> TensorDataset:
    """resume_cases' data, drawn in float64 (float32 ``randn`` differs between ATen's kernels)."""
    x = torch.randn(120, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return Labelled(x, x[:, :3].argmax(1))


def golden_model() -> nn.Module:
    """resume_cases' ``Net`` with BatchNorm and dropout, initialised in float64, without the
    first layer's bias. That bias feeds BatchNorm, which subtracts its batch mean: its gradient
    is zero in exact arithmetic and rounding noise in floats, noise that normalising (Adam's
    ``m / sqrt(v)``, FedProx) and sign (DeMo) updates turn into steps of the learning rate's
    size, different on every machine (measured: up to 6% of the bias after 8 steps)."""
    torch.manual_seed(1)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # float32 initial draws differ between kernels too
    try:
        net = Net(norm=True, drop=True)
    finally:
        torch.set_default_dtype(before)
    net.body[0].bias = None  # type: ignore[assignment]
    return net


def overrides(sid: str) -> dict[str, Any]:
    """``exogym check``'s short periods, and Muon's Newton-Schulz in float64 (its default,
    float32, would put float32 products, and their kernel-dependent sums, into the run)."""
    out = dict(small(sid))
    if make(sid, **out).optim.name == "muon":
        out["optim.muon_ns_dtype"] = "fp64"
    return out


def _summary(t: torch.Tensor) -> dict[str, Any]:
    flat = t.detach().cpu().reshape(-1)
    if not flat.is_floating_point():
        return {"values": flat.tolist()}
    n = flat.numel()
    return {"sum": flat.sum().item(), "sum_sq": (flat * flat).sum().item(),
            "at": [flat[i].item() for i in sorted({0, n // 2, n - 1})]}


def trajectory(sid: str, engine: str) -> dict[str, Any]:
    """A tiny 3-node float64 run with BatchNorm and dropout (randomness and buffers), on a
    network, as the record the golden file holds (after a JSON round trip)."""
    result = Trainer(golden_model(), golden_data(), golden_data()).fit(
        strategy=make(sid, **overrides(sid)), num_nodes=3, max_steps=8, batch_size=8,
        log_interval=2, eval_interval=4, eval_samples=40, engine=engine, seed=7,
        network="home-100mbps", step_time=0.01, progress=False)
    rows = result.history
    record = {
        "counts": {
            "steps": result.steps, "logged_steps": [r["step"] for r in rows],
            "bytes_sent": result.bytes_sent, "bytes_received": result.bytes_received,
            "collectives": len(result.comm_log), "events": len(result.events),
            "asynchronous": result.asynchronous,
        },
        "sim_time_s": result.clock.total_s if result.clock else None,
        "metrics": {
            "train_loss": [r["train_loss"] for r in rows],
            "eval_loss": [r.get("eval_loss") for r in rows],
            "eval_accuracy": [r.get("eval_accuracy") for r in rows],
            "final": result.final,
        },
        "model": {k: _summary(v) for k, v in result.model.state_dict().items()},
    }
    return json.loads(json.dumps(record))  # exactly what the file holds


def _leaves(got: Any, want: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    """``(path, got, want)`` for every leaf; a shape mismatch is a leaf of its own."""
    if isinstance(want, dict) and isinstance(got, dict) and got.keys() == want.keys():
        for k in want:
            yield from _leaves(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list) and isinstance(got, list) and len(got) == len(want):
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            yield from _leaves(g, w, f"{path}[{i}]")
    else:
        yield path, got, want


def deviations(got: dict[str, Any], want: dict[str, Any]) -> list[tuple[float, str, Any, Any]]:
    """``(deviation, path, got, want)`` for every leaf of two records, the deviation in units of
    the leaf's tolerance (:data:`TOLERANCES`): above 1 fails. Exact leaves (integers, None, the
    ``counts``) and mismatched types or shapes deviate by 0 or infinity."""
    if got.keys() != want.keys():
        return [(float("inf"), "<sections>", sorted(got), sorted(want))]
    out = []
    for section, (rtol, atol) in TOLERANCES.items():
        for path, g, w in _leaves(got[section], want[section], section):
            bound = atol + rtol * abs(w) if isinstance(w, float) else 0.0
            if g == w and type(g) is type(w):
                out.append((0.0, path, g, w))
            elif isinstance(g, float) and bound > 0.0:
                out.append((abs(g - w) / bound, path, g, w))
            else:
                out.append((float("inf"), path, g, w))
    return out


def relative(got: dict[str, Any], want: dict[str, Any], section: str) -> float:
    """The largest ``|got - want| / |want|`` over one section's float leaves (0 for 0 == 0)."""
    worst = 0.0
    for _path, g, w in _leaves(got[section], want[section], section):
        if isinstance(g, float) and isinstance(w, float) and g != w:
            worst = max(worst, abs(g - w) / abs(w) if w else float("inf"))
    return worst


def mismatches(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """Lines naming every leaf outside its tolerance, worst first (empty: the records agree)."""
    bad = sorted((d for d in deviations(got, want) if d[0] > 1.0), key=lambda d: -d[0])
    return [f"{p}: got {g!r}, golden {w!r} ({d:.3g} x tolerance)" for d, p, g, w in bad]


def load() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("sid", registry())
def test_golden_trajectory(sid: str, engine: str, threads: None) -> None:
    key = f"{sid}/{engine}"
    got = trajectory(sid, engine)
    golden = load()
    if REGEN:  # this key only: `-k desloc` leaves every other strategy's record as it was
        golden[key] = got
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        return
    if key not in golden:
        pytest.skip(f"{key} has no golden trajectory yet: record it with EXOGYM_REGEN_GOLDEN=1")
    bad = mismatches(got, golden[key])
    assert not bad, f"{key}: {len(bad)} numbers off their golden values:\n" + "\n".join(bad[:15])


def test_the_file_holds_only_registered_strategies() -> None:
    stale = sorted(set(load()) - {f"{s}/{e}" for s in registry() for e in ENGINES})
    assert not stale, f"golden records of no registered strategy and engine: {stale}"


def test_the_comparison_fails_outside_each_tolerance() -> None:
    want = {"counts": {"bytes_sent": [920.0], "events": 0}, "sim_time_s": 0.25,
            "metrics": {"eval_loss": [None, 1.0]}, "model": {"w": {"sum": 0.0, "at": [0.5]}}}

    def moved(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
        got = json.loads(json.dumps(want))
        node = got
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        return got

    assert not mismatches(want, want)
    inside = [(("counts", "bytes_sent", 0), 920.0), (("sim_time_s",), 0.25 * (1 + 9e-10)),
              (("metrics", "eval_loss", 1), 1.0 + 4e-7), (("model", "w", "sum"), 9e-13),
              (("model", "w", "at", 0), 0.5 * (1 + 9e-9))]
    for path, value in inside:
        assert not mismatches(moved(path, value), want), path
    outside = [(("counts", "bytes_sent", 0), 921.0), (("counts", "events"), 1.0),
               (("sim_time_s",), 0.25 * (1 + 2e-9)), (("metrics", "eval_loss", 1), 1.0 + 6e-7),
               (("metrics", "eval_loss", 0), 1.0), (("model", "w", "sum"), 2e-12),
               (("model", "w", "at", 0), 0.5 * (1 + 2e-8)), (("model", "w", "at"), [0.5, 0.5])]
    for path, value in outside:
        assert mismatches(moved(path, value), want), path
