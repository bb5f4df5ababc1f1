"""``exogym devices``: the named device profiles a run's compute is priced on
(:mod:`exogym.sim.devices`), with their figures and sources; with ``--task``, a step of that
task's model priced on each."""

from __future__ import annotations

import argparse
from typing import Any

from exogym.cli.common import add_data_options, converter

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("devices", help="list the device profiles that price a step (--hardware)")
    p.add_argument("--task", help="also price one step of this task's model on each device "
                   "(its default batch size, or --batch-size)")
    p.add_argument("--batch-size", type=converter("positive_int"), metavar="B",
                   help="with --task: the batch per node (default: the task's)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="with --task: the step's precision (default fp32)")
    p.add_argument("--device-profiles", metavar="FILE",
                   help="a JSON file of your own named profiles, listed too")
    p.add_argument("--sources", action="store_true", help="print each profile's source")
    add_data_options(p)


def command(args: argparse.Namespace) -> int:
    from exogym.sim.devices import DEFAULT_HARDWARE, PROFILES, describe_profile, load_profiles

    profiles = dict(PROFILES)
    if args.device_profiles is not None:
        profiles.update(load_profiles(args.device_profiles))
    times = _priced(args, profiles) if args.task else None
    head = ["name", "device", "fp32", "bf16", "memory bw", "per kernel"]
    if times is not None:
        head.append(f"{args.task} step")
    rows = [head]
    for name, p in profiles.items():
        row = describe_profile(p)
        if name == DEFAULT_HARDWARE:
            row[0] += " (default)"
        if times is not None:
            row.append(_ms(times[name]))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if args.sources:
        print()
        for p in profiles.values():
            print(f"{p.name:<12} {p.source}")
    print("\nexogym run --hardware NAME; one per node: h100:h100:rtx4090:m2; a mix drawn per "
          "client: phone-low=0.5,phone-mid=0.3,phone-high=0.2; custom: flops=80T,mem_bw=1TB/s; "
          "FedScale-form client profiles: clients.csv (client_id,computation,communication). "
          "The model: docs/devices.md")
    return 0


def _priced(args: argparse.Namespace, profiles: dict[str, Any]) -> dict[str, float]:
    """Seconds of one step of ``args.task``'s model on each profile."""
    from exogym.lab.devices import task_step

    count, _ = task_step(args.task, batch_size=args.batch_size, precision=args.precision,
                         data_dir=args.data_dir, download=not args.no_download)
    print(f"{args.task}: {count.flops / 1e9:,.3g} GFLOP ({count.matmul_flops / 1e9:,.3g} in "
          f"matrix products), {count.bytes / 1e6:,.3g} MB moved, {count.kernels:,} kernels per "
          f"step at batch {count.samples} ({args.precision}), the default inner optimizer\n")
    return {name: p.step_time(count) for name, p in profiles.items()}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3g} ms"
