"""What the subcommands share: the parser class, the converters of option values (each written
once), the options of a task's data, the options generated from the run settings' declarations
(:mod:`exogym.run.options`), and the default output folder.

Torch-free at import, like the whole package: what needs torch is imported when a parser is
built or a command runs.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from exogym.tasks import Task

Options = argparse.ArgumentParser | argparse._ArgumentGroup
"""Where options are added: a parser, or one of its sections (``exogym run --help``'s)."""

__all__ = ["Parser", "add_data_options", "add_results_options", "add_settings", "add_task_option",
           "converter", "default_out", "get_task", "number", "setting_values"]


def get_task(spec: str) -> Task:
    """:func:`exogym.tasks.registry.get_task` (imported on first use: it imports torch)."""
    from exogym.tasks.registry import get_task as get

    return get(spec)


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (not the usage block): the message, the closest
    option or value where one is close (``--stpes`` -> ``--steps``), and where the help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\nsee `{self.prog} --help`\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as err:
            close = difflib.get_close_matches(str(value), [str(c) for c in action.choices or ()],
                                              n=1)
            if not close:
                raise
            raise argparse.ArgumentError(
                action, f"{err.message} (did you mean {close[0]!r}?)") from None

    def unrecognized(self, extra: Sequence[str]) -> NoReturn:
        """The error for options this parser does not have, naming the closest one of each."""
        options = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        wrong = [t.split("=", 1)[0] for t in extra if t.startswith("--")]
        close = [m[0] for m in (difflib.get_close_matches(w, options, n=1) for w in wrong) if m]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        self.error(f"unrecognized arguments: {' '.join(extra)}{hint}")


# -- converters: text -> value, a ValueError whose message argparse shows ----------------------
def number(kind: type[int] | type[float], *, least: int | None = None,
           above: float | None = None, words: Mapping[str, Any] | None = None,
           name: str = "number") -> Callable[[str], Any]:
    """A converter to an integer or a finite number, at least ``least`` or above ``above``;
    ``words`` are other values it takes (``"all"`` -> None). Its error says what it expected
    and what it got (an integer as read: ``got 0``; else the text: ``got 'inf'``)."""
    taken = dict(words or {})
    what = "an integer" if kind is int else "a finite number"
    what += f" >= {least}" if least is not None else ""
    what += f" > {above:g}" if above is not None else ""
    what += "".join(f" or {w!r}" for w in taken)

    def convert(text: str) -> Any:
        if text.strip().lower() in taken:
            return taken[text.strip().lower()]
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(value) or (least is not None and value < least) or (
                above is not None and not value > above):
            raise ValueError(f"expected {what}, got {value if kind is int else repr(text)}")
        return value

    convert.__name__ = name
    return convert


def _positive_duration(text: str) -> float:
    from exogym.sim.network import parse_duration

    value = parse_duration(text)
    if not value > 0:
        raise ValueError(f"expected a duration > 0, e.g. 30ms, got {text!r}")
    return value


def _path(text: str) -> Path:
    """A path option; an empty one is an error (``Path("")`` would silently mean the current
    folder)."""
    if not text.strip():
        raise ValueError("expected a path, got an empty string")
    return Path(text)


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def _offload(text: str) -> str:
    from exogym.run.nodes.paging import parse_offload

    parse_offload(text)
    return text


def _flops(text: str) -> float:
    """``"312T"``, ``"312TFLOPS"``, ``"3.12e14"`` -> FLOP/s (or FLOPs)."""
    from exogym.lab.estimate import parse_count

    raw = text.strip()
    for suffix in ("flop/s", "flops", "flop"):
        if raw.lower().endswith(suffix):
            raw = raw[: -len(suffix)]
            break
    return parse_count(raw)


def _labels(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise ValueError("expected a comma-separated list of strategies, e.g. "
                         f"ddp,diloco,diloco-h10, got {text!r}")
    return items


_CONVERTERS: dict[str, Callable[[str], Any] | str] = {
    "positive_int": number(int, least=1, name="positive_int"),
    "non_negative_int": number(int, least=0, name="non_negative_int"),
    "positive_number": number(float, above=0, name="positive_number"),
    "finite": number(float, name="finite"),
    "count_or_all": number(int, least=1, words={"all": None}, name="count_or_all"),
    "duration": _positive_duration,
    "path": _path,
    "key_value": _key_value,
    "labels": _labels,
    "offload": _offload,
    "flops": _flops,
    # the simulator's own parsers (whose errors name the closest profile, key, ...), imported
    # when a parser is built
    "network": "exogym.sim.network:parse_network",
    "partition": "exogym.sim.partition:parse_partition",
    "world": "exogym.sim.world:parse_world",
    "round_policy": "exogym.sim.round_policy:parse_round_policy",
    "arrivals": "exogym.sim.arrivals:parse_arrivals",
    "count": "exogym.lab.estimate:parse_count",
    "any_duration": "exogym.sim.network:parse_duration",
}
"""Every converter of an option's text by name (a run setting's ``parse`` names one)."""


def converter(name: str | Callable[[str], Any]) -> Callable[[str], Any]:
    """The argparse ``type`` of converter ``name`` (or of a command's own function): its
    ValueError becomes argparse's error, message kept (``argument --nodes: expected an integer
    >= 1, got 0``)."""
    parse = _CONVERTERS[name] if isinstance(name, str) else name
    if isinstance(parse, str):
        module, _, attr = parse.partition(":")
        parse = getattr(importlib.import_module(module), attr)
    assert callable(parse)

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


# -- options several commands share ------------------------------------------------------------
def add_data_options(p: Options, *, or_: str = "else") -> None:
    """``--data-dir`` and ``--no-download``: where a task's data is, and whether to fetch it."""
    p.add_argument("--data-dir", type=converter("path"),
                   help=f"data folder (default: $EXOGYM_DATA_DIR, {or_} ~/.cache/exogym/data)")
    p.add_argument("--no-download", action="store_true",
                   help="fail instead of downloading missing data")


def add_results_options(p: argparse.ArgumentParser, out_help: str) -> None:
    """``--out`` (the results folder; ``out_help`` its help) and ``--no-progress``, of the
    commands that train several runs."""
    p.add_argument("--out", type=converter("path"), help=out_help)
    p.add_argument("--no-progress", action="store_true", help="no per-run lines and bars")


def add_settings(p: Options, names: Iterable[str], *,
                 helps: Mapping[str, str] | None = None,
                 defaults: Mapping[str, Any] | None = None) -> None:
    """The options of the run settings ``names``, as declared (:mod:`exogym.run.options`: flag,
    converter, metavar, choices, default, help; flags of one ``group`` mutually exclusive), but
    for the ``helps`` and ``defaults`` given here (another command's sense of the same flag)."""
    from exogym.run.options import cli_default_of, default_of, settings

    declared = settings()
    groups: dict[str, Any] = {}
    for name in names:
        s = declared[name]
        assert s.flag is not None, f"{name} has no flag"
        kwargs: dict[str, Any] = {"help": (helps or {}).get(name, s.help)}
        if s.switch(default_of(name)):
            kwargs["action"] = "store_true"
        else:
            kwargs.update(default=(defaults or {}).get(name, cli_default_of(name)),
                          metavar=s.metavar,
                          choices=s.choices, type=converter(s.parse) if s.parse else None)
        if s.group is not None and s.group not in groups:
            groups[s.group] = p.add_mutually_exclusive_group()
        (p if s.group is None else groups[s.group]).add_argument(s.flag, **kwargs)


def setting_values(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The run settings ``names`` as the parsed command line ``args`` gives them, by ``fit``'s
    keyword (a negated flag's value is the opposite of its own: ``--no-progress`` ->
    ``progress=False``)."""
    from exogym.run.options import settings

    declared = settings()
    out = {}
    for name in names:
        s = declared[name]
        value = getattr(args, str(s.dest))
        out[name] = not value if s.negated else value
    return out


def default_out(name: str) -> Path:
    """``runs/NAME-TIME``, with ``-2``, ``-3``, ... appended while that exists."""
    base = Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out, k = base, 1
    while out.exists():
        k += 1
        out = base.with_name(f"{base.name}-{k}")
    return out


def add_task_option(p: Options) -> None:
    """``--task``: a registered task or the user's own."""
    from exogym.tasks.registry import TASKS

    p.add_argument("--task", default="mnist",
                   help=f"task id ({', '.join(TASKS)}), or your own: path/to/file.py:NAME or "
                        "package.module:NAME, a Task or a function returning one")
