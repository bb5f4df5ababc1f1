#!/usr/bin/env python
"""How tight the golden trajectories' tolerances are (``tests/strategy/test_golden.py``), both
ways.

1. **Mutations** (the default): each entry of :data:`MUTATIONS` is a one-line change of a
   strategy's update (an outer learning rate times 1.01, a momentum 0.9 -> 0.89, a flipped sign,
   other averaging weights, an off-by-one in a schedule, a skipped error feedback, ...). The
   function holding the line is recompiled from its source with the line changed, its
   ``__code__`` swapped in (so subclasses, decorators and ``from x import f`` copies all run the
   mutant) and restored afterwards; the golden runs of the strategies named are then compared
   with ``tests/strategy/golden/trajectories.json`` exactly as the test does. A mutation is
   *caught* when every one of those golden runs (both engines) fails; the table shows, per
   mutation, the least-failing run's worst number in units of its tolerance (above 1: the test
   fails).
2. **Drift** (``--drift``): every golden run, unchanged, against the file: the largest relative
   deviation of each compared section, to run under other kernel choices
   (``ATEN_CPU_CAPABILITY``, ``MKL_CBWR``, ``MKL_ENABLE_INSTRUCTIONS``) and thread counts
   (``EXOGYM_GOLDEN_THREADS``).

Exit status 1 if a mutation survived (or, with ``--drift``, if a number left its tolerance);
a mutation whose line is no longer in its function stops the script, naming it.

Usage::

    python bench/golden_mutations.py                     # every mutation
    python bench/golden_mutations.py --only diloco-outer-lr fedprox-mu
    ATEN_CPU_CAPABILITY=default EXOGYM_GOLDEN_THREADS=2 python bench/golden_mutations.py --drift
"""

from __future__ import annotations
import __future__

import argparse
import importlib
import inspect
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FunctionType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # support (its helpers)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "strategy"))
import test_golden as golden

from exogym.sim.threads import intra_op_threads


@dataclass(frozen=True)
class Mutation:
    """``old`` -> ``new`` on one line of the function ``target`` (``module:Qualified.name``);
    the golden runs of ``sids`` (both engines) must fail, unless ``survives`` says why this
    change cannot show in them (the table then reports it, and it fails nothing)."""

    name: str
    target: str
    old: str
    new: str
    sids: tuple[str, ...]
    survives: str = ""


S = "exogym.strategy."
MUTATIONS: tuple[Mutation, ...] = (
    Mutation("diloco-outer-lr", S + "diloco:DiLoCo.init_state", "SGD(params, lr=self.outer_lr,",
             "SGD(params, lr=self.outer_lr * 1.01,", ("diloco", "muloco", "sparta_diloco")),
    Mutation("diloco-outer-momentum", S + "diloco:DiLoCo.init_state",
             "momentum=self.outer_momentum,", "momentum=self.outer_momentum - 0.01,",
             ("diloco", "muloco", "sparta_diloco")),
    Mutation("diloco-pseudo-gradient-sign", S + "diloco:DiLoCo._outer_step",
             "[self.global_params[k].unsqueeze(0) - p for",
             "[p - self.global_params[k].unsqueeze(0) for",
             ("diloco", "muloco", "sparta_diloco")),
    Mutation("diloco-H-off-by-one", S + "diloco:DiLoCo.step", "if (step + 1) % self.H == 0:",
             "if step % self.H == 0:", ("diloco", "muloco")),
    Mutation("diloco-eager-correction-sign", S + "diloco_eager:DiLoCoEager._eager_step",
             "(mean.unsqueeze(0) - old / due", "(mean.unsqueeze(0) + old / due",
             ("diloco_eager",)),
    Mutation("diloco-eager-outer-lr", S + "diloco_eager:DiLoCoEager._outer_optimizer",
             "return torch.optim.SGD(params, lr=self.outer_lr,",
             "return torch.optim.SGD(params, lr=self.outer_lr * 1.01,", ("diloco_eager",)),
    Mutation("fedavg-H-off-by-one", S + "fedavg:FedAvg.step", "if (step + 1) % self.H == 0:",
             "if (step + 2) % self.H == 0:", ("fedavg", "fedprox")),
    Mutation("fedprox-mu", S + "fedprox:FedProx.step", "alpha=self.mu)",
             "alpha=self.mu * 1.01)", ("fedprox",)),
    Mutation("fedprox-stale-anchor", S + "fedprox:FedProx.average",
             "w.copy_(self.server_state[k].unsqueeze(0))", "w.copy_(w)", ("fedprox",)),
    Mutation("fedopt-update-sign", S + "fedopt:FedOpt.server_round",
             "updates = [p - self.server_params[k].unsqueeze(0)",
             "updates = [self.server_params[k].unsqueeze(0) - p",
             ("fedavgm", "fedadam", "fedyogi", "fedadagrad")),
    Mutation("fedopt-tau", S + "fedopt:AdaptiveFedOpt.server_update",
             "torch._foreach_add_(denom, self.tau)", "torch._foreach_add_(denom, self.tau * 1.01)",
             ("fedadam", "fedyogi", "fedadagrad")),
    Mutation("fedavgm-momentum", S + "fedavgm:FedAvgM.server_update",
             "torch._foreach_mul_(v, self.beta)", "torch._foreach_mul_(v, self.beta - 0.01)",
             ("fedavgm",)),
    Mutation("fedadam-beta2", S + "fedadam:FedAdam.update_v", "torch._foreach_mul_(v, self.beta2)",
             "torch._foreach_mul_(v, self.beta2 - 0.01)", ("fedadam",)),
    Mutation("fedyogi-sign", S + "fedyogi:FedYogi.update_v",
             "torch._foreach_sub(v, delta_sq)", "torch._foreach_sub(delta_sq, v)", ("fedyogi",)),
    Mutation("fedadagrad-accumulation", S + "fedadagrad:FedAdagrad.update_v",
             "torch._foreach_add_(v, delta_sq)", "torch._foreach_add_(v, delta_sq, alpha=1.01)",
             ("fedadagrad",)),
    Mutation("fedbuff-staleness-weight", S + "fedbuff:FedBuff.weight",
             "(1 + staleness) ** -self.a", "(1 + staleness) ** -(self.a * 1.01)", ("fedbuff",)),
    Mutation("fedbuff-mean-over-K", S + "fedbuff:FedBuff.apply", "self.buffer[k] / self.K",
             "self.buffer[k] / (self.K + 1)", ("fedbuff",)),
    Mutation("ddp-buffers-from-node-1", S + "ddp:DDP.step", "src = 0 if members is None",
             "src = 1 if members is None", ("ddp",)),
    Mutation("demo-step-size", S + "demo:DeMo.step", "p.sub_(update.sign_(), alpha=eta)",
             "p.sub_(update.sign_(), alpha=eta * 1.01)", ("demo",)),
    Mutation("demo-momentum", S + "demo:DeMo.step", "m.mul_(self.beta)", "m.mul_(self.beta - 0.1)",
             ("demo",)),
    Mutation("demo-momentum-0.01", S + "demo:DeMo.step", "m.mul_(self.beta)",
             "m.mul_(self.beta - 0.01)", ("demo",),
             survives="DeMo steps by eta sign(update): a change of the momentum that flips no "
                      "sign and no top-k choice in 8 steps leaves the run bit for bit the same"),
    Mutation("demo-skip-decoupling", S + "demo:DeMo.step",
             "m.sub_(lay.decode(lay.scatter(idx, val), mats))",
             "m.sub_(lay.decode(lay.scatter(idx, val), mats), alpha=0.0)", ("demo",)),
    Mutation("sparseloco-skip-error-feedback", S + "sparseloco:SparseLoCo.outer_step",
             "e.sub_(_unchunk(lay.scatter(idx, sent), lay))", "e.zero_()", ("sparseloco",)),
    Mutation("sparseloco-error-decay", S + "sparseloco:SparseLoCo.outer_step",
             "e.mul_(self.beta)", "e.mul_(self.beta - 0.01)", ("sparseloco",)),
    Mutation("sparseloco-outer-lr", S + "sparseloco:SparseLoCo.outer_step",
             "theta.sub_(delta, alpha=self.alpha)", "theta.sub_(delta, alpha=self.alpha * 1.01)",
             ("sparseloco",)),
    Mutation("sparta-indices-off-by-one", S + "sparta:SPARTA.step", "self.averager.indices(step)",
             "self.averager.indices(step + 1)", ("sparta",)),
    Mutation("sparta-averaging-weights", S + "sparta:SparseAverager.average",
             "new = mean.unsqueeze(0).expand(f.shape[0], -1)",
             "new = 0.99 * mean.unsqueeze(0) + 0.01 * old", ("sparta", "sparta_diloco")),
    Mutation("streaming-merge-weights", S + "streaming_diloco:StreamingDiLoCo._merge",
             "local.mul_(self.alpha).add_(glob, alpha=1.0 - self.alpha)",
             "local.mul_(self.alpha + 0.01).add_(glob, alpha=0.99 - self.alpha)",
             ("streaming_diloco",)),
    Mutation("streaming-tau-off-by-one", S + "streaming_diloco:StreamingDiLoCo.step",
             "self._merges[t + self.tau]", "self._merges[t + self.tau + 1]",
             ("streaming_diloco",)),
    Mutation("noloco-outer-lr", S + "noloco:NoLoCo._apply", "alpha=self.beta)",
             "alpha=self.beta * 1.01)", ("noloco",)),
    Mutation("noloco-group-mean", S + "noloco:_mean", "return total / len(values)",
             "return total / (len(values) + 0.01)", ("noloco",)),
    Mutation("muon-momentum", S + "muon:Muon._muon", "torch.lerp(m, g, 1.0 - mu)",
             "torch.lerp(m, g, 1.01 - mu)", ("muloco",)),
)


def _function(target: str) -> tuple[FunctionType, str]:
    """The plain function behind ``module:Qualified.name`` (through decorators such as
    ``torch.no_grad``) and the name of the class it is defined in (``""``: a module function)."""
    module_name, _, qualname = target.partition(":")
    obj: object = importlib.import_module(module_name)
    owner = ""
    for part in qualname.split("."):
        if isinstance(obj, type):
            owner = obj.__name__
            obj = obj.__dict__[part]
        else:
            obj = getattr(obj, part)
    fn = inspect.unwrap(getattr(obj, "__func__", obj))
    if not isinstance(fn, FunctionType):
        raise TypeError(f"{target} is not a Python function")
    return fn, owner


def mutant_code(m: Mutation) -> tuple[FunctionType, object]:
    """``(function, mutated code object)``: the function's source with ``m.old`` -> ``m.new``,
    compiled inside a class of the owner's name (the same ``super()`` cell and name mangling)."""
    fn, owner = _function(m.target)
    lines = textwrap.dedent(inspect.getsource(fn)).splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("def "))
    source = "".join(lines[start:])
    if source.count(m.old) != 1:
        raise SystemExit(f"mutation {m.name}: {m.old!r} occurs {source.count(m.old)} times in "
                         f"{m.target}, not once: the code changed; update the mutation")
    holder = owner or "_Module"
    wrapped = f"class {holder}:\n" + textwrap.indent(source.replace(m.old, m.new), "    ")
    namespace: dict[str, object] = {}
    code = compile(wrapped, f"<mutant {m.name}>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, dict(fn.__globals__), namespace)
    compiled = namespace[holder].__dict__[fn.__name__]  # type: ignore[attr-defined]
    return fn, inspect.unwrap(getattr(compiled, "__func__", compiled)).__code__


@contextmanager
def mutated(m: Mutation) -> Iterator[None]:
    """Run the mutant of ``m`` inside the block; the original code is restored after it."""
    fn, code = mutant_code(m)
    original = fn.__code__
    fn.__code__ = code  # type: ignore[assignment]
    try:
        yield
    finally:
        fn.__code__ = original


def worst(sid: str, engine: str, recorded: dict[str, object]) -> tuple[float, str]:
    """The golden run's worst number, in units of its tolerance, and where it is."""
    got = golden.trajectory(sid, engine)
    deviation, path, _g, _w = max(golden.deviations(got, recorded[f"{sid}/{engine}"]),
                                  key=lambda d: d[0])
    return deviation, path


def run_mutations(names: list[str] | None) -> bool:
    recorded = golden.load()
    chosen = [m for m in MUTATIONS if names is None or m.name in names]
    unknown = sorted(set(names or ()) - {m.name for m in MUTATIONS})
    if unknown:
        raise SystemExit(f"unknown mutation(s) {unknown}; known: {[m.name for m in MUTATIONS]}")
    print(f"{'mutation':34} {'golden runs':>11} {'caught':>7}  least-failing run: worst number")
    survived, expected = [], []
    for m in chosen:
        with mutated(m):
            runs = [(f"{s}/{e}", *worst(s, e, recorded)) for s in m.sids for e in golden.ENGINES]
        key, deviation, path = min(runs, key=lambda r: r[1])
        caught = sum(d > 1.0 for _k, d, _p in runs)
        if caught < len(runs):
            (expected if m.survives else survived).append(m.name)
        where = f"{deviation:.3g} x tolerance ({path})" if deviation else "every number as golden"
        print(f"{m.name:34} {len(runs):>11} {caught:>7}  {key}: {where}")
        if m.survives:
            print(f"{'':34} expected to survive: {m.survives}")
    print(f"{len(chosen) - len(survived) - len(expected)} of {len(chosen)} mutations caught"
          + (f"; expected survivors: {expected}" if expected else "")
          + (f"; SURVIVED: {survived}" if survived else ""))
    return not survived


def run_drift() -> bool:
    recorded = golden.load()
    sections = ("sim_time_s", "metrics", "model")
    top = dict.fromkeys(sections, 0.0)
    units = 0.0  # the largest deviation in units of its tolerance
    over = []
    for key in sorted(recorded):
        sid, engine = key.split("/")
        got = golden.trajectory(sid, engine)
        for section in sections:
            top[section] = max(top[section], golden.relative(got, recorded[key], section))
        units = max(units, *(d[0] for d in golden.deviations(got, recorded[key])))
        over += [f"{key}: {line}" for line in golden.mismatches(got, recorded[key])]
    for section in sections:
        rtol = golden.TOLERANCES[section][0]
        print(f"{section:10} largest relative deviation {top[section]:.3g} (tolerance {rtol:g})")
    print(f"largest deviation: {units:.3g} x its tolerance (above 1 fails)")
    print(f"{len(recorded)} golden runs; counts exact: "
          + ("all" if not over else f"no, {len(over)} numbers off:\n" + "\n".join(over[:20])))
    return not over


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drift", action="store_true",
                        help="no mutation: every golden run's deviation from the file")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these mutations only")
    args = parser.parse_args(argv)
    with intra_op_threads(golden.golden_threads()):
        ok = run_drift() if args.drift else run_mutations(args.only)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
