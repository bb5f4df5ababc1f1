"""Plots of a strategy comparison (:mod:`exogym.lab.compare`): the global model's eval loss against
training steps, against bytes sent per node, and against simulated time on the network.

One line per strategy (the same colour in every plot), the mean over the repeats, with the band
from the lowest to the highest run shaded when there are several; the target loss as a dashed
line; on the simulated-time plot, a world's failures of each strategy's first run as ticks at
the bottom. The loss axis is logarithmic; the bytes and simulated-time axes are symmetric-log
(strategies differ there by orders of magnitude: DDP sends every step, DiLoCo every H steps): linear
from 0 up to the smallest positive value plotted, logarithmic above, so that the points before a
strategy's first synchronisation (0 bytes sent, the initial model at time 0) are shown too.

Uses matplotlib (a core dependency), imported only here, with the Agg backend (files only, no
display). Rendering only: this module imports the result types it draws
(:mod:`exogym.lab.report`, :mod:`exogym.lab.sweep_report`), never the runners that produce them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exogym.lab.report import Comparison
    from exogym.lab.sweep_report import SweepResult

__all__ = ["MISSING_MATPLOTLIB", "PLOT_FILES", "plot_comparison", "plot_sweep",
           "require_matplotlib"]

MISSING_MATPLOTLIB = ('plots need matplotlib, an exogym dependency that is missing here: '
                      'pip install "matplotlib>=3.7"')
"""The message when matplotlib cannot be imported (a core dependency, so a broken install)."""

PLOT_FILES = ("loss_vs_step.png", "loss_vs_bytes.png", "loss_vs_sim_time.png")
"""The files :func:`plot_comparison` writes, in this order."""


def require_matplotlib() -> None:
    """Raise ImportError (:data:`MISSING_MATPLOTLIB`) if matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError(MISSING_MATPLOTLIB) from None


def plot_comparison(comparison: Comparison, out_dir: str | Path) -> tuple[Path, ...]:
    """Write ``loss_vs_step.png``, ``loss_vs_bytes.png`` and ``loss_vs_sim_time.png`` into
    ``out_dir``; their paths. Raises ImportError (naming the extra) without matplotlib."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    c = comparison
    runs = len(c.seeds)
    title = (f"{c.task}: {c.num_nodes} nodes, {c.network}, "
             + ("" if c.partition == "iid" else f"partition {c.partition}, ")
             + (f"seed {c.seeds[0]}" if runs == 1 else f"mean of {runs} seeds, min-max shaded"))
    axes: list[tuple[str, Any, bool]] = [  # x label, x values of a row, log x
        ("training step", lambda r: r.curve_steps, False),
        ("MB sent per node (max over nodes)", lambda r: [b / 1e6 for b in r.bytes_mean], True),
        (f"simulated time on {c.network} (s)", lambda r: r.sim_time_mean, True),
    ]
    paths = []
    for name, (xlabel, xs_of, log_x) in zip(PLOT_FILES, axes, strict=True):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        positive = [float(x) for row in c.rows for x in xs_of(row) if float(x) > 0]
        for i, row in enumerate(c.rows):
            xs = [float(x) for x in xs_of(row)]
            color = f"C{i % 10}"
            ax.plot(xs, row.loss_mean, "o-", ms=3, color=color, label=row.label)
            if runs > 1:
                ax.fill_between(xs, row.loss_min, row.loss_max, color=color, alpha=0.2, lw=0)
            failures = row.runs[0].failure_times_s if row.runs else ()
            if name == "loss_vs_sim_time.png" and failures:
                # each failure of the first seed's run: a tick on the time axis, in its colour
                ax.plot(list(failures), [0.02] * len(failures), "v", ms=5, color=color,
                        transform=ax.get_xaxis_transform(), clip_on=False,
                        label=f"{row.label}: failures ({len(failures)})")
        if c.target_loss is not None:
            ax.axhline(c.target_loss, color="gray", ls="--", lw=1,
                       label=f"target {c.target_loss:.4g}")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(_plain_formatter(minor=False))
        ax.yaxis.set_minor_formatter(_plain_formatter(minor=True))
        if log_x and positive:  # linear below the smallest positive value: 0 is on the axis
            ax.set_xscale("symlog", linthresh=min(positive), linscale=0.5)
            ax.set_xlim(left=0)
            # plain numbers (0.05, 2, 300), not 2 x 10^0; nothing inside the linear part but 0
            ax.xaxis.set_major_formatter(_plain_formatter(minor=False, linear=min(positive)))
            ax.xaxis.set_minor_formatter(_plain_formatter(minor=True, linear=min(positive)))
        ax.set_xlabel(xlabel)
        ax.set_ylabel("eval loss (global model)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return tuple(paths)


def _plain_formatter(minor: bool, linear: float = 0.0) -> Any:
    """Tick labels of a log axis as plain numbers; minor ticks labelled only at 2, 3 and 5 times
    a power of ten, and only when the axis spans less than two decades (else they crowd). On a
    symmetric-log axis, ticks inside the linear part ``(0, linear)`` are not labelled."""
    from matplotlib.ticker import Formatter

    class Plain(Formatter):
        def __call__(self, x: float, pos: int | None = None) -> str:
            if x == 0 and not minor:
                return "0"
            if x <= 0 or x < linear * (1 - 1e-9):
                return ""
            if minor:
                lo, hi = sorted(self.axis.get_view_interval())
                lo = max(lo, linear)
                lead = round(x / 10 ** math.floor(math.log10(x)))
                if lo <= 0 or hi / lo > 100 or lead not in (2, 3, 5):
                    return ""
            return f"{x:g}"

    return Plain()



def plot_sweep(result: SweepResult, path: str | Path) -> Path:
    """A sweep's score (mean final eval loss): against the axis's values for one axis (a line,
    one point per value in grid order), else one heatmap per pair of axes, each cell the score
    averaged over the other axes; the best point's cell outlined."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # imported here, so that importing this module imports no torch (sweep_report's types do)
    from exogym.lab.sweep_report import score_table

    axes = list(result.axes)
    pairs = [(a, b) for i, a in enumerate(axes) for b in axes[i + 1:]]
    if not pairs:
        (a,) = axes
        fig, ax = plt.subplots(figsize=(5, 3.5))
        table = score_table(result, a, None)
        xs = result.axes[a]
        ax.plot(range(len(xs)), [table[(x,)] for x in xs], marker="o")
        ax.set_xticks(range(len(xs)), xs)
        ax.set_xlabel(a)
        ax.set_ylabel("final eval loss (mean)")
    else:
        fig, grid = plt.subplots(1, len(pairs), figsize=(4.5 * len(pairs), 4), squeeze=False)
        for ax, (a, b) in zip(grid[0], pairs, strict=True):
            table = score_table(result, a, b)
            ys, xs = result.axes[a], result.axes[b]
            cells = [[table[(y, x)] for x in xs] for y in ys]
            image = ax.imshow(cells, cmap="viridis_r", aspect="auto")
            for r, y in enumerate(ys):
                for c, x in enumerate(xs):
                    light = image.norm(table[(y, x)]) < 0.5  # viridis_r: low = yellow
                    ax.text(c, r, f"{table[(y, x)]:.3g}", ha="center", va="center",
                            color="black" if light else "white", fontsize=8)
            if result.best is not None:
                best = result.best.settings
                r, c = ys.index(best[a]), xs.index(best[b])
                ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, lw=2,
                                           edgecolor="red"))
            ax.set_xticks(range(len(xs)), xs)
            ax.set_yticks(range(len(ys)), ys)
            ax.set_xlabel(b)
            ax.set_ylabel(a)
            fig.colorbar(image, ax=ax, label="final eval loss (mean)")
    fig.suptitle(f"{result.strategy} on {result.task}: sweep")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
