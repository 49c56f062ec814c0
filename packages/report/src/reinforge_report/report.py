""":func:`write_report`: the PNG dashboard, the HTML page and the JSON summary of one run folder.

Input is what a training backend writes into its run folder:

- ``metrics.jsonl``: one JSON object per line, under the names of :mod:`reinforge.metric_names`.
  ``{"kind": "train", "step": N, ...}`` lines carry ``reward/mean``, ``reward/std``,
  ``reward/<dimension>/mean``, ``response_length/mean``, ``entropy``, ``kl``, ``clip_frac``,
  ``grad_norm``, ``loss``, ``tokens_per_s``, ``truncated_rate``...; ``{"kind": "eval", "step": N, ...}``
  lines carry ``accuracy/greedy``, ``accuracy/sampled``, ``reward/mean``, ``reward/<dimension>/mean``,
  ``response_length/mean`` (step 0 = the base model). Any key may be missing on any line; unknown
  keys and kinds are ignored; a line without ``kind`` counts as ``train``; when a step is logged
  twice (a resumed run) the later line wins.
- ``config.json`` (optional): the resolved run config, for the header.

Output (default ``RUN_DIR/report/``): ``report.png`` (the dashboard), ``report.html`` (self-contained:
the PNG as a ``data:`` URI, a table of first/final/best metrics, the warnings, no external assets) and
``report.json`` (the warnings and final metrics as data). The warnings are those of
:func:`reinforge_report.detectors.detect_warnings`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .detectors import HackingWarning, Thresholds, detect_warnings
from .header import header as run_header
from .header import load_config
from .metrics import load_metrics
from .page import metric_summary, render_page
from .plot import plot_dashboard

__all__ = ["REPORT_DIR", "ReportResult", "write_report"]

REPORT_DIR = "report"  # the default output folder, inside the run folder


@dataclass
class ReportResult:
    """What :func:`write_report` wrote, and what it found."""

    out_dir: Path
    png: Path  # the dashboard
    html: Path
    json: Path
    warnings: list[HackingWarning]
    notes: list[str] = field(default_factory=list)  # checks skipped for lack of data, unreadable config...

    @property
    def pngs(self) -> list[Path]:
        return [self.png]

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "png": str(self.png),
            "html": str(self.html),
            "json": str(self.json),
            "warnings": [w.to_dict() for w in self.warnings],
            "notes": list(self.notes),
        }


def write_report(
    run_dir: str | Path, out_dir: str | Path | None = None, *, thresholds: Thresholds | None = None
) -> ReportResult:
    """Write ``report.png``, ``report.html`` and ``report.json`` for a run folder (default into ``RUN_DIR/report``).

    Raises :class:`~reinforge.errors.ConfigError` for a missing folder or ``metrics.jsonl`` or a
    malformed line, and :class:`~reinforge.errors.MissingExtraError` when matplotlib cannot be imported.
    """
    th = thresholds or Thresholds()
    data = load_metrics(run_dir)
    run_path = data.path.parent
    notes: list[str] = []
    if data.skipped:
        notes.append(f"{data.skipped} line(s) of {data.path} had no numeric step and were skipped")
    config = load_config(run_path, notes)
    header = run_header(config)
    warnings = detect_warnings(data, th, notes)
    out = Path(out_dir) if out_dir is not None else run_path / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    png, page, summary = out / "report.png", out / "report.html", out / "report.json"
    plot_dashboard(data, warnings, header, th, png, config)
    page.write_text(render_page(data, warnings, notes, header, th, png), encoding="utf-8")
    result = ReportResult(out_dir=out, png=png, html=page, json=summary, warnings=warnings, notes=notes)
    payload = {
        **result.to_dict(),
        "run_dir": str(run_path),
        "header": header,
        "thresholds": dataclasses.asdict(th),
        "metrics": metric_summary(data),
    }
    summary.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return result
