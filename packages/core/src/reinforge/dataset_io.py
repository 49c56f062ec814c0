"""Reading a run's datasets: local folders and files, the Hugging Face Hub, and why a file cannot be read.

:class:`~reinforge.config.DatasetConfig` says what to read; this module reads
it (``DatasetConfig.load()``/``rows()``/``preview()`` call here), so the config
module stays a leaf that imports no I/O. ``datasets`` is an optional extra,
imported only on use. A path that is not on disk is looked up on the Hub only
when it reads ``org/name``, after one TCP probe says the Hub can be reached
(offline, ``HF_HUB_OFFLINE=1``, only the local cache is); nothing is retried.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import require
from .settings import suggest

if TYPE_CHECKING:
    from .config import DatasetConfig

__all__ = ["dataset_rows", "load_dataset", "looks_local", "preview_dataset"]

_DATA_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".tsv": "csv",
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".txt": "text",
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def looks_local(path: str) -> bool:
    """True for paths no Hub id could be: explicit dirs, data-file suffixes, deep paths."""
    return (
        os.path.isabs(path)
        or path in (".", "..")
        or path.startswith(("./", "../", "~", ".\\", "..\\"))
        or "\\" in path
        or path.count("/") >= 2
        or Path(path).suffix.lower() in _DATA_BUILDERS
    )


def _hub_id_like(path: str) -> bool:
    """True for ``org/name``, the only form under which a path that is not on disk is looked up on the Hub."""
    return bool(_HUB_ID.match(path)) and not looks_local(path)


def _offline() -> bool:
    """``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` is set: the Hub is not asked, only the local cache."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in _OFFLINE_VARS)


def _hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hub cannot be reached (one TCP connect, no retries), or None when it can (or a proxy is set)."""
    import socket
    from urllib.parse import urlsplit

    if any(os.environ.get(v) for v in _PROXY_VARS):
        return None  # the proxy decides; datasets is then asked with no retries
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or exc}"
    return None


def _innermost(exc: BaseException) -> str:
    """``Type: message`` of the deepest cause, first line only (datasets wraps the real error)."""
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        nxt = exc.__cause__ or exc.__context__
        if nxt is None:
            break
        exc = nxt
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_JSON_TYPES = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}


def _find_bad_json(path: Path) -> str | None:
    """The first line of a JSON (lines) file that ``datasets`` cannot read, as ``file:line: what``; None if none.

    Invalid JSON, or a row that is not an object.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"{path}: cannot read it: {exc}"
    lines = text.splitlines()
    first = next((s for s in lines if s.strip()), "")
    rows: list[tuple[int, Any]] = []
    try:
        json.loads(first)
        line_mode = True
    except json.JSONDecodeError:
        line_mode = path.suffix.lower() == ".jsonl"
    if not line_mode:  # one JSON document: a list of rows, or an object holding one
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            return f"{path}:{exc.lineno}: invalid JSON: {exc.msg} (column {exc.colno})"
        if isinstance(doc, dict):
            doc = next((v for v in doc.values() if isinstance(v, list)), [])
        rows = [(0, item) for item in doc] if isinstance(doc, list) else []
    else:
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rows.append((lineno, json.loads(line)))
            except json.JSONDecodeError as exc:
                return f"{path}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno})"
    for index, (lineno, row) in enumerate(rows):
        if not isinstance(row, dict):
            at = f"{path}:{lineno}" if lineno else f"{path}: row {index}"
            return f"{at}: expected a JSON object, got {_JSON_TYPES.get(type(row), type(row).__name__)}"
    return None


def load_dataset(cfg: DatasetConfig) -> Any:
    """The split as a ``datasets.Dataset`` (limit and shuffle applied)."""
    datasets = require("datasets", "datasets")
    local = Path(cfg.path).expanduser()
    if local.exists():
        ds = _load_local(cfg, datasets, local)
    elif looks_local(cfg.path):
        raise cfg.field_error("path", f"{cfg.path!r} does not exist (looked for {local.absolute()})")
    elif not _hub_id_like(cfg.path):
        raise cfg.field_error(
            "path",
            f"{cfg.path!r} does not exist (looked for {local.absolute()}) and is not a Hugging Face Hub "
            "dataset id, which reads 'org/name'",
        )
    else:
        ds = _load_hub(cfg, datasets)
    if cfg.limit is not None:
        ds = ds.select(range(min(cfg.limit, len(ds))))
    if cfg.shuffle:
        ds = ds.shuffle(seed=cfg.seed)
    return ds


def _load_local(cfg: DatasetConfig, datasets: Any, local: Path) -> Any:
    if local.is_dir() and ((local / "dataset_dict.json").exists() or (local / "state.json").exists()):
        saved = datasets.load_from_disk(str(local))  # written by Dataset(Dict).save_to_disk
        return _pick(cfg, saved, list(saved)) if isinstance(saved, datasets.DatasetDict) else saved
    if local.is_dir():
        return _readable(
            cfg,
            local,
            lambda: _split_or_error(
                cfg,
                lambda split: datasets.load_dataset(str(local), cfg.name, split=split),
                lambda: list(datasets.load_dataset(str(local), cfg.name)),
            ),
        )
    suffix = local.suffix.lower()
    builder = _DATA_BUILDERS.get(suffix)
    if builder is None:
        known = ", ".join(sorted(_DATA_BUILDERS))
        raise cfg.field_error("path", f"cannot tell the format of {cfg.path!r}; use a file ending in {known}")
    kwargs = {"delimiter": "\t"} if suffix == ".tsv" else {}
    # a single file is the requested split, whatever its name (train.jsonl as split "test" is fine)
    split = cfg.split_name
    return _readable(
        cfg, local, lambda: datasets.load_dataset(builder, data_files={split: str(local)}, split=split, **kwargs)
    )


def _readable(cfg: DatasetConfig, local: Path, load: Callable[[], Any]) -> Any:
    """``load()``; a file ``datasets`` cannot parse is a ConfigError naming the file and the line."""
    import logging

    from .errors import ReinforgeError

    quiet = logging.getLogger("datasets.packaged_modules")  # it logs the parser's traceback; we explain it
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        return load()
    except ReinforgeError:
        raise
    except Exception as exc:
        if local.is_dir():
            files = sorted(p for p in local.rglob("*") if p.suffix.lower() in (".json", ".jsonl"))
        else:
            files = [local] if local.suffix.lower() in (".json", ".jsonl") else []
        for file in files:
            problem = _find_bad_json(file)
            if problem is not None:
                raise cfg.field_error("path", problem) from exc
        if isinstance(exc, ValueError) and "split" in str(exc).lower():
            raise
        raise cfg.field_error("path", f"{local}: datasets cannot read it: {_innermost(exc)}") from exc
    finally:
        quiet.setLevel(level)


def _load_hub(cfg: DatasetConfig, datasets: Any) -> Any:
    not_local = f"{cfg.path!r} is not a local path (looked in {Path.cwd()})"
    if not _offline():
        problem = _hub_unreachable()
        if problem is not None:
            raise cfg.field_error(
                "path",
                f"{not_local} and the Hugging Face Hub cannot be reached ({problem}); "
                "if the dataset is in your local cache, set HF_HUB_OFFLINE=1",
            )
    config = datasets.DownloadConfig(max_retries=0)
    try:
        return _split_or_error(
            cfg,
            lambda split: datasets.load_dataset(cfg.path, cfg.name, split=split, download_config=config),
            lambda: datasets.get_dataset_split_names(cfg.path, cfg.name, download_config=config),
        )
    except (FileNotFoundError, ConnectionError, datasets.exceptions.DatasetNotFoundError) as exc:
        offline = " (offline: only the local cache was searched)" if _offline() else ""
        raise cfg.field_error(
            "path",
            f"{not_local} and could not be loaded from the Hugging Face Hub{offline}: {exc}",
        ) from exc


def _split_or_error(cfg: DatasetConfig, load: Callable[[str], Any], split_names: Callable[[], list[str]]) -> Any:
    try:
        return load(cfg.split_name)
    except ValueError as exc:
        if "split" not in str(exc).lower():
            raise
        names = split_names()
    return _pick(cfg, {}, names)


def _pick(cfg: DatasetConfig, splits: Any, available: list[str]) -> Any:
    if cfg.split_name in splits:
        return splits[cfg.split_name]
    raise cfg.field_error(
        "split",
        f"{cfg.split_name!r} is not a split of {cfg.path!r}; available: {', '.join(available)}"
        f"{suggest(cfg.split_name, available)}",
    )


def dataset_rows(cfg: DatasetConfig) -> list[dict[str, Any]]:
    """Every task as a plain dict, after limit and shuffle."""
    return [dict(row) for row in load_dataset(cfg)]


def preview_dataset(cfg: DatasetConfig, n: int = 5) -> list[dict[str, Any]]:
    """Print the first ``n`` tasks as indented JSON and return them, to check loading."""
    data = load_dataset(cfg)
    rows = [dict(data[i]) for i in range(min(n, len(data)))]
    print(json.dumps(rows, indent=2, ensure_ascii=False, default=str))
    return rows
