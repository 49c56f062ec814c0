"""The self-contained ``report.html``: header, warnings, the dashboard as a ``data:`` URI, a metrics table.

No external assets, scripts or links: the page can be mailed or attached to a ticket as it is.
"""

from __future__ import annotations

import base64
import html
import time
from pathlib import Path
from typing import Any

from reinforge.plugin import metric_names as mn

from .detectors import DIVERGENCE, ENTROPY, LENGTH, WARNING_TITLES, HackingWarning, Thresholds
from .metrics import RunMetrics
from .plot import WARNING_COLORS

__all__ = ["metric_summary", "render_page"]

_HIGHER_IS_BETTER = (mn.REWARD_PREFIX, mn.ACCURACY_PREFIX)


def metric_summary(data: RunMetrics) -> list[dict[str, Any]]:
    """One row per metric: first, final, min, max and (for rewards and accuracies) best, with their steps.

    A judge's own metrics (``reward/concise/length/mean``) are listed without a best: they are not rewards.
    """
    rows = []
    order = {k: i for i, k in enumerate([mn.ACCURACY_GREEDY, mn.ACCURACY_SAMPLED, mn.REWARD_MEAN, mn.REWARD_STD])}
    for kind in (mn.KIND_EVAL, mn.KIND_TRAIN):
        for key in sorted(data.keys(kind), key=lambda k: (order.get(k, len(order)), k)):
            steps, values = data.series(kind, key)
            if not steps:
                continue
            row: dict[str, Any] = {
                "kind": "validation" if kind == mn.KIND_EVAL else "train",
                "metric": key,
                "first": values[0],
                "first_step": steps[0],
                "final": values[-1],
                "final_step": steps[-1],
                "min": min(values),
                "max": max(values),
            }
            better = key.startswith(_HIGHER_IS_BETTER) and not key.endswith((mn.STD_SUFFIX, "/min"))
            if better and (not key.startswith(mn.REWARD_PREFIX) or data.is_reward(key)):  # not a judge's metric
                i = max(range(len(values)), key=lambda j: values[j])
                row["best"], row["best_step"] = values[i], steps[i]
            rows.append(row)
    return rows


def _num(x: float | None) -> str:
    if x is None:
        return "&mdash;"
    return f"{x:.4g}"


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1500px;color:#222;padding:0 16px}
h1{font-size:24px;margin-bottom:4px} h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555;margin:2px 0} .ok{color:#2ca02c;font-weight:600}
.warn{border-left:6px solid;padding:6px 12px;margin:8px 0;background:#fafafa}
.warn .t{display:inline-block;min-width:300px;font-weight:700} .warn .s{font-weight:700;margin-right:8px}
.headline{display:flex;gap:16px;flex-wrap:wrap;margin:12px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 14px} .card .v{font-size:22px;font-weight:600}
table{border-collapse:collapse;font-size:14px} th,td{padding:4px 10px;border-bottom:1px solid #eee;text-align:right}
th{background:#f4f4f4} td:first-child,td:nth-child(2),th:first-child,th:nth-child(2){text-align:left}
img{max-width:100%;border:1px solid #eee} code{background:#f4f4f4;padding:1px 4px}
.notes{color:#666;font-size:14px}
"""


def render_page(
    data: RunMetrics,
    warnings: list[HackingWarning],
    notes: list[str],
    header: dict[str, str],
    th: Thresholds,
    png: Path,
) -> str:
    """The HTML page of a run, with the dashboard ``png`` embedded."""
    e = html.escape
    title = " / ".join(v for k, v in header.items() if k in ("project", "experiment")) or data.path.parent.name
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>reinforge report: {e(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>reinforge report: {e(title)}</h1>",
    ]
    for key in ("project", "experiment", "model", "algorithm"):
        if key in header:
            parts.append(f'<p class="meta"><b>{key}</b>: {e(header[key])}</p>')
    meta = f"run folder <code>{e(str(data.path.parent))}</code>; {len(data.train)} training steps, {len(data.eval)} evaluations"
    if data.first_time is not None and data.last_time is not None and data.last_time > data.first_time:
        meta += f", {(data.last_time - data.first_time) / 60:.1f} min of wall time"
    meta += f"; generated {e(time.strftime('%Y-%m-%d %H:%M:%S'))}"
    parts.append(f'<p class="meta">{meta}</p>')

    cards = []
    for key in (mn.ACCURACY_GREEDY, mn.ACCURACY_SAMPLED, mn.REWARD_MEAN):
        steps, values = data.series(mn.KIND_EVAL, key)
        if len(steps) >= 2:
            cards.append(
                f'<div class="card">validation {e(key)}<div class="v">{values[0]:.3g} &rarr; {values[-1]:.3g}</div>'
                f"step {steps[0]} &rarr; {steps[-1]} ({values[-1] - values[0]:+.3g})</div>"
            )
    if cards:
        parts.append('<div class="headline">' + "".join(cards) + "</div>")

    parts.append(f"<h2>Reward-hacking warnings ({len(warnings)})</h2>")
    if not warnings:
        parts.append('<p class="ok">No warnings: none of the checks below held.</p>')
    for w in warnings:
        color = WARNING_COLORS.get(w.kind, "#d62728")
        parts.append(
            f'<div class="warn" style="border-color:{color}"><span class="t" style="color:{color}">{e(w.title)}</span>'
            f'<span class="s">{e(w.steps)}</span>{e(w.message)}</div>'
        )
    if notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")

    encoded = base64.b64encode(png.read_bytes()).decode("ascii")
    parts.append("<h2>Dashboard</h2>")
    parts.append(f'<img alt="training dashboard" src="data:image/png;base64,{encoded}">')

    parts.append("<h2>Metrics</h2>")
    parts.append(
        "<table><tr><th>metric</th><th>split</th><th>first</th><th>final</th><th>best</th><th>min</th><th>max</th></tr>"
    )
    for row in metric_summary(data):
        best = f"{_num(row['best'])} <small>(step {row['best_step']})</small>" if "best" in row else "&mdash;"
        parts.append(
            f"<tr><td>{e(row['metric'])}</td><td>{row['kind']}</td>"
            f"<td>{_num(row['first'])} <small>(step {row['first_step']})</small></td>"
            f"<td>{_num(row['final'])} <small>(step {row['final_step']})</small></td>"
            f"<td>{best}</td><td>{_num(row['min'])}</td><td>{_num(row['max'])}</td></tr>"
        )
    parts.append("</table>")

    parts.append("<h2>Checks and thresholds</h2><ul>")
    parts.append(
        f"<li><b>{WARNING_TITLES[DIVERGENCE]}</b>: over every {th.divergence_eval_points} consecutive evaluations, "
        f"the least-squares trend of the training reward rises by &ge; {th.divergence_min_train_rise:g} while "
        f"validation reward or accuracy falls by &ge; {th.divergence_min_val_drop:g}.</li>"
    )
    parts.append(
        f"<li><b>{WARNING_TITLES[LENGTH]}</b>: over {th.length_window} training steps, the fitted response length "
        f"grows by &ge; {th.length_min_growth * 100:g}% and is nearly monotonic (the later step is longer in "
        f"&ge; {th.length_monotonic_frac * 100:g}% of pairs of steps) while training or validation reward rises by &lt; {th.reward_flat_tol:g}.</li>"
    )
    parts.append(
        f"<li><b>{WARNING_TITLES[ENTROPY]}</b>: entropy below max({th.entropy_collapse_frac:g} &times; its initial "
        f"value (mean of the first {th.entropy_baseline_points} steps), {th.entropy_floor:g}) on "
        f"&ge; {th.min_consecutive} consecutive steps.</li>"
    )
    parts.append(
        '</ul><p class="notes">Change any threshold with <code>reinforge report RUN_DIR --threshold KEY=VALUE</code>. '
        "Warnings are heuristics: confirm them by reading trajectories from the flagged steps.</p>"
    )
    parts.append("</body></html>")
    return "\n".join(parts)
