"""``reinforge report RUN_DIR``: the command line of :func:`~reinforge_report.report.write_report`."""

from __future__ import annotations

import argparse
import json

from .detectors import Thresholds
from .report import write_report

__all__ = ["HELP", "add_arguments", "run"]

HELP = "plots of a training run, with reward-hacking warnings"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``reinforge report``."""
    parser.add_argument("run_dir", help="run folder holding metrics.jsonl (and config.json)")
    parser.add_argument("--out", dest="out_dir", help="output folder (default: RUN_DIR/report)")
    parser.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change a warning threshold, e.g. entropy_collapse_frac=0.1 (repeatable; see reinforge_report.Thresholds)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--fail-on-warning", action="store_true", help="exit with status 2 when a reward-hacking warning is found"
    )


def run(args: argparse.Namespace) -> int:
    """``reinforge report``: write the report, print where it is and the warnings."""
    result = write_report(args.run_dir, getattr(args, "out_dir", None), thresholds=Thresholds.parse(args.threshold))
    if getattr(args, "json", False):
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(f"dashboard: {result.png}")
        print(f"report:    {result.html}")
        if result.warnings:
            print(f"{len(result.warnings)} reward-hacking warning(s):")
            for w in result.warnings:
                print(f"  - {w}")
        else:
            print("no reward-hacking warnings")
        for note in result.notes:
            print(f"note: {note}")
    return 2 if result.warnings and getattr(args, "fail_on_warning", False) else 0
