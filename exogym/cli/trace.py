"""``exogym trace``: a finished run's timeline as a Chrome trace
(:mod:`exogym.run.output.trace`)."""

from __future__ import annotations

import argparse
from typing import Any

from exogym.cli.common import converter

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    trc = sub.add_parser(
        "trace", help="a finished run's timeline as a Chrome trace (Perfetto, chrome://tracing)",
        description="Replay a finished run's simulated clock with span recording on and write "
                    "its timeline (every node's compute, collectives, waits, down time, the "
                    "world's events) as a Chrome trace; open it in https://ui.perfetto.dev.")
    trc.add_argument("run_dir", type=converter("path"), metavar="RUN_DIR", help="a run folder")
    trc.add_argument("-o", "--output", type=converter("path"), metavar="FILE",
                     help="where to write it (default RUN_DIR/trace.json)")


def command(args: argparse.Namespace) -> int:
    """``exogym trace RUN_DIR [-o FILE]``: the run's timeline rebuilt from its folder (its clock
    replayed, :func:`exogym.run.output.trace.rebuild`); an asynchronous run's is the one it recorded
    while it trained (``--trace``), copied to ``FILE``."""
    import shutil

    from exogym.run.output.result import check_writable
    from exogym.run.output.trace import TRACE_FILE, NotReplayable, rebuild, write_trace

    out = args.output if args.output is not None else args.run_dir / TRACE_FILE
    check_writable(out, "trace")
    recorded = args.run_dir / TRACE_FILE
    try:
        trace = rebuild(args.run_dir)
    except NotReplayable:
        if not recorded.exists():
            raise
        if out.resolve() != recorded.resolve():
            shutil.copyfile(recorded, out)
        print(f"{out}: the trace this asynchronous run recorded while it trained")
        return 0
    write_trace(trace, out)
    meta = trace["otherData"]["exogym"]
    print(f"{out}: {meta['strategy']}, {meta['num_nodes']} nodes, {meta['steps']:,} steps, "
          f"{len(trace['traceEvents']):,} events (detail: {trace['otherData']['detail']}); "
          "open it in https://ui.perfetto.dev or chrome://tracing")
    return 0
