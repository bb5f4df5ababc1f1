"""``exogym networks``: the named network profiles (:mod:`exogym.sim.network`)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    sub.add_parser("networks", help="list the named network profiles")


def command(args: argparse.Namespace) -> int:
    from exogym.sim.network import PROFILES

    for net in PROFILES.values():
        print(f"{net.name:<13} {net.describe()}")
        print(f"{'':<13} {net.description}")
    print("custom: --network bw=1Gbps,latency=5ms (keys: bw, up, down, latency, all_reduce, "
          "all_gather, broadcast, node_bw, node_up, node_down, node_speed, bw_sigma, "
          "speed_sigma, seed); a profile plus changes: --network home-100mbps,latency=50ms")
    print("measured: exogym calibrate --out mynet.json (torchrun, or --engine process), then "
          "--network mynet.json (or mynet.json,latency=20ms)")
    return 0
