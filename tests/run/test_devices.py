"""exogym on a device: the engines, bf16, gradient accumulation, paging to host memory, a checkpoint
written and resumed, two processes; on ``EXOGYM_TEST_DEVICE`` (default ``cpu``).

The suite runs these on the CPU. ``bench/gpu_check.py`` runs them on a GPU
(``EXOGYM_TEST_DEVICE=cuda python -m pytest -m cuda tests/run/test_devices.py``), where exogym's
CUDA paths (vmap's batched kernels, cuDNN, fused CUDA AdamW, the CUDA generator in a checkpoint,
pinned host pages, nccl) run and nothing else ever runs them.

Tolerances (float32; TF32 is switched off on CUDA for these tests, see :func:`no_tf32`):

- :data:`ENGINE_TOL`, two engines on one device: the same math, batched otherwise (vmap's grouped
  convolution, batched matrix products), so sums run in another order: measured 3e-8 on the
  parameters after 6 AdamW steps on the CPU; 1e-5 leaves a margin of about 300.
- :data:`DEVICE_TOL`, CUDA against the CPU: other kernels (cuDNN, cuBLAS, CUDA's fused AdamW)
  round each operation otherwise, a few float32 ulps through the forward and backward; AdamW
  moves a parameter by at most lr = 1e-3 a step, and 1e-4 is a tenth of that.
- paging and resuming on one device: bit for bit on the CPU (tests/run/test_paging.py,
  tests/run/test_resume.py). On CUDA :data:`SAME_RUN_TOL`: some CUDA backward kernels accumulate
  with atomics in any order (``torch.use_deterministic_algorithms``' list), so two runs of the
  same step may differ in the last bits.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from support.scripts import ROOT
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from exogym.run.launch import fit_processes
from exogym.run.nodes.paging import PageStore
from exogym.run.output.checkpoint import checkpoint_steps
from exogym.run.trainer import Trainer
from exogym.sim.engine import NodeStack
from exogym.strategy import make

DEVICE = torch.device(os.environ.get("EXOGYM_TEST_DEVICE", "cpu"))
if DEVICE.type == "cuda" and not torch.cuda.is_available():
    raise RuntimeError("EXOGYM_TEST_DEVICE=cuda, but torch.cuda.is_available() is False")
CUDA = DEVICE.type == "cuda"
ENGINES = ("loop", "vmap") if CUDA else ("loop", "vmap", "threads")  # threads: CPU only
ENGINE_TOL = {"atol": 1e-5, "rtol": 1e-5}
DEVICE_TOL = {"atol": 1e-4, "rtol": 1e-4}
SAME_RUN_TOL = {"atol": 1e-6, "rtol": 1e-6} if CUDA else {"atol": 0.0, "rtol": 0.0}
WALL = ("wall_s",)
SCRIPT = ROOT / "bench" / "gpu_check.py"

pytestmark = pytest.mark.usefixtures("single_thread", "no_tf32")


@pytest.fixture
def no_tf32() -> Iterator[None]:
    """TF32 off on CUDA: it keeps 10 bits of a float32's mantissa in matrix products and
    convolutions, and two engines' kernels (other cuDNN algorithms) would then differ by 1e-3,
    hiding what these tests compare. The previous settings are restored."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class Net(nn.Module):
    """Convolution -> BatchNorm -> ReLU -> dropout -> Linear on 1 x 6 x 6 images: cuDNN on a GPU,
    float and integer buffers, and (``drop > 0``) the device's generator. The convolution has no
    bias: BatchNorm removes it, and AdamW would turn its round-off-sized gradient into whole
    steps of either sign."""

    def __init__(self, drop: float = 0.0, norm: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, bias=not norm)
        self.norm = nn.BatchNorm2d(4) if norm else nn.Identity()
        self.drop = nn.Dropout(drop)
        self.fc = nn.Linear(4 * 4 * 4, 3)

    def forward(self, batch: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        x, y = batch
        logits = self.fc(self.drop(F.relu(self.norm(self.conv(x)))).flatten(1))
        return {"loss": F.cross_entropy(logits, y),
                "accuracy": (logits.argmax(-1) == y).float().mean()}


def net(**kw: Any) -> Net:
    torch.manual_seed(1)
    return Net(**kw)


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 1, 6, 6, generator=g)
    return TensorDataset(x, x.flatten(1)[:, :3].argmax(1))


def fit(sid: str, engine: str, device: torch.device | str = DEVICE, *, model: Net | None = None,
        lr: float = 1e-3, **kw: Any) -> Any:
    """A 6-step run of 4 nodes, batch 4, AdamW at ``lr`` (DiLoCo: H = 2, three rounds)."""
    args: dict[str, Any] = dict(num_nodes=4, max_steps=6, batch_size=4, log_interval=1,
                                engine=engine, device=device, seed=0, progress=False,
                                network=None)
    args.update(kw)
    strategy = make(sid, **{"optim.lr": lr, **({"H": 2} if sid == "diloco" else {})})
    return Trainer(model or net(), data()).fit(strategy=strategy, **args)


def losses(result: Any) -> list[float]:
    return [r["train_loss"] for r in result.history]


def assert_same_run(a: Any, b: Any, tol: dict[str, float]) -> None:
    """Every row (wall times aside) and the final model of two runs agree within ``tol``."""
    rows_a = [{k: v for k, v in r.items() if k not in WALL} for r in a.history]
    rows_b = [{k: v for k, v in r.items() if k not in WALL} for r in b.history]
    assert [sorted(r) for r in rows_a] == [sorted(r) for r in rows_b]
    for ra, rb in zip(rows_a, rows_b, strict=True):
        for k, v in ra.items():
            if isinstance(v, float):
                torch.testing.assert_close(rb[k], v, **tol, msg=f"step {ra['step']} {k}")
            else:
                assert rb[k] == v, (ra["step"], k)
    ma, mb = a.model.state_dict(), b.model.state_dict()
    assert ma.keys() == mb.keys()
    for k in ma:
        torch.testing.assert_close(mb[k].cpu(), ma[k].cpu(), **tol, msg=k)


@pytest.mark.cuda
@pytest.mark.parametrize("sid", ["ddp", "diloco"])
def test_the_engines_agree_on_the_device_and_with_the_cpu(sid: str) -> None:
    loop = fit(sid, "loop")
    for engine in ENGINES[1:]:
        other = fit(sid, engine)
        assert other.engine == engine  # no fallback to the loop
        assert_same_run(loop, other, ENGINE_TOL)
    assert_same_run(fit(sid, "loop", "cpu"), loop, DEVICE_TOL)


@pytest.mark.cuda
@pytest.mark.parametrize("engine", ENGINES[:2])
def test_bf16_on_the_device(engine: str) -> None:
    # One step's losses: bf16 keeps 8 bits of mantissa (2e-3 relative a rounding), a few roundings
    # deep in this net; 2e-2 as in tests/sim/test_accumulation.py. Weights, gradients, losses: fp32.
    x, y = (t.view(4, 24, *t.shape[1:]) for t in data().tensors)
    fp32 = NodeStack(net(norm=False), 4, device=DEVICE, engine=engine)  # type: ignore[arg-type]
    bf16 = NodeStack(net(norm=False), 4, device=DEVICE, engine=engine,  # type: ignore[arg-type]
                     precision="bf16")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = bf16.forward_backward(bf16.to_batch_device((x, y)))
    assert not [w for w in caught if "autocast" in str(w.message)]  # it disables itself so
    want = fp32.forward_backward(fp32.to_batch_device((x, y)))
    assert got.dtype == torch.float32 and got.device.type == DEVICE.type
    assert 0 < ((got - want).abs() / want).max().item() < 2e-2
    assert all(g.dtype == torch.float32 for g in bf16.grads.values())
    # A run: bf16 trains (the mean loss of its last 4 steps below that of its first 4).
    got_losses = losses(fit("diloco", engine, precision="bf16", max_steps=12, lr=0.05))
    assert all(torch.isfinite(torch.tensor(got_losses)))
    assert sum(got_losses[-4:]) < sum(got_losses[:4])


@pytest.mark.cuda
@pytest.mark.parametrize("engine", ENGINES[:2])
def test_gradient_accumulation_on_the_device(engine: str) -> None:
    # Micro-batches of 5, 5 and 2 rows sum (b_k / B) loss_k where one pass takes the batch's mean:
    # a few float32 ulps apart, within ENGINE_TOL. No BatchNorm: it normalises each micro-batch.
    x, y = (t[:36].view(3, 12, *t.shape[1:]) for t in data().tensors)
    runs = []
    for m in (None, 5):
        nodes = NodeStack(net(norm=False), 3, device=DEVICE,
                          engine=engine, micro_batch_size=m)  # type: ignore[arg-type]
        runs.append((nodes.forward_backward(nodes.to_batch_device((x, y))), nodes.grads))
    (whole, whole_grads), (split, split_grads) = runs
    torch.testing.assert_close(split, whole, **ENGINE_TOL)
    for k, g in whole_grads.items():
        assert g.device.type == DEVICE.type
        torch.testing.assert_close(split_grads[k], g, **ENGINE_TOL, msg=k)


@pytest.mark.cuda
def test_paging_to_host_memory_on_the_device() -> None:
    # Groups of 8 nodes (tests/run/test_paging.py: on the CPU the fused kernels then compute every
    # element by the same code as in memory, bit for bit).
    kw: dict[str, Any] = dict(num_nodes=16, max_steps=6, step_time="1ms")
    in_memory = fit("diloco", "loop", **kw)
    paged = fit("diloco", "loop", resident=8, offload="host", **kw)
    assert in_memory.paging is None and paged.paging is not None
    # every step reads every group back: at least 6 steps x 16 nodes' fp32 parameters
    params = sum(p.numel() for p in net().parameters())
    assert paged.paging["bytes_read"] >= 6 * 16 * params * 4
    assert_same_run(in_memory, paged, SAME_RUN_TOL)


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["host", "disk"])
def test_a_page_store_gives_back_device_storages(kind: str, tmp_path: Path) -> None:
    folder = tmp_path if kind == "disk" else None
    store = PageStore(kind, folder, device=DEVICE)  # type: ignore[arg-type]
    tensors = [torch.arange(1000.0, device=DEVICE), torch.arange(7, device=DEVICE)]
    want = [t.clone() for t in tensors]
    storages = [t.untyped_storage() for t in tensors]
    sizes = [s.nbytes() for s in storages]
    store.save(0, storages)
    if kind == "host" and CUDA:  # so that the copies to and from the GPU can be asynchronous
        assert store._host[0].is_pinned()
    for s in storages:
        s.resize_(0)
    store.load(0, storages, sizes)
    for t, w in zip(tensors, want, strict=True):
        assert t.device.type == DEVICE.type and torch.equal(t, w)
    assert store.bytes_read == store.bytes_written == sum(sizes)
    store.close()


@pytest.mark.cuda
@pytest.mark.parametrize("engine", ENGINES[:2])
def test_a_checkpoint_written_on_the_device_resumes(engine: str, tmp_path: Path) -> None:
    # Dropout draws from the device's generator: its state is in the checkpoint.
    full, cut = tmp_path / "full", tmp_path / "cut"
    kw: dict[str, Any] = dict(max_steps=8, checkpoint_every=4, async_checkpoint=False)
    first = fit("diloco", engine, model=net(drop=0.3), out_dir=full, **kw)
    assert checkpoint_steps(full)[:2] == [8, 4]
    shutil.copytree(full, cut)  # as a run killed after its checkpoint at step 4 leaves it
    shutil.rmtree(cut / "checkpoints" / f"step-{8:08d}")
    (cut / "summary.json").unlink()
    resumed = Trainer(net(drop=0.3), data()).fit(resume=cut, progress=False)
    assert resumed.resumed_from is not None and resumed.resumed_from["step"] == 4
    assert_same_run(first, resumed, SAME_RUN_TOL)
    # the dropout was real: without it the run differs
    assert losses(fit("diloco", engine, max_steps=8))[-1] != losses(first)[-1]


@pytest.mark.cuda
@pytest.mark.skipif(DEVICE.type == "cpu" and "EXOGYM_TEST_DEVICE" not in os.environ,
                    reason="tests/run/test_dist.py runs gloo processes on the CPU; "
                           "bench/gpu_check.py runs this one")
def test_two_processes_give_the_simulators_numbers() -> None:
    # nccl with a GPU per process where there are 2; else gloo, whose processes compute on the
    # CPU. Each against the simulator on the processes' device: the all-reduce sums in another
    # order than the simulator's mean, round-off within ENGINE_TOL.
    nccl = CUDA and torch.cuda.device_count() >= 2
    got = fit_processes(net(), data(), None, strategy=make("diloco", H=2), num_nodes=2,
                        backend="nccl" if nccl else "gloo", threads=1, timeout_s=120.0,
                        max_steps=6, batch_size=4, log_interval=1, engine="loop", seed=0,
                        progress=False, network=None)
    want = fit("diloco", "loop", DEVICE if nccl else "cpu", num_nodes=2)
    assert got.processes == 2 and got.bytes_sent == want.bytes_sent
    assert_same_run(want, got, ENGINE_TOL)


@pytest.mark.slow  # keeps the default suite under 10 min on 2 cores; CI's slow step runs it
def test_the_gpu_check_runs_on_the_cpu(tmp_path: Path) -> None:
    """``bench/gpu_check.py --device cpu --quick``, as CI runs it so that it never rots: its
    device tests pass and its JSON holds every part's numbers."""
    import json

    if os.environ.get("EXOGYM_GPU_CHECK"):
        pytest.skip("inside bench/gpu_check.py's own test run")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("OUT", None)
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=300, env=env,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["device"]["type"] == "cpu" and report["torch"] == torch.__version__
    tests = report["tests"]
    assert tests["failed"] == tests["errors"] == 0 and tests["passed"] >= 10
    cells = report["engines"]
    assert {c["model"] for c in cells} == {"mnist_cnn", "gpt", "nanogpt"}
    for cell in cells:
        assert set(cell["sides"]) == {"plain", "loop", "threads", "vmap"}, cell
        for side in cell["sides"].values():
            assert side["error"] is None and side["samples_per_s"] > 0, cell
    paging = report["paging"]
    assert paging["paged"]["samples_per_s"] > 0 and 0 < paging["paged"]["paging_share"] < 1
    assert set(report["goals"]) == {"device_tests", "nanogpt_diloco_vs_plain",
                                    "vmap_vs_loop_mnist", "paging_host_vs_memory"}
    for goal in report["goals"].values():
        assert isinstance(goal["met"], bool) and goal["value"] > 0
    assert "| mnist_cnn |" in done.stdout  # the table
