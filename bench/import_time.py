"""Import time of ``reinforge`` (median of several fresh interpreters) and what it pulls in.

Prints a JSON object as its last line: median_ms, cumulative_us of the
``reinforge`` line in ``-X importtime``, and heavy modules found (none expected).
"""

from __future__ import annotations

import statistics
import subprocess
import sys

from _common import emit

HEAVY = ("datasets", "litellm", "torch", "yaml", "numpy", "pandas", "pyarrow", "openai", "transformers")


def one_run() -> tuple[float, set[str]]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import reinforge"], capture_output=True, text=True, check=True
    )
    cumulative, modules = 0.0, set()
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = [p.strip() for p in line[len("import time:") :].split("|")]
        if not parts[1].isdigit():
            continue
        modules.add(parts[2].split(".")[0])
        if parts[2] == "reinforge":
            cumulative = float(parts[1])
    return cumulative, modules


def main() -> None:
    runs = [one_run() for _ in range(7)]
    cumulative = [r[0] for r in runs]
    heavy = sorted(set().union(*(r[1] for r in runs)) & set(HEAVY))
    result = {
        "bench": "import_time",
        "reinforge_cumulative_ms_median": round(statistics.median(cumulative) / 1000, 2),
        "reinforge_cumulative_ms_min": round(min(cumulative) / 1000, 2),
        "heavy_modules": heavy,
        "python": sys.version.split()[0],
    }
    emit(result)


if __name__ == "__main__":
    main()
