"""The demo: teach SmolLM2-135M-Instruct small sums with GRPO on this machine's CPU.

Runs ``reinforge tune run.yaml`` on the local backend: held-out evaluation of
the base model, training, evaluation again, and the report. It prints the
greedy accuracy before and after and where the report is.
"""

from __future__ import annotations

import sys
from pathlib import Path

from reinforge.cli import main as reinforge_main

HERE = Path(__file__).parent

if __name__ == "__main__":
    sys.exit(reinforge_main(["tune", str(HERE / "run.yaml"), *sys.argv[1:]]))
