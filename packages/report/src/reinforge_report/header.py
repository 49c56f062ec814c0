"""The report's header: project, experiment, model and algorithm, from the run folder's ``config.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["CONFIG_FILE", "header", "load_config"]

CONFIG_FILE = "config.json"


def load_config(run_dir: Path, notes: list[str]) -> dict[str, Any]:
    """The resolved run config in ``RUN_DIR/config.json``; ``{}`` when it is absent, and a note when unreadable."""
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        notes.append(f"{path} could not be read ({exc}); the header shows no config")
        return {}
    if not isinstance(config, dict):
        notes.append(f"{path} is not a JSON object; the header shows no config")
        return {}
    return config


def header(config: dict[str, Any]) -> dict[str, str]:
    """project / experiment / model / algorithm from a resolved run config (tolerant of its shape)."""

    def pick(obj: Any, *names: str) -> Any:
        if not isinstance(obj, dict):
            return None
        for name in names:
            if obj.get(name) not in (None, ""):
                return obj[name]
        return None

    out: dict[str, str] = {}
    if (v := pick(config, "project_name", "project")) is not None:
        out["project"] = str(v)
    if (v := pick(config, "experiment_name", "experiment", "name")) is not None:
        out["experiment"] = str(v)
    model = config.get("model")
    if (v := pick(model, "model_path", "name", "path") if isinstance(model, dict) else model) is not None:
        out["model"] = str(v)
    algo = config.get("algorithm")
    if isinstance(algo, dict):
        name = pick(algo, "algorithm_type", "name", "type")
        extras = []
        for key, label in (("learning_rate", "lr"), ("group_size", "group"), ("batch_size", "batch")):
            if algo.get(key) is not None:
                extras.append(
                    f"{label}={algo[key]:g}" if isinstance(algo[key], (int, float)) else f"{label}={algo[key]}"
                )
        if name is not None or extras:
            out["algorithm"] = " ".join([str(name or "?"), *(["(" + ", ".join(extras) + ")"] if extras else [])])
    elif algo is not None:
        out["algorithm"] = str(algo)
    return out
