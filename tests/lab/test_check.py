"""``exogym check``'s machinery (exogym/lab/check.py): a user's strategy from a file, broken in one
way, fails exactly the check for that way, with the reason; the unbroken one passes; the bytes a
log implies; the command's report and exit codes. That every registered strategy passes every
check is the registry-wide conformance, tests/strategy/test_conformance.py."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from exogym.cli import main
from exogym.lab.check import CHECKS, LIKELY, check_strategy, implied_bytes_sent
from exogym.sim.comm import CommRecord

BROKEN = textwrap.dedent('''
    import os
    from dataclasses import dataclass

    import torch

    from exogym.strategy.fedavg import FedAvg


    @dataclass(kw_only=True)
    class Base(FedAvg):
        """FedAvg, to be broken one way in each subclass.

        Attributes:
            H: local steps between two averagings.
        """


    @dataclass(kw_only=True)
    class NoBuild(Base):
        def __post_init__(self):
            super().__post_init__()
            raise ValueError("always")


    @dataclass(kw_only=True)
    class Diverges(Base):
        @torch.no_grad()
        def step(self, step):
            super().step(step)
            for p in self.nodes.params.values():
                p.fill_(float("nan"))


    @dataclass(kw_only=True)
    class Silent(Base):
        @torch.no_grad()
        def step(self, step):
            self.inner_step()


    @dataclass(kw_only=True)
    class Miscounts(Base):
        @torch.no_grad()
        def step(self, step):
            super().step(step)
            self.comm.bytes_sent[0] += 1.0  # bytes no collective carried


    @dataclass(kw_only=True)
    class Noisy(Base):
        @torch.no_grad()
        def step(self, step):
            super().step(step)
            noise = int.from_bytes(os.urandom(2), "little") * 1e-9
            for p in self.nodes.params.values():
                p.add_(noise)


    @dataclass(kw_only=True)
    class Zeroes(Base):
        @torch.no_grad()
        def init_state(self):
            for p in self.nodes.params.values():
                p.zero_()
            super().init_state()

        @torch.no_grad()
        def step(self, step):
            super().step(step)
            for p in self.nodes.params.values():
                p.zero_()  # the losses no longer depend on the data


    @dataclass(kw_only=True)
    class VmapOnly(Base):
        @torch.no_grad()
        def step(self, step):
            super().step(step)
            if self.nodes.engine == "vmap":
                for p in self.nodes.params.values():
                    p.mul_(0.5)


    @dataclass(kw_only=True)
    class Forgets(Base):
        derived_state = ("rounds",)  # wrongly: it is state, lost on resume

        def init_state(self):
            super().init_state()
            self.rounds = 0

        @torch.no_grad()
        def step(self, step):
            super().step(step)
            self.rounds += 1
            for p in self.nodes.params.values():
                p.mul_(1 - 0.01 * self.rounds)


    @dataclass(kw_only=True)
    class Peeks(Base):
        @torch.no_grad()
        def step(self, step):
            self.inner_step()
            for p in self.nodes.params.values():  # averages by indexing: no communicator
                p.copy_(p.mean(0, keepdim=True).expand_as(p))
            if (step + 1) % self.H == 0:
                self.average()


    @dataclass(kw_only=True)
    class NoRecovery(Base):
        def recover(self, node, donor):
            raise NotImplementedError("no recovery")


    @dataclass(kw_only=True)
    class MeanInStep(Base):
        @torch.no_grad()
        def step(self, step):
            self.inner_step()
            if (step + 1) % self.H == 0:  # the node mean as an average nobody pays for
                mean = self.node_mean_state()
                for k, p in self.nodes.params.items():
                    p.copy_(mean[k].expand_as(p))

        def global_state(self):
            return self.node_mean_state()


    @dataclass(kw_only=True)
    class IgnoresArrivals(Base):
        @torch.no_grad()
        def step(self, step):
            self.inner_step()
            if (step + 1) % self.H == 0:  # every node's row, up or not
                params = list(self.nodes.params.values())
                for p, m in zip(params, self.comm.all_reduce(params, "mean", tag="params")):
                    p.copy_(m.expand_as(p))


    @dataclass(kw_only=True)
    class Undocumented(Base):
        gamma: float = 0.5


    @dataclass(kw_only=True)
    class Syncs(Base):
        @torch.no_grad()
        def step(self, step):
            super().step(step)
            if sum(p.norm().item() for p in self.nodes.params.values()) < 0:
                raise AssertionError
''')

EXPECTED = {
    "NoBuild": "builds", "Diverges": "runs", "Silent": "communicates",
    "Miscounts": "communicates",
    "Noisy": ("deterministic", "engines", "exact resume", "absent nodes"),
    "Zeroes": "seeds differ",
    "VmapOnly": "engines", "Forgets": "exact resume", "Peeks": ("processes", "absent nodes"),
    "NoRecovery": "absent nodes", "Undocumented": "hyperparameters", "Syncs": "no host sync",
    # reading every node's row, the two below also mix a down node's into the others'
    "MeanInStep": ("communicates", "absent nodes"), "IgnoresArrivals": "absent nodes",
}
REASONS = {
    "NoBuild": "NoBuild: always", "Diverges": "NonFiniteLossError: non-finite training loss",
    "Silent": "no collective in 6 steps", "Miscounts": "differ from what the logged collectives",
    "Noisy": "metrics rows differ", "Zeroes": "give the same losses", "VmapOnly": "differs by",
    "Forgets": "differ", "Peeks": "differs by", "NoRecovery": "NotImplementedError: no recovery",
    "Undocumented": "fields without an Attributes: entry in the class docstring: gamma",
    "Syncs": "step reads", "MeanInStep": "step read the node mean 3 times",
    "IgnoresArrivals": "node 1's parameters while it was down reached the training losses",
}


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("broken")
    (folder / "broken_strategies.py").write_text(BROKEN)
    yield folder / "broken_strategies.py"  # the ids it registers: conftest's registry_restored
    sys.modules.pop("broken_strategies", None)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_a_strategy_broken_one_way_fails_that_check_with_its_reason(broken: Path, name: str):
    expected = EXPECTED[name] if isinstance(EXPECTED[name], tuple) else (EXPECTED[name],)
    results = check_strategy(f"{broken}:{name}", {"H": "2"},
                             processes="processes" in expected)
    assert [r.name for r in results] == list(CHECKS)
    failed = {r.name: r.detail for r in results if r.passed is False}
    assert tuple(failed) == expected, failed
    assert REASONS[name] in failed[expected[0]]
    # each failure of a check that can say why names its likely cause
    for check, detail in failed.items():
        if check in {*LIKELY, "processes", "absent nodes"}:
            assert "likely cause: " in detail, (check, detail)


def test_the_unbroken_base_passes_every_check(broken: Path):
    results = check_strategy(f"{broken}:Base", {"H": "2"}, processes=False)
    assert [r.passed for r in results] == [True] * 7 + [None] + [True] * 3


def test_bytes_implied_by_a_log():
    log = [CommRecord("all_reduce", 100, 0, "g"),                      # 2 (3-1)/3 * 100 each
           CommRecord("all_gather", 10, 1, "g", members=0b011),         # (2-1) * 10 by 0 and 1
           CommRecord("broadcast", 7, 2, "b", src=2),                   # (3-1) * 7 by node 2
           CommRecord("send", 5, 3, "s", members=0b101, src=0, dst=2),  # 5 by node 0
           CommRecord("push", 3, 4, "p", members=0b010, src=1),         # 3 by node 1
           CommRecord("pull", 3, 4, "p", members=0b010, dst=1)]         # the server's
    want = [400 / 3 + 10 + 5, 400 / 3 + 10 + 3, 400 / 3 + 14]
    assert implied_bytes_sent(log, 3) == pytest.approx(want, rel=0, abs=1e-9)


def test_cli_check_prints_the_table_and_exits_1_on_a_failure(broken: Path, capsys):
    assert main(["check", f"{broken}:Base", "--set", "H=2", "--no-processes"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"exogym check {broken}:Base"
    assert out.splitlines()[-1] == "all 10 checks passed, 1 skipped"
    assert main(["check", f"{broken}:Silent", "--no-processes"]) == 1
    out = capsys.readouterr().out
    assert "  FAIL  communicates" in out and out.splitlines()[-1] == (
        "1 of 11 checks failed: communicates")
    assert main(["check", "dilocoo"]) == 2
    assert "unknown strategy 'dilocoo'" in capsys.readouterr().err


def test_the_node_mean_is_every_node_s_in_every_process_count(broken: Path):
    # node_mean_state() averages the run's nodes under 2 real processes as in one (it averaged
    # each process's own rows, and the processes check failed with a bare parameter diff)
    results = {r.name: r for r in check_strategy(f"{broken}:MeanInStep", {"H": "2"})}
    assert results["processes"].passed is True, results["processes"].detail
    assert results["communicates"].passed is False
