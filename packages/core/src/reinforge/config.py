"""Run configuration: dataclasses, the YAML loader and their checks.

The same run can be written in Python (``tune(...)``) or YAML
(``reinforge tune run.yaml``); both go through the same checks, so a typo or a
wrong type fails before any model loads, naming the key (and the file).
``datasets`` and ``pyyaml`` are optional extras and are imported only on use.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .errors import ConfigError, require
from .settings import FieldError, Settings, _convert, at_least, finite, load, one_of, settings_keys, suggest

__all__ = [
    "MODEL_INTERFACES",
    "AlgorithmConfig",
    "ComponentSpec",
    "DatasetConfig",
    "EvalConfig",
    "ModelConfig",
    "RewardConfig",
    "RunConfig",
    "RunnerConfig",
    "ScoreConfig",
    "TunerModelConfig",
    "as_component",
    "build_run",
    "dump_run",
    "from_dict",
    "load_run",
    "to_dict",
]

# What a workflow's ``model`` is: a reinforge ChatModel, or an AgentScope model (reinforge[agentscope]).
# Unset: decided by the workflow's ``model`` annotation (see reinforge.agentscope_model).
MODEL_INTERFACES = ("reinforge", "agentscope")
_NOT_YAML = {"yaml": False}  # field metadata: set by the loader, never written in a run file


def from_dict(cls: type, data: Any, *, where: str = "run.yaml", key_prefix: str = "") -> Any:
    """Build the config dataclass ``cls`` from plain data (parsed YAML/JSON); see :func:`reinforge.settings.load`.

    Errors are :class:`ConfigError` starting with ``where`` and naming the
    dotted key, e.g. ``run.yaml: unknown key 'algorithm.grop_size' (did you
    mean 'group_size'?)``.
    """
    return load(cls, data, where=where, prefix=key_prefix)


def as_component(obj: Any, *, where: str = "") -> ComponentSpec:
    """A :class:`ComponentSpec` from a callable, a reference string, a mapping or a spec."""
    try:
        return _convert(obj, ComponentSpec, "")
    except FieldError as exc:
        raise ConfigError(f"{where}: {exc.render()}" if where else exc.render()) from None


def build_run(data: dict[str, Any], *, options: dict[str, Any] | None = None, where: str = "tune()") -> RunConfig:
    """A :class:`RunConfig` from keyword-style data (config objects or mappings) plus extra run-file keys.

    A key given both in ``data`` (not None) and in ``options`` is an error, not a silent override.
    """
    merged = dict(data)
    for key, value in (options or {}).items():
        if merged.get(key) is not None:
            raise ConfigError(f"{where}: {key!r} is given twice")
        merged[key] = value
    return from_dict(RunConfig, merged, where=where)


def to_dict(obj: Any, *, redact: bool = True) -> Any:
    """Plain data for YAML/JSON, the inverse of :func:`from_dict`.

    Loader-only fields are left out; API keys are dropped when ``redact`` so a
    run directory never holds a secret. Callables become ``module:qualname``.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for name in settings_keys(type(obj)):
            if redact and name == "api_key":
                continue
            out[name] = to_dict(getattr(obj, name), redact=redact)
        if getattr(type(obj), "_open_keys", False):  # a backend's keys sit beside the fields
            out.update(to_dict(getattr(obj, "options", {}), redact=redact))
        return out
    if isinstance(obj, (list, tuple)):
        return [to_dict(v, redact=redact) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v, redact=redact) for k, v in obj.items()}
    if callable(obj):
        from .signatures import describe

        return describe(obj)
    return obj


# --------------------------------------------------------------------------- datasets

_DATA_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".tsv": "csv",
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".txt": "text",
}
DEFAULT_SPLIT = "train"  # what a dataset with no ``split`` reads (a single file is read whole under this name)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def _looks_local(path: str) -> bool:
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
    return bool(_HUB_ID.match(path)) and not _looks_local(path)


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


@dataclass
class DatasetConfig(Settings):
    """One split of a Hugging Face ``datasets`` dataset: a local folder or file, or a Hub id (``org/name``).

    ``split`` is the split to read; unset, a folder or Hub dataset reads its
    ``train`` split and a single file is read whole. ``limit`` keeps the first
    rows, then ``shuffle`` reorders them with ``seed``. A path that is not on
    disk is looked up on the Hub only when it reads ``org/name``; offline
    (``HF_HUB_OFFLINE=1``) only the local cache is. Nothing is retried.
    """

    path: str
    name: str | None = None
    split: str | None = None
    total_epochs: int = 1
    total_steps: int | None = None
    limit: int | None = None
    shuffle: bool = False
    seed: int = 42

    def check(self) -> None:
        if not self.path:
            raise FieldError("path", "must not be empty")
        if self.split is not None and not self.split:
            raise FieldError("split", "must not be empty")
        at_least("total_epochs", self.total_epochs, 1)
        at_least("total_steps", self.total_steps, 1)
        at_least("limit", self.limit, 1)
        self._key, self._where = type(self).__name__, ""

    @property
    def split_name(self) -> str:
        """The split actually read: ``split``, or ``train`` when none is set."""
        return self.split or DEFAULT_SPLIT

    @property
    def is_file(self) -> bool:
        """True when ``path`` is one local data file (read whole, whatever the split is called)."""
        local = Path(self.path).expanduser()
        return local.is_file()

    def describe(self) -> str:
        """What is read, for messages: ``split 'test' of data`` or ``data.jsonl (the whole file)``."""
        if self.is_file and self.split is None:
            return f"{self.path} (the whole file)"
        return f"split {self.split_name!r} of {self.path}"

    def _origin(self, key: str, where: str = "") -> None:
        """Remember where this config came from, for error messages."""
        self._key, self._where = key, where

    def _error(self, field_name: str, detail: str) -> ConfigError:
        loc = f" ({self._where})" if self._where else ""
        return ConfigError(f"{self._key}.{field_name}: {detail}{loc}")

    def load(self) -> Any:
        """The split as a ``datasets.Dataset`` (limit and shuffle applied)."""
        datasets = require("datasets", "datasets")
        local = Path(self.path).expanduser()
        if local.exists():
            ds = self._load_local(datasets, local)
        elif _looks_local(self.path):
            raise self._error("path", f"{self.path!r} does not exist (looked for {local.absolute()})")
        elif not _hub_id_like(self.path):
            raise self._error(
                "path",
                f"{self.path!r} does not exist (looked for {local.absolute()}) and is not a Hugging Face Hub "
                "dataset id, which reads 'org/name'",
            )
        else:
            ds = self._load_hub(datasets)
        if self.limit is not None:
            ds = ds.select(range(min(self.limit, len(ds))))
        if self.shuffle:
            ds = ds.shuffle(seed=self.seed)
        return ds

    def _load_local(self, datasets: Any, local: Path) -> Any:
        if local.is_dir() and ((local / "dataset_dict.json").exists() or (local / "state.json").exists()):
            saved = datasets.load_from_disk(str(local))  # written by Dataset(Dict).save_to_disk
            return self._pick(saved, list(saved)) if isinstance(saved, datasets.DatasetDict) else saved
        if local.is_dir():
            return self._readable(
                local,
                lambda: self._split_or_error(
                    lambda split: datasets.load_dataset(str(local), self.name, split=split),
                    lambda: list(datasets.load_dataset(str(local), self.name)),
                ),
            )
        suffix = local.suffix.lower()
        builder = _DATA_BUILDERS.get(suffix)
        if builder is None:
            known = ", ".join(sorted(_DATA_BUILDERS))
            raise self._error("path", f"cannot tell the format of {self.path!r}; use a file ending in {known}")
        kwargs = {"delimiter": "\t"} if suffix == ".tsv" else {}
        # a single file is the requested split, whatever its name (train.jsonl as split "test" is fine)
        split = self.split_name
        return self._readable(
            local, lambda: datasets.load_dataset(builder, data_files={split: str(local)}, split=split, **kwargs)
        )

    def _readable(self, local: Path, load: Callable[[], Any]) -> Any:
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
                    raise self._error("path", problem) from exc
            if isinstance(exc, ValueError) and "split" in str(exc).lower():
                raise
            raise self._error("path", f"{local}: datasets cannot read it: {_innermost(exc)}") from exc
        finally:
            quiet.setLevel(level)

    def _load_hub(self, datasets: Any) -> Any:
        not_local = f"{self.path!r} is not a local path (looked in {Path.cwd()})"
        if not _offline():
            problem = _hub_unreachable()
            if problem is not None:
                raise self._error(
                    "path",
                    f"{not_local} and the Hugging Face Hub cannot be reached ({problem}); "
                    "if the dataset is in your local cache, set HF_HUB_OFFLINE=1",
                )
        config = datasets.DownloadConfig(max_retries=0)
        try:
            return self._split_or_error(
                lambda split: datasets.load_dataset(self.path, self.name, split=split, download_config=config),
                lambda: datasets.get_dataset_split_names(self.path, self.name, download_config=config),
            )
        except (FileNotFoundError, ConnectionError, datasets.exceptions.DatasetNotFoundError) as exc:
            offline = " (offline: only the local cache was searched)" if _offline() else ""
            raise self._error(
                "path",
                f"{not_local} and could not be loaded from the Hugging Face Hub{offline}: {exc}",
            ) from exc

    def _split_or_error(self, load: Callable[[str], Any], split_names: Callable[[], list[str]]) -> Any:
        try:
            return load(self.split_name)
        except ValueError as exc:
            if "split" not in str(exc).lower():
                raise
            names = split_names()
        return self._pick({}, names)

    def _pick(self, splits: Any, available: list[str]) -> Any:
        if self.split_name in splits:
            return splits[self.split_name]
        raise self._error(
            "split",
            f"{self.split_name!r} is not a split of {self.path!r}; available: {', '.join(available)}"
            f"{suggest(self.split_name, available)}",
        )

    def rows(self) -> list[dict[str, Any]]:
        """Every task as a plain dict, after limit and shuffle."""
        return [dict(row) for row in self.load()]

    def preview(self, n: int = 5) -> list[dict[str, Any]]:
        """Print the first ``n`` tasks as indented JSON and return them, to check loading."""
        ds = self.load()
        rows = [dict(ds[i]) for i in range(min(n, len(ds)))]
        print(json.dumps(rows, indent=2, ensure_ascii=False, default=str))
        return rows


# --------------------------------------------------------------------------- models and algorithm

_DTYPES = ("float32", "float16", "bfloat16", "auto")


@dataclass
class ModelConfig(Settings):
    """The trainable model (or an auxiliary one) and how it samples.

    Prefer ``api_key_env`` to ``api_key``: the key is read when needed and is
    never written to a run directory.
    """

    model_path: str
    max_model_len: int = 4096
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 512
    api_base: str | None = None
    api_key: str | None = field(default=None, repr=False)
    api_key_env: str | None = None
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    full_finetune: bool = False
    dtype: str = "float32"
    seed: int | None = None

    def check(self) -> None:
        if not self.model_path:
            raise FieldError("model_path", "must not be empty")
        at_least("max_model_len", self.max_model_len, 1)
        at_least("max_tokens", self.max_tokens, 1)
        if self.max_tokens > self.max_model_len:
            raise FieldError("max_tokens", f"({self.max_tokens}) must not exceed max_model_len ({self.max_model_len})")
        at_least("temperature", self.temperature, 0.0)
        finite("temperature", self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise FieldError("top_p", f"must be in (0, 1], got {self.top_p}")
        at_least("lora_rank", self.lora_rank, 1)
        at_least("lora_alpha", self.lora_alpha, 1)
        if not 0.0 <= self.lora_dropout < 1.0:
            raise FieldError("lora_dropout", f"must be in [0, 1), got {self.lora_dropout}")
        one_of("dtype", self.dtype, _DTYPES)
        if self.api_key is not None and self.api_key_env is not None:
            raise FieldError("api_key", "set api_key or api_key_env, not both")

    def sampling(self) -> dict[str, Any]:
        """Sampling keyword arguments for ``ChatModel.chat``."""
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}

    def resolved_api_key(self) -> str | None:
        """``api_key``, or the value of the environment variable ``api_key_env``."""
        if self.api_key_env is None:
            return self.api_key
        value = os.environ.get(self.api_key_env)
        if not value:
            raise ConfigError(f"api_key_env: environment variable {self.api_key_env!r} is not set")
        return value


TunerModelConfig = ModelConfig


@dataclass(init=False)
class AlgorithmConfig(Settings):
    """Which RL algorithm updates the policy: the AgentScope-compatible fields, plus the backend's own keys.

    Core checks the fields below. ``algorithm_type`` and every other key
    (``kl_coef``, ``clip_range``, ... in a run file or as keyword arguments)
    belong to the selected backend, which validates them against the settings
    of that algorithm (:attr:`reinforge.plugin.Backend.algorithms`); they are
    kept in :attr:`options` until then.
    """

    _open_keys: ClassVar[bool] = True  # keys other than the fields are the backend's (in `options`)

    algorithm_type: str = "grpo"
    learning_rate: float = 1e-6
    group_size: int = 8
    batch_size: int = 32
    total_steps: int | None = None
    save_interval_steps: int = 100
    eval_interval_steps: int = 0
    seed: int = 42
    options: dict[str, Any] = field(default_factory=dict, metadata=_NOT_YAML)

    def __init__(
        self,
        algorithm_type: str = "grpo",
        learning_rate: float = 1e-6,
        group_size: int = 8,
        batch_size: int = 32,
        total_steps: int | None = None,
        save_interval_steps: int = 100,
        eval_interval_steps: int = 0,
        seed: int = 42,
        options: dict[str, Any] | None = None,
        **backend_keys: Any,
    ) -> None:
        self.algorithm_type = algorithm_type
        self.learning_rate = learning_rate
        self.group_size = group_size
        self.batch_size = batch_size
        self.total_steps = total_steps
        self.save_interval_steps = save_interval_steps
        self.eval_interval_steps = eval_interval_steps
        self.seed = seed
        self.options = {**(options or {}), **backend_keys}
        self.__post_init__()

    def check(self) -> None:
        if not self.algorithm_type:
            raise FieldError("algorithm_type", "must not be empty")
        at_least("learning_rate", self.learning_rate, 0.0, strict=True)
        finite("learning_rate", self.learning_rate)
        at_least("group_size", self.group_size, 1)
        at_least("batch_size", self.batch_size, 1)
        at_least("total_steps", self.total_steps, 1)
        at_least("save_interval_steps", self.save_interval_steps, 0)
        at_least("eval_interval_steps", self.eval_interval_steps, 0)

    def __getattr__(self, name: str) -> Any:
        # backend keys read as attributes (``algo.kl_coef``) once given; a missing one is an AttributeError
        options = self.__dict__.get("options")
        if options is not None and name in options:
            return options[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")


@dataclass
class RunnerConfig(Settings):
    """How rollouts run: concurrency, timeouts, retries, what to do with short groups."""

    max_concurrency: int = 32
    rollout_timeout_s: float = 600.0
    judge_timeout_s: float = 120.0
    max_retries: int = 2
    drop_incomplete_groups: bool = False
    min_group_size: int = 2

    def check(self) -> None:
        at_least("max_concurrency", self.max_concurrency, 1)
        at_least("rollout_timeout_s", self.rollout_timeout_s, 0.0, strict=True)
        at_least("judge_timeout_s", self.judge_timeout_s, 0.0, strict=True)
        at_least("max_retries", self.max_retries, 0)
        at_least("min_group_size", self.min_group_size, 1)


# --------------------------------------------------------------------------- rewards and components


@dataclass
class ScoreConfig(Settings):
    """Explicit rewards for boundary cases; ``None`` means "judge it normally"."""

    empty: float | None = 0.0
    truncated: float | None = None
    oversized: float | None = 0.0
    max_response_chars: int | None = None
    timeout: float = 0.0
    gate_fail: float = 0.0

    def check(self) -> None:
        for name in ("empty", "truncated", "oversized", "timeout", "gate_fail"):
            finite(name, getattr(self, name))
        at_least("max_response_chars", self.max_response_chars, 1)


@dataclass
class RewardConfig(Settings):
    """How judge scores combine. Metrics are always reported under ``metric_prefix``."""

    metric_prefix: ClassVar[str] = "reward"

    strict_weights: bool = False
    scores: ScoreConfig = field(default_factory=ScoreConfig)


@dataclass
class ComponentSpec(Settings):
    """A reference to one workflow, judge or group reward, plus its settings.

    ``ref`` is a registered name, ``"module:attr"`` or the function itself.
    ``name`` is the stable metric name; by default the registered name or the
    function's ``__name__``.
    """

    ref: str | Callable[..., Any]
    args: dict[str, Any] = field(default_factory=dict)
    weight: float = 1.0
    gate: bool = False
    kind: str | None = None
    metric_weights: dict[str, float] | None = None
    name: str | None = None

    _type_description: ClassVar[str] = "a function reference (a name, 'module:attr' or a mapping with ref:)"

    @classmethod
    def _coerce(cls, value: Any) -> ComponentSpec | None:
        """A bare reference (a name, ``module:attr`` or a callable) is a spec with no settings."""
        return cls(ref=value) if isinstance(value, str) or callable(value) else None

    @classmethod
    def _normalize(cls, data: dict[str, Any]) -> dict[str, Any]:
        # the design brief's form: `{name: <function>, metric: <metric name>, weight, args}`
        if "metric" in data:
            metric = data.pop("metric")
            if "ref" not in data and "name" in data:
                data["ref"] = data.pop("name")
            if "name" in data:
                raise FieldError("metric", "set name or metric (the metric name), not both")
            data["name"] = metric
        if "ref" not in data and isinstance(data.get("name"), str):
            data["ref"] = data["name"]
        return data

    def check(self) -> None:
        if isinstance(self.ref, str) and not self.ref.strip():
            raise FieldError("ref", "must not be empty")
        finite("weight", self.weight)
        if self.kind is not None:
            one_of("kind", self.kind, ("rule", "model"))
        for metric, w in (self.metric_weights or {}).items():
            finite(f"metric_weights.{metric}", w)
        if self.name is not None and not self.name.strip():
            raise FieldError("name", "must not be empty")

    @property
    def metric_name(self) -> str:
        """The stable name this component's metrics are reported under."""
        if self.name:
            return self.name
        if isinstance(self.ref, str):
            return self.ref.rpartition(":")[2].rpartition(".")[2] if ":" in self.ref else self.ref
        ref = self.ref
        return getattr(ref, "reinforge_name", None) or getattr(ref, "__name__", None) or type(ref).__name__


@dataclass
class EvalConfig(Settings):
    """Evaluation: which reward dimension counts as accuracy, and on what split."""

    accuracy_key: str = "reward"
    threshold: float = 1.0
    split: str = "test"
    limit: int | None = None
    group_size: int = 1
    # the tool-use rate: the share of evaluated tasks whose workflow metric ``tool_use_metric`` is
    # positive, counting only tasks whose ``tool_use_field`` is true (those that need a tool) when
    # they have that field; reported when some trajectory has the metric (the react workflow's used_tool)
    tool_use_metric: str | None = "used_tool"
    tool_use_field: str | None = "needs_tool"

    def check(self) -> None:
        finite("threshold", self.threshold)
        if not self.split:
            raise FieldError("split", "must not be empty")
        at_least("limit", self.limit, 1)
        at_least("group_size", self.group_size, 1)


@dataclass(kw_only=True)
class RunConfig(Settings):
    """A whole run, as written in ``run.yaml``; ``source`` and ``base_dir`` are set by :func:`load_run`."""

    project_name: str = "reinforge"
    experiment_name: str = "run"
    backend: str | None = None
    backend_args: dict[str, Any] = field(default_factory=dict)
    workflow: ComponentSpec
    judges: list[ComponentSpec] = field(default_factory=list)
    group_reward: ComponentSpec | None = None
    train_dataset: DatasetConfig | None = None
    eval_dataset: DatasetConfig | None = None
    model: ModelConfig | None = None
    auxiliary_models: dict[str, ModelConfig] = field(default_factory=dict)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    config_path: str | None = None
    model_interface: str | None = None
    # settings of observer plugins' live checks (reinforge-report's reward-hacking sentinels); they check them
    sentinels: dict[str, Any] = field(default_factory=dict)
    source: str | None = field(default=None, metadata=_NOT_YAML)
    base_dir: str | None = field(default=None, metadata=_NOT_YAML)
    # the registry load_run checked the components against: the job and evaluate() build from it
    registry: Any = field(default=None, metadata=_NOT_YAML, repr=False, compare=False)

    @classmethod
    def _normalize(cls, data: dict[str, Any]) -> dict[str, Any]:
        if "judge" in data:
            if "judges" in data:
                raise FieldError("judge", "set either judge (one) or judges (a list), not both")
            one = data.pop("judge")
            data["judges"] = one if isinstance(one, list) else [one]
        return data

    def _prepare(self) -> None:
        if self.judges is None:
            self.judges = []
        elif isinstance(self.judges, (str, ComponentSpec)) or callable(self.judges):
            self.judges = [self.judges]  # type: ignore[list-item]  # one judge given directly in Python

    def check(self) -> None:
        if self.model_interface is not None:
            one_of("model_interface", self.model_interface, MODEL_INTERFACES)
        seen: dict[str, int] = {}
        for i, spec in enumerate(self.judges):
            name = spec.metric_name
            if name in seen:
                raise FieldError(
                    f"judges[{i}]", f"metric name {name!r} is already used by judges[{seen[name]}]; set name:"
                )
            seen[name] = i
        if self.reward.strict_weights:
            weighted = [s.weight for s in self.judges if not s.gate]
            if weighted and abs(sum(weighted) - 1.0) > 1e-6:
                raise FieldError(
                    "judges",
                    f"weights sum to {sum(weighted):g}, not 1 (reward.strict_weights is true; gates not counted)",
                )
        default_min = RunnerConfig().min_group_size
        if self.runner.min_group_size == default_min > self.algorithm.group_size:
            self.runner.min_group_size = self.algorithm.group_size  # the default means "2, or the whole group"
        if self.runner.min_group_size > self.algorithm.group_size:
            raise FieldError(
                "runner.min_group_size",
                f"({self.runner.min_group_size}) is larger than algorithm.group_size ({self.algorithm.group_size})",
            )
        for key in ("train_dataset", "eval_dataset"):
            ds = getattr(self, key)
            if ds is not None:
                ds._origin(key, self.source or "")

    def where(self, key: str) -> str:
        """``"run.yaml: key"`` for error messages about this run."""
        return f"{self.source}: {key}" if self.source else key


# --------------------------------------------------------------------------- YAML


@functools.cache
def _yaml_loader() -> type:
    """A SafeLoader that reads ``1e-6`` as a float (YAML 1.2) and rejects duplicate keys."""
    yaml = require("yaml", "yaml")

    class Loader(yaml.SafeLoader):  # type: ignore[name-defined]
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, typing.Hashable) and key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    float_re = re.compile(
        r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+|\.[0-9_]+(?:[eE][-+]?[0-9]+)?)$"
    )
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", float_re, list("-+0123456789."))
    return Loader


def _read_yaml(path: Path) -> Any:
    yaml = require("yaml", "yaml")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read run file: {exc.strerror or exc}") from exc
    try:
        return yaml.load(text, Loader=_yaml_loader())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        raise ConfigError(f"{loc}: invalid YAML: {problem}" + (f" ({context})" if context else "")) from None


def _local_path(raw: str, base: Path) -> Path | None:
    """``raw`` as an absolute path when it is one, or names something next to the run file."""
    expanded = Path(raw).expanduser()
    if expanded.is_absolute():
        return expanded
    candidate = base / expanded
    return candidate if candidate.exists() or _looks_local(raw) else None


def load_run(path: str | os.PathLike[str], *, registry: Any = None) -> RunConfig:
    """Read a run file: check every key, resolve relative paths and import ``module:attr`` refs.

    Relative dataset, model and ``config_path`` paths are taken against the
    run file's directory, which is also on ``sys.path`` while refs import.
    Registered names are checked too when a ``registry`` is given, and the run
    keeps it (``run.registry``): :func:`~reinforge.job.build_job` and
    :func:`~reinforge.evaluation.evaluate` build its components from it.
    """
    file = Path(path)
    where = str(path)
    data = _read_yaml(file)
    if data is None:
        raise ConfigError(f"{where}: the run file is empty; it needs at least a workflow")
    run: RunConfig = from_dict(RunConfig, data, where=where)
    base = file.resolve().parent
    run.source, run.base_dir, run.registry = str(file.resolve()), str(base), registry
    for key in ("train_dataset", "eval_dataset"):
        ds: DatasetConfig | None = getattr(run, key)
        if ds is None:
            continue
        ds._origin(key, where)
        local = _local_path(ds.path, base)
        if local is not None:
            if not local.exists():
                raise ConfigError(f"{where}: {key}.path: {ds.path!r} does not exist (looked for {local})")
            ds.path = str(local)
    models = {"model": run.model, **{f"auxiliary_models.{k}": m for k, m in run.auxiliary_models.items()}}
    for model in models.values():
        if model is not None and (local := _local_path(model.model_path, base)) is not None and local.exists():
            model.model_path = str(local)
        if model is not None and model.api_key is not None:
            warnings.warn(f"{where}: an API key is written in the run file; use api_key_env instead", stacklevel=2)
    if run.config_path is not None:
        local = _local_path(run.config_path, base)
        if local is None or not local.exists():
            raise ConfigError(f"{where}: config_path: {run.config_path!r} does not exist")
        run.config_path = str(local)
    _check_refs(run, where, registry)
    return run


def _check_refs(run: RunConfig, where: str, registry: Any) -> None:
    """Resolve every component and check its settings (types included); nothing is built."""
    from .components import plan_component

    specs = [("workflow", "workflow", run.workflow)]
    specs += [(f"judges[{i}]", "judge", s) for i, s in enumerate(run.judges)]
    if run.group_reward is not None:
        specs.append(("group_reward", "group_reward", run.group_reward))
    for key, role, spec in specs:
        if registry is not None or not isinstance(spec.ref, str) or ":" in spec.ref:
            plan_component(spec, role, registry, where=f"{where}: {key}", base_dir=run.base_dir)


def dump_run(run: RunConfig, path: str | os.PathLike[str]) -> None:
    """Write ``run`` as YAML that :func:`load_run` reads back (API keys left out)."""
    yaml = require("yaml", "yaml")
    Path(path).write_text(yaml.safe_dump(to_dict(run), sort_keys=False, allow_unicode=True), encoding="utf-8")
