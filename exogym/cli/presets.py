"""``exogym run --preset NAME``: a published configuration as the flags that reproduce it.

A preset is a list of ``exogym run`` flags, placed where ``--preset NAME`` stands on the command
line (argparse keeps the last value of an option): a flag after it overrides the preset's (a
``--world`` replaces the preset's whole world; a ``--set`` changes one hyperparameter), a flag
before it is overridden. The run's ``config.json`` records the settings as resolved, as if they
had been typed; ``exogym run --preset NAME --help`` is not needed: :data:`PRESETS` and
``exogym run --help`` list them with their flags.

A preset names the task it was made for (its flags include ``--task``): a ``--task`` typed
anywhere on the command line that names another is refused by name, as is a preset whose task
exogym does not have. Each states what it trains to (``target``), checked by a slow test
(tests/cli/test_presets.py).

Presets:

- ``flsim-cifar10``: FedAvgM as FLSim runs its CIFAR-10 tutorial (facebookresearch/FLSim
  ``examples/configs/cifar10_config.json`` and ``examples/cifar10_example.py`` at commit
  9cd2cfb, read, not copied): 100 clients of 500 consecutive training images each (FLSim's
  ``SequentialSharder``: ``--partition contiguous``), 10 a round, the clients' plain SGD at lr
  0.0138 with batches of 32 for one local epoch (``H = 16``: 500 / 32 rounded up; exogym's 16
  batches wrap 12 images around where FLSim's last batch has 20), the server's SGD at lr 2.13
  with momentum 0.9 (FLSim's ``fed_avg_with_lr``, exogym's ``fedavgm`` with ``eta = 2.13``,
  ``beta = 0.9``), one pass over the clients (10 rounds: 160 steps). Differences: exogym's
  CIFAR-10 CNN (``cifar10-cnn-v0``) is not FLSim's ``SimpleConvNet``; FLSim visits every client
  once in its epoch, exogym draws each round's 10 afresh (about 66 distinct clients in 10
  rounds); FLSim prices no transfer (the network is exogym's default).
- ``flsim-sent140``: FedBuff as its authors' simulator runs it on Sent140 (FLSim
  ``examples/configs/sent140_fedbuff_config.json`` at commit 7311f2d): LEAF's Sent140 (an LSTM
  on tweets), a task exogym does not have, so the preset is refused with what to use instead.
  Its strategy is :meth:`exogym.strategy.fedbuff.FedBuff.flsim_sent140` and its world FLSim's
  (``--concurrency 128 --arrivals constant:100 --world duration=halfnormal:1:0``, docs/async.md),
  both usable on any task; on MNIST the Sent140 settings diverge (11.35% after 100 steps of
  10,000 clients).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PRESETS", "Preset", "PresetError", "expand_preset"]


@dataclass(frozen=True)
class Preset:
    """A published configuration as ``exogym run`` flags: ``source``, what it reproduces;
    ``task``, the task it was made for; ``target``, what it trains to (its docs' and a slow
    test's); ``missing``: why exogym cannot run it (its task is not exogym's), or None."""

    source: str
    task: str
    flags: tuple[str, ...]
    target: str = ""
    missing: str | None = None

    def help(self) -> str:
        if self.missing is not None:
            return f"{self.source} (not runnable: {self.missing})"
        return f"{self.source}, on {self.task}: {' '.join(self.flags)}"


class PresetError(ValueError):
    """A preset that cannot run as asked (the command line's usage error)."""


PRESETS: dict[str, Preset] = {
    "flsim-cifar10": Preset(
        source="FedAvgM in FLSim's CIFAR-10 tutorial (100 clients of 500 images, 10 a round, "
               "clients' SGD at lr 0.0138 for one local epoch, server SGD at lr 2.13 with "
               "momentum 0.9, one pass: 160 steps)",
        task="cifar10-cnn-v0",
        flags=("--task", "cifar10-cnn-v0", "--strategy", "fedavgm", "--set", "eta=2.13",
               "--set", "beta=0.9", "--set", "optim.name=sgd", "--lr", "0.0138",
               "--set", "H=16", "--batch-size", "32", "--nodes", "100",
               "--participation", "10", "--partition", "contiguous", "--steps", "160"),
        target="eval accuracy >= 20% after its 160 steps (seeds 0, 1, 2: 26.3%, 26.9%, "
               "31.9%; chance: 10%)"),
    "flsim-sent140": Preset(
        source="FedBuff in FLSim's Sent140 configuration",
        task="sent140",
        flags=(),
        missing="it was made for LEAF's Sent140 (an LSTM on tweets), a task exogym does not "
                "have, and its settings diverge on MNIST (11.35% after 100 steps); FLSim's "
                "world on any task: --concurrency 128 --arrivals constant:100 --world "
                "duration=halfnormal:1:0 (docs/async.md), its strategy in Python: "
                "FedBuff.flsim_sent140(); a preset that runs: flsim-cifar10"),
}
"""The presets by name (module docstring)."""


def expand_preset(argv: Sequence[str]) -> list[str]:
    """``argv`` with each ``--preset NAME`` (or ``--preset=NAME``) replaced by the preset's
    flags, in place; an unknown name is left for the parser, which names the known ones.

    Raises:
        PresetError: the preset cannot run (its task is not exogym's), or a ``--task`` typed
            anywhere names another task than the preset's.
    """
    out: list[str] = []
    used: list[Preset] = []
    typed: list[str] = []  # the tasks typed on the command line
    i = 0
    while i < len(argv):
        token = argv[i]
        name = None
        if token == "--preset" and i + 1 < len(argv):
            name, step = argv[i + 1], 2
        elif token.startswith("--preset="):
            name, step = token.split("=", 1)[1], 1
        if name is not None and name in PRESETS:
            preset = PRESETS[name]
            if preset.missing is not None:
                raise PresetError(f"--preset {name} cannot run: {preset.missing}")
            out.extend(preset.flags)
            used.append(preset)
            i += step
            continue
        if token == "--task" and i + 1 < len(argv):
            typed.append(argv[i + 1])
        elif token.startswith("--task="):
            typed.append(token.split("=", 1)[1])
        out.append(token)
        i += 1
    for preset in used:
        name = next(k for k, v in PRESETS.items() if v is preset)
        for task in typed:
            if task != preset.task:
                raise PresetError(f"--preset {name} was made for --task {preset.task}; got "
                                  f"--task {task} (its settings are that task's: leave "
                                  "--task out, or give the flags without the preset)")
    return out
