"""The dashboard PNG: one panel per metric group, reward-hacking warnings shaded on the panels they concern."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reinforge.plugin import MissingExtraError
from reinforge.plugin import metric_names as mn

from .detectors import DIVERGENCE, ENTROPY, LENGTH, WARNING_TITLES, HackingWarning, Thresholds, entropy_threshold
from .metrics import RunMetrics
from .switched_off import off_note

__all__ = ["MAX_DIMENSION_PANELS", "WARNING_COLORS", "Line", "Panel", "dashboard_panels", "plot_dashboard"]

WARNING_COLORS = {DIVERGENCE: "#d62728", LENGTH: "#e08214", ENTROPY: "#9467bd"}
MAX_DIMENSION_PANELS = 6  # more reward dimensions than this share one panel
TRAIN_COLOR = "#1f77b4"
VAL_COLOR = "#2ca02c"
VAL2_COLOR = "#17becf"


@dataclass
class Line:
    """One series of a panel: a metric of train or eval records."""

    kind: str  # train | eval
    key: str
    label: str
    color: str
    band_key: str | None = None  # a std to shade around the line
    style: str = "-"


@dataclass
class Panel:
    """One panel of the dashboard: what :func:`dashboard_panels` decided to draw, before matplotlib."""

    title: str
    ylabel: str
    lines: list[Line]
    warn_kinds: tuple[str, ...] = ()
    base_line: Line | None = None  # a dotted horizontal line at the step-0 value (the base model)
    entropy_limit: float | None = None
    unit_range: bool = False  # values in [0, 1]: keep the y axis there
    bars: bool = False  # counts: bars, never smoothed
    off: str | None = None  # the quantity is switched off in this run: this note instead of a flat zero


_TRAIN_PANELS = (  # (key, title, y label, warning kinds marked on it)
    (mn.ENTROPY, "Policy entropy", "entropy (nats / token)", (ENTROPY,)),
    (mn.KL, "KL divergence to reference", "KL", ()),
    (mn.CLIP_FRAC, "PPO clip fraction", "fraction of tokens clipped", ()),
    (mn.GRAD_NORM, "Gradient norm", "grad norm", ()),
    (mn.LOSS, "Loss", "loss", ()),
    (mn.TRUNCATED_RATE, "Truncated responses", "fraction truncated", (LENGTH,)),
    (mn.COUNT_DISCARDED, "Discarded samples", "samples discarded", ()),
    (mn.TOKENS_PER_S, "Throughput", "tokens / s", ()),
)
_BARS = (mn.COUNT_DISCARDED,)  # counts: bars, never smoothed


def dashboard_panels(data: RunMetrics, th: Thresholds, config: Mapping[str, Any] | None = None) -> list[Panel]:
    """The dashboard's panels, for the metrics this run has.

    Reward panels hold rewards only (a judge's own metrics, such as ``length_penalty``'s length,
    are left to the metrics table); ``config`` (the resolved run config) says which quantities
    are switched off.
    """
    train, val = mn.KIND_TRAIN, mn.KIND_EVAL
    train_keys, eval_keys = set(data.keys(train)), set(data.keys(val))
    panels: list[Panel] = []
    lines = []
    if mn.REWARD_MEAN in train_keys:
        lines.append(Line(train, mn.REWARD_MEAN, "train", TRAIN_COLOR, band_key=mn.REWARD_STD))
    if mn.REWARD_MEAN in eval_keys:
        lines.append(Line(val, mn.REWARD_MEAN, "validation", VAL_COLOR))
    if lines:
        panels.append(Panel("Reward: train vs validation", "reward", lines, (DIVERGENCE,)))
    acc = [k for k in (mn.ACCURACY_GREEDY, mn.ACCURACY_SAMPLED) if k in eval_keys]
    if acc:
        lines = [
            Line(val, k, f"validation {k.removeprefix(mn.ACCURACY_PREFIX)}", c, style=s)
            for k, c, s in zip(acc, (VAL_COLOR, VAL2_COLOR), ("-", "--"))
        ]
        panels.append(
            Panel("Validation accuracy", "accuracy", lines, (DIVERGENCE,), base_line=lines[0], unit_range=True)
        )
    dims = data.dimensions()
    if len(dims) > MAX_DIMENSION_PANELS:  # too many for a panel each: one panel, one color per dimension
        lines = []
        for i, dim in enumerate(dims):
            color = f"C{i % 10}"
            key = mn.dimension_mean(dim)
            if key in train_keys:
                lines.append(Line(train, key, dim, color))
            if key in eval_keys:  # same color, dashed; "_" keeps it out of the legend
                lines.append(Line(val, key, f"_{dim}", color, style="--"))
        panels.append(Panel("Reward dimensions", "reward (solid: train, dashed: validation)", lines))
        dims = []
    for dim in dims:
        key = mn.dimension_mean(dim)
        lines = []
        if key in train_keys:
            lines.append(Line(train, key, "train", TRAIN_COLOR, band_key=mn.dimension_std(dim)))
        if key in eval_keys:
            lines.append(Line(val, key, "validation", VAL_COLOR))
        panels.append(Panel(f"Reward dimension: {dim}", f"{dim} reward", lines))
    lines = []
    if mn.RESPONSE_LENGTH_MEAN in train_keys:
        lines.append(Line(train, mn.RESPONSE_LENGTH_MEAN, "train", TRAIN_COLOR, band_key=mn.RESPONSE_LENGTH_STD))
    if mn.RESPONSE_LENGTH_MEAN in eval_keys:
        lines.append(Line(val, mn.RESPONSE_LENGTH_MEAN, "validation", VAL_COLOR))
    if lines:
        panels.append(Panel("Response length", "mean response length", lines, (LENGTH,)))
    for key, title, ylabel, kinds in _TRAIN_PANELS:
        if key not in train_keys:
            continue
        panel = Panel(title, ylabel, [Line(train, key, "train", TRAIN_COLOR)], kinds, bars=key in _BARS)
        panel.off = off_note(key, data.series(train, key)[1], config)
        if panel.off:
            panel.lines = []
        if key == mn.ENTROPY:
            _, values = data.series(train, key)
            k = int(th.entropy_baseline_points)
            if len(values) >= k:
                panel.entropy_limit = entropy_threshold(sum(values[:k]) / k, th)
        panels.append(panel)
    return panels


def _smooth_width(n: int) -> int:
    """Moving-average width for a series of ``n`` points: 0 (raw) up to 40 points, else odd, about n / 25."""
    return 0 if n <= 40 else max(3, n // 25) | 1


def _smooth(values: list[float], width: int) -> list[float]:
    """Centered moving average (the window shrinks at the ends)."""
    half = width // 2
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - half) : i + half + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def _draw_panel(ax: Any, panel: Panel, data: RunMetrics, warnings: list[HackingWarning], xlim: tuple) -> None:
    from matplotlib.ticker import MaxNLocator

    if panel.off:  # nothing to plot: say why, on an empty panel
        ax.set_title(panel.title, fontsize=12, fontweight="bold", loc="left")
        ax.text(
            0.5,
            0.5,
            textwrap.fill(panel.off, 40),
            ha="center",
            va="center",
            fontsize=11,
            color="0.35",
            transform=ax.transAxes,
        )
        ax.set_xticks([])
        ax.set_yticks([])
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
        return
    for line in panel.lines:
        steps, values = data.series(line.kind, line.key)
        if not steps:
            continue
        if line.kind == mn.KIND_EVAL:
            ax.plot(steps, values, line.style, marker="o", ms=5, lw=1.8, color=line.color, label=line.label, zorder=4)
            if panel.base_line is not None and len(steps) > 1:  # accuracy: say where it ended
                ax.annotate(
                    f"{values[-1]:.3g}",
                    (steps[-1], values[-1]),
                    xytext=(-4, 7),
                    textcoords="offset points",
                    ha="right",
                    fontsize=9,
                    color=line.color,
                    fontweight="bold",
                )
            continue
        if panel.bars:
            ax.bar(steps, values, width=0.8, color=line.color, alpha=0.7, label=line.label)
            continue
        width = _smooth_width(len(steps))
        shown = _smooth(values, width) if width else values
        label = line.label
        if line.band_key:
            raw = [(s, v, data.train[s].get(line.band_key)) for s, v in zip(steps, shown)]
            band = [(s, v, sd) for s, v, sd in raw if sd is not None]
            if band:
                sds = [sd for _, _, sd in band]
                if width:
                    sds = _smooth(sds, width)
                ax.fill_between(
                    [s for s, _, _ in band],
                    [v - sd for (_, v, _), sd in zip(band, sds)],
                    [v + sd for (_, v, _), sd in zip(band, sds)],
                    color=line.color,
                    alpha=0.15,
                    lw=0,
                )
                label += " (mean ± 1 std)"
        if width:
            ax.plot(steps, values, "-", lw=0.8, color=line.color, alpha=0.3)
        marker = "." if len(steps) < 25 else None
        ax.plot(steps, shown, line.style, lw=2, color=line.color, label=label, marker=marker)
    if panel.base_line is not None:
        steps, values = data.series(panel.base_line.kind, panel.base_line.key)
        if steps and steps[0] == 0:
            ax.axhline(values[0], color="0.45", ls=":", lw=1.3, label=f"base model ({values[0]:.3g})")
    if panel.entropy_limit is not None:
        ax.axhline(
            panel.entropy_limit,
            color=WARNING_COLORS[ENTROPY],
            ls="--",
            lw=1.2,
            label=f"collapse threshold ({panel.entropy_limit:.3g})",
        )
    for w in warnings:
        if w.kind not in panel.warn_kinds:
            continue
        lo, hi = (w.start_step - 0.5, w.end_step + 0.5) if w.start_step == w.end_step else (w.start_step, w.end_step)
        ax.axvspan(lo, hi, color=WARNING_COLORS[w.kind], alpha=0.16, lw=0, zorder=0)
        ax.axvline(lo, color=WARNING_COLORS[w.kind], lw=1, alpha=0.6, zorder=0)
    if panel.unit_range:
        lo, hi = ax.get_ylim()
        ax.set_ylim(max(-0.02, min(lo, 0.0)), min(1.02, max(hi, 0.05)))
    ax.set_title(panel.title, fontsize=12, fontweight="bold", loc="left")
    ax.set_xlabel("training step", fontsize=10)
    ax.set_ylabel(panel.ylabel, fontsize=10)
    ax.set_xlim(*xlim)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))
    ax.grid(True, color="0.9", lw=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.tick_params(labelsize=9)
    handles, labels = ax.get_legend_handles_labels()
    marked = {w.kind for w in warnings if w.kind in panel.warn_kinds}
    if marked:
        from matplotlib.patches import Patch

        for kind in sorted(marked):
            handles.append(Patch(color=WARNING_COLORS[kind], alpha=0.3))
            labels.append(f"warning: {WARNING_TITLES[kind].lower()}")
    if len(handles) > 1 or (handles and labels[0] != "train"):  # a lone "train" line needs no legend
        ax.legend(handles, labels, fontsize=8.5, loc="best", framealpha=0.85, ncol=2 if len(handles) > 5 else 1)


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingExtraError(
            "matplotlib is not installed; reinforge-report needs it: pip install 'matplotlib>=3.7' "
            "(or reinstall reinforge-report)"
        ) from exc
    return plt


def plot_dashboard(
    data: RunMetrics,
    warnings: list[HackingWarning],
    header: dict[str, str],
    th: Thresholds,
    path: Path,
    config: Mapping[str, Any] | None = None,
) -> None:
    """Draw the dashboard (one panel per metric group, warnings marked) into the PNG file ``path``.

    ``config``: the resolved run config (``config.json``), which says which quantities are off.
    """
    plt = _pyplot()

    panels = dashboard_panels(data, th, config)
    steps = data.steps
    span = max(1, steps[-1] - steps[0])
    xlim = (steps[0] - 0.02 * span, steps[-1] + 0.02 * span)
    ncols = 1 if len(panels) == 1 else 2 if len(panels) <= 4 else 3
    nrows = max(1, math.ceil(len(panels) / ncols))
    panel_w, panel_h = 5.8, 3.9
    fig_w = panel_w * ncols

    # header: title, run facts, then one (wrapped) line per warning
    title = " / ".join(v for k, v in header.items() if k in ("project", "experiment")) or data.path.parent.name
    sub = [f"{k} {v}" for k, v in header.items() if k in ("model", "algorithm")]
    sub.append(f"{len(data.train)} training steps, {len(data.eval)} evaluations")
    if width := _smooth_width(len(data.train)):
        sub.append(f"thick lines: moving average over {width} steps, thin: per step")
    chars = max(60, int(fig_w * 72 / (10.5 * 0.6)))
    lines: list[tuple[str, str]] = []  # (text, color)
    if not warnings:
        lines.append(("No reward-hacking warnings.", VAL_COLOR))
    for w in warnings[:6]:
        wrapped = textwrap.wrap(f"\u25a0 {w.title} ({w.steps}): {w.message}", chars, subsequent_indent="    ")
        lines += [(t, WARNING_COLORS[w.kind]) for t in wrapped]
    if len(warnings) > 6:
        lines.append((f"... and {len(warnings) - 6} more (see report.html)", "0.2"))
    header_in = 0.95 + 0.22 * len(lines)
    fig_h = panel_h * nrows + header_in
    with plt.rc_context({"font.family": "DejaVu Sans"}):
        fig = plt.figure(figsize=(fig_w, fig_h), dpi=110)
        try:
            fig.text(0.012, 1 - 0.32 / fig_h, f"reinforge report: {title}", fontsize=16, fontweight="bold", va="center")
            fig.text(0.012, 1 - 0.62 / fig_h, "  |  ".join(sub), fontsize=10.5, color="0.3", va="center")
            for k, (text, color) in enumerate(lines):
                fig.text(0.012, 1 - (0.9 + 0.22 * k) / fig_h, text, fontsize=10.5, color=color, va="center")
            grid = fig.add_gridspec(
                nrows,
                ncols,
                left=0.9 / fig_w,
                right=1 - 0.25 / fig_w,
                bottom=0.55 / fig_h,
                top=1 - (header_in + 0.35) / fig_h,
                wspace=0.95 / panel_w,
                hspace=1.0 / panel_h,
            )
            for i, panel in enumerate(panels):
                ax = fig.add_subplot(grid[i // ncols, i % ncols])
                _draw_panel(ax, panel, data, warnings, xlim)
            fig.savefig(path, dpi=110, facecolor="white")
        finally:
            plt.close(fig)
