"""``exogym check``: the registry's conformance tests, run against any strategy in seconds.

Gymnasium's ``check_env`` for strategies. Each check trains a tiny classifier (6 -> 8 -> 3, 96
samples) on 3 nodes for 6 steps on the CPU and says pass, fail (with the reason) or skipped (with
why). What each one checks:

- ``builds``: the strategy builds from its defaults plus the given settings.
- ``runs``: 6 steps run; every logged training loss and the final evaluation are finite.
- ``communicates``: it ran at least one collective in 6 steps (a method that never synchronises
  is no distributed method; give a shorter period with ``--set``), and each node's bytes sent
  equal what its logged collectives imply (ring all-reduce ``2(M-1)/M * S`` per member, all-gather
  ``(M-1) * S``, a broadcast's source ``(M-1) * S``, a send's or push's ``S``), and ``step``
  never reads the node mean (``node_mean_state()``, ``comm.mean_rows``: evaluation's, not
  traffic, so an average made with it inside ``step`` is free and uncounted).
- ``deterministic``: the same seed gives the same metrics rows (but the wall clock), bytes and
  final parameters, bit for bit.
- ``seeds differ``: another seed gives other training losses.
- ``engines``: the loop, vmap and threads engines agree to 1e-6 in float64, with the same bytes.
- ``exact resume``: 3 steps, a checkpoint, a fresh trainer resuming to 6 steps gives the metrics
  rows and final parameters of 6 straight steps, bit for bit.
- ``processes``: 2 nodes as 2 real processes (gloo) give the in-process parameters to 1e-6
  (``processes=False`` skips it; asynchronous strategies run in one process by design).
- ``absent nodes``: node 1 fails at step 2 and rejoins at step 4 (a world, on home-100mbps): the
  run finishes with finite numbers and the node is recovered from a live peer; and the same run
  with node 1's parameters + 1000 from its first step down gives the same training losses and
  final model, bit for bit: what a down node holds never reaches the others (a strategy that
  reduces over every node instead of ``members=self.arrivals()`` fails). Asynchronous
  strategies refuse failures by design: skipped.
- Each failure names what differed and its likely cause (``processes``: a row read or written
  across nodes without the communicator).
- ``hyperparameters``: every field is documented (an ``Attributes:`` entry of the class
  docstring) and a misspelled key is an error.
- ``no host sync``: ``step`` reads no floating-point tensor on the host (``item``, ``tolist``,
  ``numpy``, ``bool``, ``cpu``, ``to("cpu")``), recorded by a torch function mode around every
  ``step`` call. On a GPU each such read stalls the device; on this CPU-only check it is a
  heuristic: integer and boolean tensors are allowed, and so are reads made by torch's own code
  (its optimizers keep their step counts on the CPU), by the simulator and run loop, and by the
  masked optimizer step (its per-node step counts live on the CPU); reads in the strategy's own
  code count.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.data import TensorDataset

from exogym import strategy as strategies
from exogym.sim.comm import CommRecord, Communicator, all_gather_bytes, all_reduce_bytes
from exogym.strategy.base import StackedStrategy
from exogym.strategy.server import ServerStrategy
from exogym.utils.config import ConfigError, config_fields

if TYPE_CHECKING:
    from exogym.run.output.result import FitResult

__all__ = [
    "CHECKS",
    "CheckResult",
    "TinyNet",
    "check_strategy",
    "implied_bytes_sent",
    "render",
    "short_period",
    "tiny_data",
]

CHECKS = ("builds", "runs", "communicates", "deterministic", "seeds differ", "engines",
          "exact resume", "processes", "absent nodes", "hyperparameters", "no host sync")
NODES, STEPS = 3, 6


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: ``passed`` True, False, or None when skipped; ``detail`` says why."""

    name: str
    passed: bool | None
    detail: str = ""


class TinyNet(nn.Module):
    """The checks' model: a tiny classifier returning a scalar loss; no randomness, so engines
    must agree."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.body(x), y)


def tiny_data(dtype: torch.dtype = torch.float32) -> TensorDataset:
    """The checks' data: 96 seeded points of 6 features, 3 classes."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 6, generator=g, dtype=dtype)
    return TensorDataset(x, x[:, :3].argmax(1))


def implied_bytes_sent(log: Sequence[CommRecord], num_nodes: int) -> list[float]:
    """Each node's bytes sent as the ring formulas give them from a communicator's log."""
    sent = [0.0] * num_nodes
    for r in log:
        ids = r.member_ids(num_nodes)
        m = len(ids)
        if r.op == "all_reduce":
            for i in ids:
                sent[i] += all_reduce_bytes(r.payload_bytes, m)
        elif r.op == "all_gather":
            for i in ids:
                sent[i] += all_gather_bytes(r.payload_bytes, m)
        elif r.op == "broadcast":
            sent[r.src] += float((m - 1) * r.payload_bytes)
        elif r.op in ("send", "push"):
            if r.src >= 0:  # (src -1: a download, the server sends it)
                sent[r.src] += float(r.payload_bytes)
        elif r.op != "pull":  # the server sends a pull
            raise ValueError(f"unknown collective {r.op!r} in the log")
    return sent


class _HostReads(TorchFunctionMode):
    """Records reads of floating-point tensors on the host."""

    READS = frozenset({torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy,
                       torch.Tensor.__bool__, torch.Tensor.cpu, torch.Tensor.__float__})

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        target = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if target is not None and target.is_floating_point():
            to_cpu = func is torch.Tensor.to and any(
                str(a) == "cpu" for a in (*args[1:], kwargs.get("device")) if a is not None)
            if (func in self.READS or to_cpu) and not _trusted():
                name = getattr(func, "__name__", str(func))
                self.seen.append(f"{name} of a {tuple(target.shape)} {target.dtype} tensor")
        return func(*args, **kwargs)


_EXOGYM = Path(__file__).resolve().parents[1]
# Code whose host reads are of CPU-resident bookkeeping by design: torch's (its optimizers keep
# their step counts on the CPU), exogym's machinery (the simulator, the run loop) and the masked
# optimizer step (per-node step counts on the CPU).
_TRUSTED = (str(Path(torch.__file__).resolve().parent), str(_EXOGYM / "sim"),
            str(_EXOGYM / "run"), str(_EXOGYM / "strategy" / "masked.py"))


def _trusted() -> bool:
    """Whether the read was made by trusted code (:data:`_TRUSTED`); reads by a strategy's own
    code (a user's, or exogym's strategy modules) count."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(_TRUSTED)


def check_strategy(
    spec: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    processes: bool = True,
) -> list[CheckResult]:
    """Run every check of :data:`CHECKS` against the strategy ``spec`` (a registry id,
    ``path/file.py:Class`` or ``module:Class``) with ``overrides`` (``--set`` keys); never
    raises for a failing strategy: each failure is a :class:`CheckResult` with its reason.
    ``overrides`` default to a period of 2 steps (``H=2``) where the strategy has an ``H``.

    Returns:
        One result per check, in the order of :data:`CHECKS`; a strategy that does not build
        or run has the checks after that one skipped.

    Raises:
        ConfigError: an unknown strategy, a file that does not exist, an unknown setting.
    """
    results: list[CheckResult] = []
    cls = strategies.get(spec)  # an unknown id or a missing file is the caller's error
    settings = dict(overrides) if overrides is not None else short_period(cls)
    keys = config_fields(cls)
    unknown = [k for k in settings if k not in keys]
    if unknown:
        raise ConfigError(f"{spec}: unknown setting(s) {', '.join(unknown)}; its keys: "
                          f"{', '.join(keys)}")
    try:
        strategies.make(spec, **settings)
    except Exception as err:  # a broken class: report, do not crash the report
        results.append(CheckResult("builds", False, str(err) if isinstance(err, ConfigError)
                                   else _reason(err)))
        return results + [CheckResult(n, None, "it does not build") for n in CHECKS[1:]]
    results.append(CheckResult("builds", True, _settings_text(settings)))
    runs = _Runs(spec, cls, settings)
    base = _attempt(results, "runs", runs.fit)
    if base is None:
        return results + [CheckResult(n, None, "it does not run") for n in CHECKS[2:]]
    results[-1] = _finite_run(base)
    results.append(_communicates(base, runs.free_reads()))
    _compare(results, "deterministic", lambda: _same(base, runs.fit()), "seed 0 twice: equal")
    other = _attempt(results, "seeds differ", lambda: runs.fit(seed=1))
    if other is not None:
        differ = [r["train_loss"] for r in other.history] != [r["train_loss"] for r in base.history]
        results[-1] = (CheckResult("seeds differ", True, "seeds 0 and 1 give other losses")
                       if differ else _failed("seeds differ",
                                              "seeds 0 and 1 give the same losses"))
    _compare(results, "engines", runs.engines, "loop == vmap == threads to 1e-6 (float64)")
    _compare(results, "exact resume", runs.resume, "3 + 3 steps == 6 steps, bit for bit")
    asynchronous = issubclass(cls, ServerStrategy)
    if asynchronous:
        results.append(CheckResult("processes", None, "asynchronous: one process by design"))
    elif not processes:
        results.append(CheckResult("processes", None, "not asked for"))
    else:
        _compare(results, "processes", runs.processes, "2 processes == in-process to 1e-6")
    if asynchronous:
        results.append(CheckResult("absent nodes", None, "asynchronous: failures are refused"))
    else:
        _compare(results, "absent nodes", runs.absent, "node 1 down at steps 2-3, recovered")
    _compare(results, "hyperparameters", runs.hyperparameters,
             "all documented; a typo is an error")
    _compare(results, "no host sync", runs.host_reads, "no floating-point tensor read on the host")
    return results


def _finite_run(base: FitResult) -> CheckResult:
    """``runs``: passed when every logged training loss and the final evaluation are finite."""
    losses = [r["train_loss"] for r in base.history if "train_loss" in r]
    finals = list(base.final.values())
    if not all(math.isfinite(x) for x in losses + finals):
        return _failed("runs", f"non-finite numbers: losses {losses}, final {base.final}")
    return CheckResult("runs", True, f"final eval loss {base.final['eval_loss']:.4f}")


def _communicates(base: FitResult, free: int = 0) -> CheckResult:
    """``communicates``: passed when the run logged a collective, each node's bytes sent equal
    what its logged collectives imply (:func:`implied_bytes_sent`, to 1e-6 bytes), and
    ``step`` never read the node mean (``free`` times: an exchange nobody pays for)."""
    implied = implied_bytes_sent(base.comm_log, NODES)
    if free:
        return CheckResult("communicates", False, f"step read the node mean {free} times "
                           "(node_mean_state() or comm.mean_rows: evaluation's, not traffic, so "
                           "no byte is counted and no time taken); exchange values inside step "
                           "through self.comm.all_reduce")
    if not base.comm_log:
        return CheckResult("communicates", False, f"no collective in {STEPS} steps; "
                           "give it a shorter period (--set KEY=VALUE)")
    if [round(x, 6) for x in implied] != [round(x, 6) for x in base.bytes_sent]:
        return CheckResult("communicates", False, f"bytes sent per node {base.bytes_sent} "
                           f"differ from what the logged collectives imply, {implied}; likely "
                           "cause: bytes counted by hand (comm.bytes_sent written) or an "
                           "exchange outside self.comm")
    return CheckResult("communicates", True, f"{len(base.comm_log)} collectives, "
                       f"{max(base.bytes_sent):,.0f} bytes sent by the busiest node")


def _same(a: FitResult, b: FitResult, exact: bool = True) -> str:
    """What differs between two runs ("" if nothing): with ``exact``, their metrics rows (but
    the measured columns), final parameters and bytes sent, bit for bit; else their final
    parameters, to 1e-6 in float64."""
    rows = [_rows(a), _rows(b)]
    if exact and rows[0] != rows[1]:
        return "metrics rows differ"
    for (k, p), q in zip(a.model.state_dict().items(), b.model.state_dict().values(),
                         strict=True):
        if exact and not torch.equal(p, q):
            return f"parameter {k} differs"
        if not exact and not torch.allclose(p.double(), q.double(), rtol=0, atol=1e-6):
            return f"parameter {k} differs by {(p.double() - q.double()).abs().max():.2e}"
    if exact and a.bytes_sent != b.bytes_sent:
        return f"bytes differ: {a.bytes_sent} vs {b.bytes_sent}"
    return ""


class _Runs:
    """The runs the checks make of the strategy ``spec`` (class ``cls``) with ``settings``: the
    :class:`TinyNet` on :func:`tiny_data`, :data:`NODES` nodes, :data:`STEPS` steps, the model
    seeded alike every time. Each check method returns what went wrong, "" when it passed
    (:func:`_compare`'s contract); an exception is the check's failure too."""

    def __init__(self, spec: str, cls: type[StackedStrategy], settings: Mapping[str, Any]) -> None:
        self.spec, self.cls, self.settings = spec, cls, dict(settings)

    def fit(self, seed: int = 0, engine: str = "loop", dtype: torch.dtype = torch.float32,
            nodes: int = NODES, **kw: Any) -> FitResult:
        """One run (a fresh strategy, warnings silenced), with :meth:`exogym.Trainer.fit`'s
        ``kw`` over the checks' defaults (batch 8, evaluation every 3 steps, a log row each)."""
        torch.manual_seed(1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from exogym import Trainer

            args: dict[str, Any] = dict(num_nodes=nodes, max_steps=STEPS, batch_size=8,
                                        eval_interval=3, log_interval=1, engine=engine,
                                        seed=seed, progress=False)
            args.update(kw)
            return Trainer(TinyNet().to(dtype), tiny_data(dtype), tiny_data(dtype)).fit(
                strategy=strategies.make(self.spec, **self.settings), **args)

    def engines(self) -> str:
        """``engines``: the vmap and threads engines against the loop's, in float64."""
        a = self.fit(engine="loop", dtype=torch.float64)
        for engine in ("vmap", "threads"):
            b = self.fit(engine=engine, dtype=torch.float64)
            differ = _same(a, b, exact=False) or (
                "" if a.bytes_sent == b.bytes_sent else "bytes differ between engines")
            if differ:
                return f"loop vs {engine}: {differ}"
        return ""

    def resume(self) -> str:
        """``exact resume``: a run cut after its step-3 checkpoint and resumed, against the
        uninterrupted run, bit for bit."""
        with tempfile.TemporaryDirectory(prefix="exogym-check-") as tmp:
            full, cut = Path(tmp) / "full", Path(tmp) / "cut"
            self.fit(out_dir=full, checkpoint_every=3)
            # the folder a run killed after its step-3 checkpoint leaves
            shutil.copytree(full, cut)
            shutil.rmtree(cut / "checkpoints" / f"step-{STEPS:08d}")
            (cut / "summary.json").unlink()
            from exogym import Trainer

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                Trainer(TinyNet(), tiny_data(torch.float32), tiny_data(torch.float32)).fit(
                    resume=cut, progress=False)
            if _file_rows(cut) != _file_rows(full):
                return "metrics rows differ from the uninterrupted run's"
            a = torch.load(full / "model.pt", weights_only=True)
            b = torch.load(cut / "model.pt", weights_only=True)
            differ = [k for k in a if not torch.equal(a[k], b[k])]
            return f"final parameters differ: {', '.join(differ)}" if differ else ""

    def processes(self) -> str:
        """``processes``: 2 nodes as 2 real processes (gloo) against 2 in-process nodes."""
        from exogym.run.launch import fit_processes

        torch.manual_seed(1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            real = fit_processes(
                TinyNet(), tiny_data(torch.float32), tiny_data(torch.float32),
                strategy=strategies.make(self.spec, **self.settings), num_nodes=2,
                max_steps=STEPS, batch_size=8, eval_interval=3, progress=False, threads=1)
        differ = _same(real, self.fit(nodes=2), exact=False)
        return f"{differ} (2 processes against one)" if differ else ""

    def absent(self) -> str:
        """``absent nodes``: node 1 fails at step 2 and rejoins at step 4, recovered from a
        peer; and what a down node holds never reaches the others: the same run with node 1's
        parameters overwritten while it is down (+1000 at its first step down) must give the
        same training losses and final model, bit for bit (a strategy that reduces over every
        node, not over :meth:`arrivals`, mixes them in)."""
        world = dict(network="home-100mbps", step_time=0.05, world="fail=1@2,rejoin=1@4")
        r = self.fit(**world)
        events = [e["event"] for e in r.events]
        if not all(math.isfinite(x) for x in r.final.values()):
            return f"non-finite final metrics {r.final}"
        if "recovery" not in events:
            return f"node 1 was not recovered after it rejoined (events: {events})"
        with _watched_steps(self.cls, before=_poison_down_node):
            poisoned = self.fit(**world)
        losses = [[row["train_loss"] for row in x.history if "train_loss" in row]
                  for x in (r, poisoned)]
        differ = [k for (k, p), q in zip(r.model.state_dict().items(),
                                         poisoned.model.state_dict().values(), strict=True)
                  if not torch.equal(p, q)]
        if losses[0] != losses[1] or differ:
            where = f"the final model ({differ[0]} differs)" if differ else "the training losses"
            return (f"node 1's parameters while it was down reached {where}; likely cause: a "
                    "collective over every node instead of members=self.arrivals() (or the "
                    "active nodes), or a row read without asking who is up")
        return ""

    def free_reads(self) -> int:
        """How many times ``step`` read the node mean (``Communicator.mean_rows``) in one run:
        an exchange between nodes that no byte counts."""
        calls = [0]
        inside = [False]
        original = Communicator.mean_rows

        def counted(comm: Communicator, xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
            calls[0] += inside[0]
            return original(comm, xs)

        def enter(strategy: StackedStrategy, step: int) -> None:
            inside[0] = True

        def leave(strategy: StackedStrategy, step: int) -> None:
            inside[0] = False

        Communicator.mean_rows = counted  # type: ignore[method-assign]
        try:
            with _watched_steps(self.cls, before=enter, after=leave):
                self.fit()
        finally:
            Communicator.mean_rows = original  # type: ignore[method-assign]
        return calls[0]

    def hyperparameters(self) -> str:
        """``hyperparameters``: every field documented; a misspelled key refused."""
        undocumented = [k for k, (_t, _d, doc) in config_fields(self.cls).items() if not doc]
        if undocumented:
            return (f"fields without an Attributes: entry in the class docstring: "
                    f"{', '.join(undocumented)}")
        try:
            strategies.make(self.spec, **{**self.settings, "optim.lrr": "0.1"})
        except ConfigError:
            return ""
        return "a misspelled key (optim.lrr) was accepted"

    def host_reads(self) -> str:
        """``no host sync``: one run with every ``step`` call watched by :class:`_HostReads`."""
        reads = _HostReads()
        with _watched_steps(self.cls, before=lambda s, k: reads.__enter__(),
                            after=lambda s, k: reads.__exit__(None, None, None)):
            self.fit()
        if reads.seen:
            first = sorted(set(reads.seen))
            return f"step reads {len(reads.seen)} tensors on the host: {'; '.join(first[:3])}"
        return ""


@contextlib.contextmanager
def _watched_steps(cls: type[StackedStrategy],
                   before: Callable[[StackedStrategy, int], None] | None = None,
                   after: Callable[[StackedStrategy, int], None] | None = None,
                   ) -> Iterator[None]:
    """``cls.step`` calls ``before(strategy, step)`` first and ``after`` last, while inside."""
    original = cls.step

    def watched(strategy: StackedStrategy, step: int) -> None:
        if before is not None:
            before(strategy, step)
        try:
            original(strategy, step)
        finally:
            if after is not None:
                after(strategy, step)

    cls.step = watched  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.step = original  # type: ignore[method-assign]


@torch.no_grad()
def _poison_down_node(strategy: StackedStrategy, step: int) -> None:
    """At step 2 (node 1 down, :meth:`_Runs.absent`), node 1's parameters + 1000."""
    if step == 2:
        for p in strategy.nodes.params.values():
            p[1].add_(1000.0)


def short_period(cls: type[StackedStrategy]) -> dict[str, Any]:
    """Settings that make a built-in strategy synchronise within a 6-step run: ``H=2``;
    Streaming DiLoCo's ``H=4, P=2, tau=1``; SPARTA's fraction ``p=0.25`` (the tiny model);
    MuLoCo's ``outer_adamw=False`` (the checks' two-layer model has no hidden layer: by role
    both are outer layers, and Muon would orthogonalise nothing)."""
    fields = config_fields(cls)
    out: dict[str, Any] = {}
    if "H" in fields:
        out["H"] = 2
    if "P" in fields:  # Streaming DiLoCo: P fragments, each synced every H steps, tau overlap
        out["H"], out["P"], out["tau"] = 4, 2, 1
    if "p" in fields:  # SPARTA's fraction: large enough to touch the tiny model
        out["p"] = 0.25
    if "outer_adamw" in fields:
        out["outer_adamw"] = False
    return out


def _settings_text(settings: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items()) or "defaults"


# Measurements of this machine, not numbers of the run: wall time. (The simulated time is one:
# the checks' runs price their steps on the default device.)
_MEASURED = ("wall_s",)


def _rows(result: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in _MEASURED} for r in result.history]


def _file_rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in _MEASURED} for r in rows]


def _reason(err: BaseException) -> str:
    frame = traceback.extract_tb(err.__traceback__)[-1] if err.__traceback__ else None
    where = f" ({Path(frame.filename).name}:{frame.lineno})" if frame else ""
    return f"{type(err).__name__}: {err}{where}"


def _attempt(results: list[CheckResult], name: str, fn: Callable[[], Any]) -> Any:
    try:
        value = fn()
    except Exception as err:
        results.append(_failed(name, _reason(err)))
        return None
    results.append(CheckResult(name, True))
    return value


LIKELY = {
    "runs": "a learning rate too large for the tiny model, or a division by a zero norm",
    "deterministic": "randomness drawn outside torch's seeded generators (os.urandom, time, an "
                     "unseeded numpy or random generator) or an iteration over a set",
    "seeds differ": "step overwrites the parameters with values that do not depend on the data "
                    "(zeros, a constant)",
    "engines": "step depends on the engine (self.nodes.engine) or treats one node's row apart; "
               "use the node-stacked tensors alike in every engine",
    "exact resume": "state set outside init_state and step, or an attribute step changes listed "
                    "in derived_state: the checkpoint does not hold it",
    "processes": "step reads or writes another node's row directly, or keeps state that is "
                 "not per node, instead of exchanging it through self.comm",
    "absent nodes": "recover(node, donor) fails, or step does not expect a node that missed "
                    "steps (docs/writing-a-strategy.md, 'absent nodes')",
    "no host sync": "a .item(), .tolist(), bool() or float() of a tensor inside step (a device "
                    "stall on a GPU): keep the value a tensor (torch.where) or compute it once "
                    "outside step",
}
"""Each check's likely cause, added to a failure that does not name one."""


def _failed(name: str, problem: str) -> CheckResult:
    """Check ``name`` failed with ``problem``, its likely cause added when it names none."""
    if name in LIKELY and "likely cause" not in problem:
        problem = f"{problem}; likely cause: {LIKELY[name]}"
    return CheckResult(name, False, problem)


def _compare(results: list[CheckResult], name: str, fn: Callable[[], str], ok: str) -> None:
    try:
        problem = fn()
    except Exception as err:
        results.append(_failed(name, _reason(err)))
        return
    results.append(_failed(name, problem) if problem else CheckResult(name, True, ok))


def render(spec: str, results: Sequence[CheckResult]) -> str:
    """The report ``exogym check`` prints: one line per check, then a verdict."""
    width = max(len(r.name) for r in results)
    mark = {True: "pass", False: "FAIL", None: "skip"}
    lines = [f"exogym check {spec}"]
    lines += [f"  {mark[r.passed]:<4}  {r.name:<{width}}  {r.detail}" for r in results]
    failed = [r.name for r in results if r.passed is False]
    lines.append(f"{len(failed)} of {len(results)} checks failed: {', '.join(failed)}"
                 if failed else f"all {sum(r.passed is True for r in results)} checks passed"
                 + (f", {sum(r.passed is None for r in results)} skipped"
                    if any(r.passed is None for r in results) else ""))
    return "\n".join(lines)
