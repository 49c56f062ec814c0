"""``reinforge judge calibrate`` and ``reinforge judge audit`` (added through ``register_commands``)."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from reinforge.plugin import ConfigError

__all__ = ["audit_arguments", "calibrate_arguments", "run_audit", "run_calibrate"]


def _settings(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--args is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--args must be a JSON object of the judge's settings, got {value!r}")
    return value


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--judge", required=True, help="registered judge name or module:attr")
    parser.add_argument("--args", default="{}", help="JSON object of the judge's settings (as in a run file's args)")
    parser.add_argument("--concurrency", type=int, default=8, help="judgments in flight at once (default 8)")
    parser.add_argument("--limit", type=int, help="use only the first N items")
    parser.add_argument("--json", action="store_true", help="also print the report as JSON (last line)")


def calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument("--gold", required=True, help="JSONL of {task, response, label} lines labelled by humans")
    parser.add_argument("--min-spearman", type=float, default=0.6, help="pass threshold on Spearman rho (0.6)")
    parser.add_argument("--min-kendall", type=float, help="also require Kendall tau-b >= this")
    parser.add_argument("--min-kappa", type=float, help="also require Cohen's kappa >= this")
    parser.add_argument("--kappa-weights", choices=["none", "linear", "quadratic"], default="none")
    parser.add_argument(
        "--label-scale", type=int, nargs=2, metavar=("LOW", "HIGH"), help="integer label scale (default: labels' range)"
    )
    parser.add_argument(
        "--max-failed", type=float, default=0.1, help="fail when more than this share of judgments FAILED (0.1)"
    )


def run_calibrate(args: argparse.Namespace) -> int:
    from .calibration import calibrate_async

    report = asyncio.run(
        calibrate_async(
            args.judge,
            args.gold,
            args=_settings(args.args),
            min_spearman=args.min_spearman,
            min_kendall=args.min_kendall,
            min_kappa=args.min_kappa,
            kappa_weights=args.kappa_weights,
            label_scale=tuple(args.label_scale) if args.label_scale else None,
            max_failed_fraction=args.max_failed,
            concurrency=args.concurrency,
            limit=args.limit,
        )
    )
    return _finish(report, args)


def audit_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument("--sample", required=True, help="JSONL of {task, response} lines")
    parser.add_argument("--pairs", type=int, default=50, help="comparisons for the position-flip rate (50)")
    parser.add_argument("--max-flip-rate", type=float, default=0.2, help="fail above this position-flip rate (0.2)")
    parser.add_argument("--max-length-rho", type=float, default=0.3, help="fail above this |length-reward rho| (0.3)")


def run_audit(args: argparse.Namespace) -> int:
    from .audit import audit_async

    report = asyncio.run(
        audit_async(
            args.judge,
            args.sample,
            args=_settings(args.args),
            pairs=args.pairs,
            max_flip_rate=args.max_flip_rate,
            max_length_rho=args.max_length_rho,
            concurrency=args.concurrency,
            limit=args.limit,
        )
    )
    return _finish(report, args)


def _finish(report: Any, args: argparse.Namespace) -> int:
    """Print the table (and JSON); exit code 0 on a pass, 1 on a fail."""
    print(report.table())
    if args.json:
        print(json.dumps(report.to_dict()))
    return 0 if report.passed else 1
