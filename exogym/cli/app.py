"""The ``exogym`` command: its parser (each subcommand's module adds its own), the process it
runs in (signals, one-line warnings) and the errors users cause, as one line and a status.

Importing this module imports no torch (only the standard library and torch-free exogym
modules): :func:`main` handles SIGINT / SIGTERM before anything heavy is imported, so a signal in
the seconds torch takes to import ends the command with a message and status 130 too.
"""

from __future__ import annotations

import argparse
import copy
import logging
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import TextIO

from exogym.cli import (
    bench,
    calibrate,
    check,
    claims,
    compare,
    devices,
    estimate,
    networks,
    recost,
    run,
    sample,
    strategies,
    sweep,
    tasks,
    trace,
)
from exogym.cli.common import Parser
from exogym.cli.presets import PresetError, expand_preset
from exogym.utils.config import ConfigError
from exogym.utils.signals import InterruptOnSignal, Stopped

__all__ = ["build_parser", "main"]

_COMMANDS: dict[str, ModuleType] = {
    "run": run, "compare": compare, "sweep": sweep, "bench": bench, "sample": sample,
    "strategies": strategies, "tasks": tasks, "networks": networks, "devices": devices,
    "check": check, "claims": claims,
    "recost": recost, "trace": trace, "estimate": estimate, "calibrate": calibrate,
}
"""Each subcommand's module (``add_parser(sub)``, ``command(args) -> status``), in the order
of ``exogym --help``."""


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (it imports the strategy and task registries, and so torch)."""
    parser = Parser(prog="exogym", description="Simulate distributed training on one machine.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _COMMANDS.values():
        module.add_parser(sub)
    return parser


def _attach_negative_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--step-time -1s`` -> ``--step-time=-1s``: argparse takes a value that starts with ``-``
    and is not a plain negative number for an option and says "expected one argument"; joined,
    the value reaches its own check, which says what is wrong with it."""
    takes_value: set[str] = set()
    parsers = [parser]
    while parsers:
        p = parsers.pop()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
            elif action.option_strings and action.nargs is None and not isinstance(
                    action, (argparse._StoreConstAction, argparse._StoreTrueAction,
                             argparse._StoreFalseAction, argparse._CountAction)):
                takes_value.update(action.option_strings)
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if token in takes_value and len(nxt) > 1 and nxt[0] == "-" and (
                nxt[1].isdigit() or nxt[1] == "."):
            out.append(f"{token}={nxt}")
            i += 2
            continue
        out.append(token)
        i += 1
    return out


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None) -> None:
    """A warning as one line, ``exogym: warning: MESSAGE`` (not Python's ``FILE:LINE:
    CATEGORY: MESSAGE`` and the source line): the command line's user did not write the code
    that warns."""
    print(f"exogym: warning: {message}", file=file if file is not None else sys.stderr)


@contextmanager
def _cli_process() -> Iterator[None]:
    """What the command line sets for its process, restored on exit (``main`` may run inside
    another program, a test): SIGINT / SIGTERM raising :class:`exogym.utils.signals.Stopped`
    wherever no training loop handles them (first, before anything else runs), and one-line
    warnings."""
    with InterruptOnSignal():
        shown = warnings.showwarning
        warnings.showwarning = _show_warning
        try:
            yield
        finally:
            warnings.showwarning = shown


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments; an unknown option is an error of its subcommand's parser (which knows the
    options to suggest), not of ``exogym``'s."""
    parser = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if raw[:1] == ["run"]:
        try:
            raw = expand_preset(raw)  # `--preset NAME`: its flags where it stands
        except PresetError as e:
            sub.choices["run"].error(str(e))
    raw = _attach_negative_values(parser, raw)
    args, extra = parser.parse_known_args(raw)
    if extra:
        sub.choices[args.command].unrecognized(extra)
    args.typed = _typed(sub.choices[args.command], raw[1:]) if args.command else frozenset()
    return args


def _typed(parser: argparse.ArgumentParser, argv: list[str]) -> frozenset[str]:
    """The destinations of the options ``argv`` gives (typed, whatever their value: ``--seed
    0`` equal to the default is typed), parsed again with no defaults."""
    bare = copy.copy(parser)
    bare._actions = [copy.copy(a) for a in parser._actions]
    for a in bare._actions:
        a.default = argparse.SUPPRESS
    bare._option_string_actions = {s: a for a in bare._actions for s in a.option_strings}
    bare._defaults = {}
    seen, _ = bare.parse_known_args(argv, argparse.Namespace())
    return frozenset(vars(seen))


def main(argv: Sequence[str] | None = None) -> int:
    """``exogym``'s entry point: the exit status (0, 1 a failed run or check, 2 bad usage, 130
    stopped by a signal).

    The signal handling is the first thing it does, before torch is imported (by
    :func:`_main`), so that a SIGTERM at any moment after it ends the command with one line and
    130, never silently (143)."""
    with _cli_process():
        try:
            return _main(argv)
        except Stopped as err:  # a signal while no training loop ran: nothing to checkpoint
            print(f"exogym: {err.signal.name}: stopped (no training step was running, nothing "
                  "to checkpoint)", file=sys.stderr)
            return 130


def _main(argv: Sequence[str] | None) -> int:
    """Parse, run the command, and turn the errors users cause into one line and a status; a
    signal (:class:`Stopped`) is left to :func:`main`."""
    # torch comes with these: imported here, after main's signal handling (a signal during the
    # import raises Stopped, for main), and before the try whose handlers name them
    from exogym.run.loop.drive import RunInterrupted
    from exogym.run.output.checkpoint import CheckpointError
    from exogym.run.output.result import NonFiniteLossError
    from exogym.tasks.data.download import ChecksumError, DatasetNotFoundError

    try:
        args = _parse(argv)
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        return _COMMANDS[args.command].command(args)
    except NonFiniteLossError as err:  # training ran and diverged: a failed run, not bad usage
        print(f"exogym: error: {err}", file=sys.stderr)
        return 1
    except (ConfigError, DatasetNotFoundError, ChecksumError, FileExistsError,
            FileNotFoundError, ValueError, ImportError, MemoryError, CheckpointError) as err:
        print(f"exogym: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `exogym strategies | head` (before OSError: it is one)
        sys.stdout = None  # type: ignore[assignment]
        return 0
    except OSError as err:  # a path that cannot be written or read: one line naming it
        where = f"{err.filename}: " if err.filename else ""
        print(f"exogym: error: {where}{err.strerror or err}", file=sys.stderr)
        return 2
    except RunInterrupted as err:  # stopped cleanly: says where the checkpoint is
        print(f"exogym: {err}", file=sys.stderr)
        return 130
    except Stopped:  # for main, which handles one before this function's imports too
        raise
    except KeyboardInterrupt:  # a second signal during training: aborted at once
        print("exogym: interrupted", file=sys.stderr)
        return 130
