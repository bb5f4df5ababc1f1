"""``exogym run --preset NAME``: a published configuration as the flags that reproduce it.

A preset is a list of ``exogym run`` flags, placed where ``--preset NAME`` stands on the command
line (argparse keeps the last value of an option): a flag after it overrides the preset's (a
``--world`` replaces the preset's whole world; a ``--set`` changes one hyperparameter), a flag
before it is overridden. The run's ``config.json`` records the settings as resolved, as if they
had been typed; ``exogym run --preset NAME --help`` is not needed: :data:`PRESETS` and
``exogym run --help`` list them with their flags.

Presets:

- ``flsim-sent140``: FedBuff as its authors' simulator runs it on Sent140 (FLSim,
  facebookresearch/FLSim ``examples/configs/sent140_fedbuff_config.json`` at commit 7311f2d,
  read, not copied): the strategy of :meth:`exogym.strategy.fedbuff.FedBuff.flsim_sent140` (a
  buffer of ``K = 10``, the server's SGD at lr 0.7 with momentum 0.9, no staleness weight, the
  clients' SGD at lr 0.1), the clients' batch of 32 (``local_batch_size``), and its timing:
  clients start at a constant 100 per second (``training_rate``) and each session lasts ``|N(0,
  1)|`` seconds drawn per session (``per_user_half_normal_duration_distribution``, sd 1, min 0).
  FLSim has no cap on the clients in flight (about 80 on average: 100 per second times the mean
  duration ``sqrt(2 / pi)``); exogym holds a row per client in flight, so the preset caps them
  at 128, above the 111 that are ever in flight at once over a million of FLSim's sessions (seed
  0), so that no client waits for a seat. FLSim prices no transfer: the network is the default
  (200 Gbit/s, the model's transfer some microseconds). FLSim's client trains one local epoch of
  its data; exogym's ``H`` is a number of steps: the preset sets ``H = 1`` (LEAF's Sent140 has
  2.4 samples per user on average, Caldas et al., arXiv 1812.01097, Table 1: one batch of 32 is
  most clients' whole data); give ``--set H=...`` for more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PRESETS", "Preset", "expand_preset"]


@dataclass(frozen=True)
class Preset:
    """A published configuration as ``exogym run`` flags: ``source``, what it reproduces."""

    source: str
    flags: tuple[str, ...]

    def help(self) -> str:
        return f"{self.source}: {' '.join(self.flags)}"


PRESETS: dict[str, Preset] = {
    "flsim-sent140": Preset(
        source="FedBuff in FLSim's Sent140 configuration (buffer, server and client "
               "optimizers, constant arrivals at 100/s, half-normal session durations)",
        flags=("--strategy", "fedbuff", "--set", "K=10", "--set", "eta_g=0.7",
               "--set", "server_momentum=0.9", "--set", "a=0", "--set", "optim.name=sgd",
               "--lr", "0.1", "--set", "H=1", "--batch-size", "32",
               "--concurrency", "128", "--arrivals", "constant:100",
               "--world", "duration=halfnormal:1:0")),
}
"""The presets by name (module docstring)."""


def expand_preset(argv: Sequence[str]) -> list[str]:
    """``argv`` with each ``--preset NAME`` (or ``--preset=NAME``) replaced by the preset's
    flags, in place; an unknown name is left for the parser, which names the known ones."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        name = None
        if token == "--preset" and i + 1 < len(argv):
            name, step = argv[i + 1], 2
        elif token.startswith("--preset="):
            name, step = token.split("=", 1)[1], 1
        if name is not None and name in PRESETS:
            out.extend(PRESETS[name].flags)
            i += step
            continue
        out.append(token)
        i += 1
    return out
