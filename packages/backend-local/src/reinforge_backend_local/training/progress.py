"""What a training run tells the terminal: the progress bar, the evaluation and summary lines."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["Progress", "eval_line", "say", "summary_line"]


def say(message: str) -> None:
    print(f"reinforge: {message}", file=sys.stderr, flush=True)


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def eval_line(record: dict[str, Any]) -> str:
    line = (
        f"eval at step {record['step']}: greedy accuracy {_pct(record.get('accuracy/greedy'))}, "
        f"sampled {_pct(record.get('accuracy/sampled'))}, reward {record.get('reward/mean', float('nan')):.3f}"
    )
    if "tool_use/greedy" in record:
        line += f", tool use {_pct(record['tool_use/greedy'])} (sampled {_pct(record.get('tool_use/sampled'))})"
    return line


def summary_line(summary: dict[str, Any]) -> str:
    line = (
        f"{summary['status']} after {summary['steps']} steps; held-out greedy accuracy "
        f"{_pct(summary['accuracy_before'])} -> {_pct(summary['accuracy_after'])}"
    )
    if summary.get("tool_use_before") is not None or summary.get("tool_use_after") is not None:
        line += f", tool use {_pct(summary.get('tool_use_before'))} -> {_pct(summary.get('tool_use_after'))}"
    line += f"; run folder {summary['run_dir']}"
    if summary.get("stop_reason"):
        line += f"; stopped: {summary['stop_reason']}"
    return line


class Progress:
    """A rich progress bar with step, reward, tokens/s and ETA; plain lines when rich is missing."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled
        self._bar: Any = None
        self._task: Any = None

    def start(self, done: int) -> None:
        if not self.enabled:
            return
        try:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        except ImportError:
            return
        self._bar = Progress(
            TextColumn("step {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            transient=False,
        )
        self._bar.start()
        self._task = self._bar.add_task("train", total=self.total, completed=done, info="")

    def update(self, step: int, record: dict[str, Any]) -> None:
        info = (
            f"reward {record.get('reward/mean', float('nan')):.3f}  {record['tokens_per_s']:.0f} tok/s  "
            f"{record['step_seconds']:.1f} s/step"
        )
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info)
        elif self.enabled:
            say(f"step {step}/{self.total}: {info}")

    def note(self, line: str) -> None:
        if self._bar is not None:
            self._bar.console.print(line)
        else:
            say(line)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            self.enabled = False
