"""How a run trains: :class:`RunSettings`, everything fixed from its start, resolved.

``fit``'s arguments (:class:`exogym.run.options.FitOptions`) are checked against the model, the
data and the strategy by the trainer (:mod:`exogym.run.trainer`), which resolves them into one
:class:`RunSettings` (a parsed network, the total steps, ...); the loop, the holders and the
clock read it, and a checkpoint's ``config.json`` records it. The one decision taken from the
settings and the strategy together lives here too, so that it is taken once:
:func:`world_decides`, whether anything but the schedule can change who computes a step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from exogym.sim.arrivals import Arrivals
from exogym.sim.compute import OptimizerBuilder
from exogym.sim.devices import Hardware, Pricing
from exogym.sim.engine import EngineName, Precision
from exogym.sim.flops import count_step
from exogym.sim.network import Network
from exogym.sim.participation import Participation
from exogym.sim.partition import Partition
from exogym.sim.round_policy import RoundPolicy
from exogym.sim.world import PERFECT, World
from exogym.strategy.base import StackedStrategy

__all__ = ["RunSettings", "client_links", "client_speeds", "device_speeds", "priced",
           "world_decides"]


@dataclass(frozen=True)
class RunSettings:
    """How a run trains: everything fixed from its start (validated by :meth:`exogym.Trainer.
    fit`; see its arguments). ``total_steps`` and ``eval_interval`` are resolved numbers."""

    num_nodes: int
    total_steps: int
    batch_size: int
    partition: Partition
    eval_interval: int
    eval_samples: int | None
    eval_at_start: bool
    eval_batch_size: int
    log_interval: int
    engine: EngineName
    micro_batch_size: int | None
    precision: Precision
    seed: int
    network: Network | None
    step_time_s: float | None
    compute_source: str
    allow_nonfinite: bool
    allow_unsynced: bool
    world: World = PERFECT
    participation: Participation | None = None
    round_policy: RoundPolicy | None = None  # a population's round rules (seats)
    arrivals: Arrivals | None = None  # when an asynchronous server's clients start (FLSim)
    trace: bool = False
    resident: int | None = None  # nodes in memory at once (exogym.run.nodes.paging); None: all
    offload: str = "host"
    seats: bool = False  # only the round's participants in memory (exogym.run.nodes.population)
    client_store: str = "512MB"  # where clients that keep state keep it (seats)
    compute: str = "profile"  # how a step is priced (FitOptions.compute)
    device_profiles: str | None = None  # a user's named device profiles (a JSON file)
    # compute="profile": the hardware, and its price of the counted step (set by priced())
    hardware: Hardware | None = None
    pricing: Pricing | None = None

    @classmethod
    def of(cls, values: Mapping[str, Any], **resolved: Any) -> RunSettings:
        """The settings of ``fit``'s arguments ``values`` (by name: :meth:`FitOptions.values`
        or ``resumed``), every field of this class that is one of them taken as it is, and the
        ``resolved`` ones (a parsed network, the total steps, what follows from them)."""
        own = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: v for k, v in values.items() if k in own}, **resolved})


def world_decides(settings: RunSettings, strategy: StackedStrategy) -> bool:
    """Whether the world may change who computes at any step: a world that is not perfect
    (failures, stragglers cut, late nodes) or the strategy's ``deadline``. Then the run asks the
    world before every step (a paged run computes step by step); partial participation alone
    changes who computes only at a round's first step."""
    return not settings.world.perfect or strategy.deadline is not None


def priced(s: RunSettings, model: nn.Module, batch: Any, optim: OptimizerBuilder
           ) -> RunSettings:
    """``s`` with its compute priced on its hardware (``compute="profile"``, a run with a
    network): one node's step counted on ``model`` and ``batch`` (one node's), its price on
    each device (:class:`~exogym.sim.devices.Pricing`), the reference's as ``step_time_s``.
    Counted on the CPU whatever the run trains on (PyTorch picks the same ATen kernels on every
    CPU, so the count is the same on every machine); deterministic, so every process of a
    multi-process run counts for itself."""
    if s.hardware is None or s.network is None or s.pricing is not None:
        return s
    count = count_step(model, batch, optim, micro_batch_size=s.micro_batch_size,
                       precision=s.precision, device="cpu")
    pricing = Pricing.of(s.hardware, count, s.num_nodes, s.seed)
    network = s.network
    if pricing.links is not None and not s.seats:  # each node's own link (a FedScale file's)
        if network.node_up_bps is not None or network.node_down_bps is not None:
            raise ValueError(f"--hardware {s.hardware.spec!r} gives every node its link; the "
                             f"network {network.spec()!r} gives them too: give them once")
        links = tuple(float(v) for v in pricing.links)
        network = dataclasses.replace(network, node_up_bps=links, node_down_bps=links)
    return dataclasses.replace(s, pricing=pricing, step_time_s=pricing.step_time_s,
                               network=network)


def device_speeds(s: RunSettings) -> np.ndarray | None:
    """Every node's or client's speed from its device, relative to the reference (None: all
    1)."""
    return None if s.pricing is None else s.pricing.speeds


def client_speeds(s: RunSettings) -> np.ndarray | None:
    """Every client's speed (a population's): the world's times its device's (None: all 1)."""
    world, devices = s.world.client_speeds(s.num_nodes), device_speeds(s)
    if devices is None:
        return world
    return devices if world is None else world * devices


def client_links(s: RunSettings) -> np.ndarray | None:
    """Every client's link in bits/s from its device profile (a FedScale-form file's; None:
    the network's)."""
    return None if s.pricing is None else s.pricing.links

