"""A claims run as files: ``claims.json`` (every rule's per-seed values, mean, CI and verdict),
``claims.md`` (the table of the docs' Claims page) and a plot per claim (each rule's per-seed
values, their mean and 95% CI against the rule's threshold)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from exogym.lab.claims.diagnostics import conclude
from exogym.lab.claims.spec import Rule
from exogym.lab.claims.suite import ClaimOutcome, command_of
from exogym.lab.plots import require_matplotlib

__all__ = ["EXPECTED", "failed_controls", "format_markdown", "plot_claim", "to_json",
           "write_report"]


def _num(v: float) -> str:
    if math.isnan(v):
        return "n/a"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.4g}"


def _figure(o: ClaimOutcome) -> str:
    """exogym's figure of each rule: mean [95% CI] (n seeds); one seed, its value alone."""
    return "; ".join(f"{_what(r)}: {_num(x.mean)}" + (
        "" if math.isnan(x.ci[0]) and x.verdict == "not decided"
        else f" [{_num(x.ci[0])}, {_num(x.ci[1])}]")
        for r, x in zip(o.claim.rules, o.rules, strict=True))


def _cell(text: str) -> str:
    """``text`` as a Markdown table cell: a ``|`` of its own (a paper's ``|p|/L``) escaped, so
    that it does not end the cell."""
    return text.replace("|", "\\|")


def _verdict(v: str) -> str:
    """A verdict in bold; ``not decided`` (one seed) plain, saying why."""
    return "not decided (one seed)" if v == "not decided" else f"**{v}**"


def _scale(o: ClaimOutcome) -> str:
    """The claim's scale; under ``--quick``, what the quick runs are, from their settings."""
    if not o.quick:
        return f"Scale: {o.claim.scale}"
    fit = o.claim.settings_of(o.claim.configs[0], True)
    parts = [f"{fit['num_nodes']} nodes" if "num_nodes" in fit else None,
             f"{fit['max_steps']} steps" if "max_steps" in fit else None,
             f"batch {fit['batch_size']}" if "batch_size" in fit else None]
    return (f"Scale (--quick): {', '.join(p for p in parts if p)}, one seed: a check of the "
            f"machinery (the suite's: {o.claim.scale})")


def _what(r: Rule) -> str:
    """``final_loss(a) - final_loss(b)``."""
    return f"{r.metric}({r.a}) {'-' if r.form == 'diff' else '/'} {r.metric}({r.b})"


EXPECTED = {"null": "reproduced", "negative": "not reproduced"}
"""What each kind of control must come out as (:attr:`exogym.lab.claims.spec.Claim.control`)."""


def failed_controls(outcomes: Sequence[ClaimOutcome]) -> list[str]:
    """The controls that did not come out as they must (a quick run decides none: none
    fail)."""
    return [o.claim.id for o in outcomes if o.claim.control is not None and not o.quick
            and o.verdict != EXPECTED[o.claim.control]]


def _controls(outcomes: Sequence[ClaimOutcome]) -> list[str]:
    """The controls' section, first: each control, what it must be, what it was."""
    controls = [o for o in outcomes if o.claim.control is not None]
    if not controls:
        return []
    failed = failed_controls(outcomes)
    if any(o.quick for o in controls):
        said = "A quick run decides no control (one seed), and no verdict."
    elif failed:
        said = (f"A control failed ({', '.join(failed)}): the suite publishes no verdict (each "
                "is withheld below).")
    else:
        said = "Every control came out as it must: the verdicts below are published."
    lines = ["## Controls", "", said, "",
             "| control | kind | must be | was |", "|---|---|---|---|"]
    for o in controls:
        lines.append(f"| `{o.claim.id}`: {_cell(o.claim.claim)} | {o.claim.control} | "
                     f"{EXPECTED[o.claim.control]} | {_verdict(o.verdict)} |")
    return [*lines, ""]


def _diagnoses(outcomes: Sequence[ClaimOutcome]) -> list[str]:
    """The diagnostics' section, first: for each diagnosed claim its checks and the conclusion
    (:func:`exogym.lab.claims.diagnostics.conclude`)."""
    checks = [o for o in outcomes if o.claim.diagnoses is not None]
    if not checks:
        return []
    lines = ["## Scale or defect", "",
             "| claim not reproduced | check | role | was | conclusion |", "|---|---|---|---|---|"]
    for target in dict.fromkeys(o.claim.diagnoses for o in checks):
        mine = [o for o in checks if o.claim.diagnoses == target]
        verdict = conclude([(o.claim, o.verdict) for o in mine])
        if not any(o.claim.role == "identity" for o in mine):
            verdict += " (no identity check: a defect not ruled out)"
        for i, o in enumerate(mine):
            lines.append(f"| {f'`{target}`' if i == 0 else ''} | `{o.claim.id}`: "
                         f"{_cell(o.claim.claim)} | {o.claim.role} | {_verdict(o.verdict)} | "
                         f"{f'**{verdict}**' if i == 0 else ''} |")
    return [*lines, ""]


def format_markdown(outcomes: Sequence[ClaimOutcome], suite: str) -> str:
    """The controls first, then the claims table: claim, paper's figure, exogym's figure with
    its interval, verdict (withheld when a control failed)."""
    quick = any(o.quick for o in outcomes)
    withheld = bool(failed_controls(outcomes))
    lines = [f"# {suite}" + (" (--quick: a check of the machinery, not the verdicts)"
                             if quick else ""), "", *_controls(outcomes),
             *_diagnoses(outcomes),
             "| claim | paper | paper's figure | exogym (mean [95% CI], seeds) | verdict |",
             "|---|---|---|---|---|"]
    for o in outcomes:
        c = o.claim
        if c.control is not None:
            continue
        seeds = f"{o.seeds} seed{'s' * (o.seeds != 1)}"
        verdict = ("withheld (a control failed)" if withheld
                   else _verdict(o.verdict))
        lines.append(f"| `{c.id}`: {_cell(c.claim)} | {_cell(c.paper.authors)} "
                     f"{c.paper.year} ({_cell(c.paper.source)}), {_cell(c.where)} | "
                     f"{_cell(c.paper_figure)} | {_figure(o)} ({seeds}) | {verdict} |")
    lines += ["", "## Rules and commands", ""]
    for o in outcomes:
        c = o.claim
        lines += [f"### `{c.id}`", "", _scale(o), ""]
        for r, x in zip(c.rules, o.rules, strict=True):
            values = ", ".join(_num(v) for v in x.values)
            text = r.text if r.text.endswith(".") else r.text + "."
            lines.append(f"- {text} Per seed: {values}; {_verdict(x.verdict)}.")
        first, last = c.first_seed, c.first_seed + o.seeds - 1
        lines += ["", f"Each configuration with `--seed` {first} to {last}:", "", "```bash"]
        lines += [command_of(c, cfg, o.quick) + f" --seed {first}" + (
            f"  # from Python: the model drawn after torch.manual_seed({first}), "
            f"fit(seed={first + cfg.data_offset}): other data orders" if cfg.data_offset
            else "") for cfg in c.configs]
        lines += ["```", ""]
        if c.pilot:
            lines[-1:-1] = ["", f"Seeds: {c.pilot}."]
    return "\n".join(lines)


def to_json(outcomes: Sequence[ClaimOutcome], suite: str) -> dict[str, Any]:
    def plain(v: float) -> float | str:
        return v if math.isfinite(v) else str(v)

    def rule(r: Rule, x: Any) -> dict[str, Any]:
        return {"text": r.text, "kind": r.kind, "metric": r.metric, "a": r.a, "b": r.b,
                "form": r.form, "side": r.side, "threshold": r.threshold, "target": r.target,
                "margin": None if r.margin is None else list(r.margin), "effect": r.effect,
                "censored": r.censored, "values": [plain(v) for v in x.values],
                "mean": plain(x.mean), "ci": [plain(v) for v in x.ci], "verdict": x.verdict}

    failed = failed_controls(outcomes)
    return {"suite": suite, "controls_failed": failed, "verdicts_published": not failed,
            "claims": [{"id": o.claim.id, "verdict": o.verdict, "seeds": o.seeds,
                        "quick": o.quick, "control": o.claim.control,
                        "diagnoses": o.claim.diagnoses, "role": o.claim.role,
                        "interval": o.claim.interval, "paper": o.claim.paper.cite(),
                        "where": o.claim.where,
                        "rules": [rule(r, x) for r, x in zip(o.claim.rules, o.rules,
                                                             strict=True)]}
                       for o in outcomes]}


def plot_claim(o: ClaimOutcome, path: Path) -> Path:
    """One row per rule: the per-seed values (dots), their mean and 95% CI (a bar) and the
    threshold (a dashed line), each rule on its own axis."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rules = o.claim.rules
    fig, axes = plt.subplots(len(rules), 1, figsize=(6.5, 1.2 + 1.1 * len(rules)),
                             squeeze=False)
    for ax, r, x in zip(axes[:, 0], rules, o.rules, strict=True):
        finite = [v for v in x.values if math.isfinite(v)]
        ax.scatter(finite, [0] * len(finite), color="0.4", zorder=3, s=18, label="seeds")
        if math.isfinite(x.mean) and all(math.isfinite(v) for v in x.ci):
            ax.errorbar([x.mean], [0], xerr=[[x.mean - x.ci[0]], [x.ci[1] - x.mean]],
                        fmt="o", color="C0", capsize=6, zorder=4, label="mean, 95% CI")
        if r.margin is not None:
            ax.axvspan(*r.margin, color="C2", alpha=0.15, label="equivalence margin")
        elif r.kind != "reported":
            ax.axvline(r.threshold, color="C3", ls="--", label=f"threshold ({r.side})")
        ax.set_yticks([])
        ax.set_title(f"{r.text}  [{x.verdict}]", fontsize=8, loc="left", wrap=True)
        ax.set_xlabel(_what(r), fontsize=8)
    axes[0, 0].legend(fontsize=7, loc="best")
    fig.suptitle(f"{o.claim.id}: {o.verdict} ({o.seeds} seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(outcomes: Sequence[ClaimOutcome], out_dir: str | Path, suite: str) -> None:
    """``claims.json``, ``claims.md`` and ``ID.png`` per claim into ``out_dir``."""
    out = Path(out_dir)
    (out / "claims.json").write_text(json.dumps(to_json(outcomes, suite), indent=1) + "\n",
                                     encoding="utf-8")
    (out / "claims.md").write_text(format_markdown(outcomes, suite) + "\n", encoding="utf-8")
    for o in outcomes:
        plot_claim(o, out / f"{o.claim.id}.png")
