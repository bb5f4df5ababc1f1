"""Rerun every command whose output README.md or a page of docs/ shows, and rewrite those blocks
with what it prints now, stating the machine.

A block is regenerated when it is a fenced block whose lines start with ``$ `` commands (each
followed by its output; a command may continue over lines ending in ``\\``), or a block right
after an ``<!-- readme-output: COMMAND -->`` comment (the output alone, the command given in the
comment), or a Markdown table right after an ``<!-- readme-table: COMMAND -->`` comment (the
table the command prints, rendered as a table on the site). A block that shows only some lines
of an output marks the cut with ``...``: the rewritten block keeps the same lines, found by their
first word (an indented line is the line after the one before it); a block whose first line is a
progress bar keeps the final bar.

Folders the commands write (``--out DIR``) are removed first when they hold an exogym run. The
line between ``<!-- readme-machine -->`` markers is rewritten with the machine, the date and the
versions (every file with such blocks has that line). The files are read in :data:`FILES`'
order, each top to bottom (a block may read what an earlier one wrote); a command shown twice
runs once. ``--check`` rewrites nothing and exits 1 if a block's command no longer parses.

    python bench/readme_outputs.py                    # about 10 minutes on 2 cores
    python bench/readme_outputs.py docs/world.md      # one file's blocks
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# README first (its main job), then every page of the documentation
FILES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"(?P<head><!-- readme-output: (?P<cmd>.*?) -->\n)?```(?P<lang>[a-z]*)\n"
                   r"(?P<body>.*?)```", re.S)
TABLE = re.compile(r"<!-- readme-table: (?P<cmd>.*?) -->\n(?P<body>(?:\|[^\n]*\n)+)")
MACHINE = re.compile(r"(<!-- readme-machine -->)(.*?)(<!-- /readme-machine -->)", re.S)
BAR = re.compile(r"^\s*\d+%\|")


@dataclass
class Block:
    start: int
    end: int
    commands: list[tuple[str, list[str]]]  # (command, the lines shown after it)
    hidden_command: bool  # the command is in the comment, not in the block
    table: bool = False  # a Markdown table (the output's lines that start with "|")


def blocks(text: str) -> list[Block]:
    """The regenerable blocks of ``text``, in order."""
    out = []
    for m in FENCE.finditer(text):
        lines = m.group("body").rstrip("\n").split("\n")
        if m.group("cmd"):
            out.append(Block(m.start("lang") - 3, m.end(), [(m.group("cmd"), lines)], True))
        elif m.group("lang") == "" and lines and lines[0].startswith("$ "):
            out.append(Block(m.start("lang") - 3, m.end(), _commands(lines), False))
    for m in TABLE.finditer(text):
        lines = m.group("body").rstrip("\n").split("\n")
        out.append(Block(m.start("body"), m.end("body"), [(m.group("cmd"), lines)], True, True))
    return sorted(out, key=lambda b: b.start)


def _commands(lines: list[str]) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(lines):
        cmd = lines[i][2:]
        while cmd.endswith("\\") and i + 1 < len(lines):
            i += 1
            cmd = cmd[:-1].rstrip() + " " + lines[i].strip()
        shown = []
        i += 1
        while i < len(lines) and not lines[i].startswith("$ "):
            shown.append(lines[i])
            i += 1
        out.append((cmd, shown))
    return out


def run(cmd: str) -> list[str]:
    """The lines ``cmd`` prints (stdout and stderr together, progress bars as their last
    state), after removing the run folders it names."""
    args = shlex.split(cmd)
    for flag in ("--out",):
        if flag in args:
            target = Path(args[args.index(flag) + 1])
            if (target / "config.json").is_file():
                shutil.rmtree(target)
    if args[0] == "exogym":
        args = [sys.executable, "-m", "exogym", *args[1:]]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd!r} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    lines = []
    for line in (proc.stderr + proc.stdout).split("\n"):
        parts = [p for p in line.split("\r") if p.strip()]
        lines.append(parts[-1].rstrip() if parts else "")  # blank lines are part of a table
    while lines and not lines[-1]:
        lines.pop()
    return lines


def fill(shown: list[str], got: list[str]) -> list[str]:
    """The new lines for a block that showed ``shown`` of an output that is now ``got``."""
    bar = [g for g in got if BAR.match(g)]
    plain = [g for g in got if not BAR.match(g) and not g.startswith("exogym: warning")]
    while plain and not plain[0]:
        plain.pop(0)
    head = bar[-1:] if shown and BAR.match(shown[0]) else []
    if "..." not in shown:
        return head + plain
    out, k = list(head), -1
    for line in shown[len(head):]:
        if line == "...":
            out.append(line)
        elif line[:1].isspace():
            k += 1
            out.append(plain[k])
        else:
            word = line.split()[0]
            k = next(j for j in range(k + 1, len(plain)) if plain[j].split()[:1] == [word])
            out.append(plain[k])
    return out


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"Outputs below were recorded on {time.strftime('%Y-%m-%d')} on {cpu} "
            f"({os.cpu_count()} cores, no GPU), Python {platform.python_version()}, torch "
            f"{torch.__version__}, by `python bench/readme_outputs.py`; times and the last "
            "digits of losses differ from machine to machine.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path,
                    help="only these files (default: README.md and every page of docs/)")
    ap.add_argument("--check", action="store_true",
                    help="only parse every block's exogym commands (exit 1 if one fails)")
    args = ap.parse_args(argv)
    files = [f.resolve() for f in args.files] or FILES
    if args.check:
        return check([b for f in files for b in blocks(f.read_text(encoding="utf-8"))])
    outputs: dict[str, list[str]] = {}  # command -> its lines, run once per invocation
    for path in files:
        text = path.read_text(encoding="utf-8")
        found = blocks(text)
        if found:
            path.write_text(regenerate(text, found, outputs), encoding="utf-8")
            print(f"rewrote {len(found)} blocks of {path.relative_to(ROOT)}")
    return 0


def regenerate(text: str, found: list[Block], outputs: dict[str, list[str]]) -> str:
    """``text`` with every block of ``found`` showing what its commands print now."""
    if not MACHINE.search(text):
        raise SystemExit("a file with recorded outputs lacks the <!-- readme-machine --> line")
    new = []  # in the file's order: a later block may read what an earlier one wrote
    for b in found:
        lines = []
        for cmd, shown in b.commands:
            if cmd not in outputs:
                print(f"running: {cmd}", flush=True)
                outputs[cmd] = run(cmd)
            if b.table:
                lines += [line for line in outputs[cmd] if line.startswith("|")]
                continue
            got = fill(shown, outputs[cmd])
            lines += got if b.hidden_command else [_wrapped(cmd), *got]
        body = "\n".join(lines)
        new.append(body + "\n" if b.table else f"```\n{body}\n```")
    for b, block in reversed(list(zip(found, new, strict=True))):
        text = text[:b.start] + block + text[b.end:]
    return MACHINE.sub(lambda m: f"{m.group(1)}\n{machine()}\n{m.group(3)}", text)


def _wrapped(cmd: str, width: int = 100) -> str:
    """``$ cmd``, continued over lines ending in `` \\`` to fit ``width``."""
    words, lines, line = cmd.split(" "), [], "$"
    for w in words:
        if len(line) + 1 + len(w) > width - 2 and line.strip() != "$":
            lines.append(line + " \\")
            line = "   "
        line += " " + w
    return "\n".join([*lines, line])


def check(found: list[Block]) -> int:
    """Every exogym command of the blocks parses with today's command line."""
    from exogym.cli import build_parser

    parser, bad = build_parser(), 0
    for b in found:
        for cmd, _ in b.commands:
            args = shlex.split(cmd)
            if args[0] != "exogym":
                continue
            try:
                parser.parse_args(args[1:])
            except SystemExit:
                print(f"does not parse: {cmd}", file=sys.stderr)
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
