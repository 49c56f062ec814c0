"""Run configuration: dataclasses, the YAML loader and their checks.

The same run can be written in Python (``tune(...)``) or YAML
(``reinforge tune run.yaml``); both go through the same checks, so a typo or a
wrong type fails before any model loads, naming the key (and the file).
``datasets`` and ``pyyaml`` are optional extras and are imported only on use.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import os
import re
import types
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Union

from .errors import ConfigError, require

__all__ = [
    "ALGORITHMS",
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

ALGORITHMS = ("grpo", "multi_step_grpo", "rloo", "reinforce_pp", "gspo", "ppo")
# What a workflow's ``model`` is: a reinforge ChatModel, or an AgentScope model (reinforge[agentscope]).
# Unset: decided by the workflow's ``model`` annotation (see reinforge.agentscope_model).
MODEL_INTERFACES = ("reinforge", "agentscope")
_NOT_YAML = {"yaml": False}  # field metadata: set by the loader, never written in a run file


# --------------------------------------------------------------------------- errors with a key path


class _FieldError(ConfigError):
    """A ConfigError that still knows which key it is about, so callers can prefix it."""

    def __init__(self, path: str, detail: str, *, form: str = "value", owner: str | None = None) -> None:
        self.path, self.detail, self.form, self.owner = path, detail, form, owner
        super().__init__(self.render())

    def render(self) -> str:
        if self.form == "unknown":
            return f"unknown key '{self.path}'{self.detail}"
        if self.form == "missing":
            return f"missing required key '{self.path}'"
        return f"{self.path}: {self.detail}" if self.path else self.detail

    def nested(self, prefix: str) -> _FieldError:
        joiner = "" if not self.path or self.path.startswith("[") else "."
        return _FieldError(f"{prefix}{joiner}{self.path}" if prefix else self.path, self.detail, form=self.form)

    def __str__(self) -> str:
        return f"{self.owner}: {self.render()}" if self.owner else self.render()


def _suggest(word: str, options: typing.Iterable[str], n: int = 1) -> str:
    matches = difflib.get_close_matches(word, list(options), n=n, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(m) for m in matches)}?)" if matches else ""


def _choice(key: str, value: str, options: typing.Sequence[str]) -> None:
    if value not in options:
        raise _FieldError(key, f"must be one of {', '.join(options)}; got {value!r}{_suggest(value, options, n=2)}")


def _at_least(key: str, value: float | None, low: float, *, strict: bool = False) -> None:
    if value is None:
        return
    if (value <= low) if strict else (value < low):
        raise _FieldError(key, f"must be {'greater than' if strict else 'at least'} {low}, got {value}")


def _finite(key: str, value: float | None) -> None:
    if value is not None and not math.isfinite(value):
        raise _FieldError(key, f"must be a finite number, got {value}")


# --------------------------------------------------------------------------- type conversion


def _describe_type(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe_type(a) for a in typing.get_args(tp))
    if origin is list:
        return "a list"
    if origin is dict:
        return "a mapping"
    if origin is Callable or tp is Callable:
        return "a callable"
    if tp is ComponentSpec:
        return "a function reference (a name, 'module:attr' or a mapping with ref:)"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def _describe_value(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the type hint ``tp``, building nested configs from mappings."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None:
            if type(None) in options:
                return None
        else:
            for option in options:
                if option is type(None):
                    continue
                try:
                    return _convert(value, option, key)
                except _FieldError as exc:
                    if exc.path != key or exc.form != "value" or not exc.detail.startswith("expected "):
                        raise  # a nested problem inside a matching type: report it, not the union
        raise _FieldError(key, f"expected {_describe_type(tp)}, got {_describe_value(value)}")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise _FieldError(key, f"expected a list, got {_describe_value(value)}")
        (item,) = typing.get_args(tp) or (Any,)
        return [_convert(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise _FieldError(key, f"expected a mapping, got {_describe_value(value)}")
        _, item = typing.get_args(tp) or (str, Any)
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise _FieldError(key, f"keys must be strings, got {_describe_value(k)}")
            out[k] = _convert(v, item, f"{key}.{k}")
        return out
    if origin is Callable or tp is Callable:
        if callable(value):
            return value
    elif dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if tp is ComponentSpec and (isinstance(value, str) or callable(value)):
            return ComponentSpec(ref=value)
        if isinstance(value, dict):
            try:
                return _build(tp, value)
            except _FieldError as exc:
                raise exc.nested(key) from None
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(value, tp):
        return value
    raise _FieldError(key, f"expected {_describe_type(tp)}, got {_describe_value(value)}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _yaml_fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init and f.metadata.get("yaml", True)}


def _build(cls: type, data: dict[str, Any]) -> Any:
    """Build ``cls`` from a mapping; keys in errors are relative to ``cls``."""
    data = cls._normalize(dict(data)) if hasattr(cls, "_normalize") else dict(data)
    known = _yaml_fields(cls)
    for key in data:
        if not isinstance(key, str):
            raise _FieldError("", f"keys must be strings, got {_describe_value(key)}")
        if key not in known:
            raise _FieldError(key, _suggest(key, known), form="unknown")
    for name, f in known.items():
        if name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise _FieldError(name, "", form="missing")
    return cls(**data)


class _Checked:
    """Mixin: convert and check every field after ``__init__``, then run ``_validate``."""

    def __post_init__(self) -> None:
        try:
            self._prepare()
            hints = _hints(type(self))
            for f in dataclasses.fields(self):
                setattr(self, f.name, _convert(getattr(self, f.name), hints[f.name], f.name))
            self._validate()
        except _FieldError as exc:
            exc.owner = type(self).__name__
            raise

    def _prepare(self) -> None:
        """Hook: reshape shorthand inputs before type checks."""

    def _validate(self) -> None:
        """Hook: value checks that types cannot express."""


def from_dict(cls: type, data: Any, *, where: str = "run.yaml", key_prefix: str = "") -> Any:
    """Build the config dataclass ``cls`` from plain data (parsed YAML/JSON).

    Errors are :class:`ConfigError` starting with ``where`` and naming the
    dotted key, e.g. ``run.yaml: unknown key 'algorithm.grop_size' (did you
    mean 'group_size'?)``.
    """
    if not isinstance(data, dict):
        label = key_prefix or "the top level"
        raise ConfigError(f"{where}: {label} must be a mapping, got {_describe_value(data)}")
    try:
        return _build(cls, data)
    except _FieldError as exc:
        raise ConfigError(f"{where}: {exc.nested(key_prefix).render()}") from None


def as_component(obj: Any, *, where: str = "") -> ComponentSpec:
    """A :class:`ComponentSpec` from a callable, a reference string, a mapping or a spec."""
    try:
        return _convert(obj, ComponentSpec, "")
    except _FieldError as exc:
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
        for name in _yaml_fields(type(obj)):
            if redact and name == "api_key":
                continue
            out[name] = to_dict(getattr(obj, name), redact=redact)
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


@dataclass
class DatasetConfig(_Checked):
    """One split of a Hugging Face ``datasets`` dataset: a local folder or file, or a Hub id.

    ``limit`` keeps the first rows, then ``shuffle`` reorders them with ``seed``.
    """

    path: str
    name: str | None = None
    split: str = "train"
    total_epochs: int = 1
    total_steps: int | None = None
    limit: int | None = None
    shuffle: bool = False
    seed: int = 42

    def _validate(self) -> None:
        if not self.path:
            raise _FieldError("path", "must not be empty")
        if not self.split:
            raise _FieldError("split", "must not be empty")
        _at_least("total_epochs", self.total_epochs, 1)
        _at_least("total_steps", self.total_steps, 1)
        _at_least("limit", self.limit, 1)
        self._key, self._where = type(self).__name__, ""

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
            return self._split_or_error(
                lambda split: datasets.load_dataset(str(local), self.name, split=split),
                lambda: list(datasets.load_dataset(str(local), self.name)),
            )
        suffix = local.suffix.lower()
        builder = _DATA_BUILDERS.get(suffix)
        if builder is None:
            known = ", ".join(sorted(_DATA_BUILDERS))
            raise self._error("path", f"cannot tell the format of {self.path!r}; use a file ending in {known}")
        kwargs = {"delimiter": "\t"} if suffix == ".tsv" else {}
        # a single file is the requested split, whatever its name (train.jsonl as split "test" is fine)
        return datasets.load_dataset(builder, data_files={self.split: str(local)}, split=self.split, **kwargs)

    def _load_hub(self, datasets: Any) -> Any:
        try:
            return self._split_or_error(
                lambda split: datasets.load_dataset(self.path, self.name, split=split),
                lambda: datasets.get_dataset_split_names(self.path, self.name),
            )
        except (FileNotFoundError, ConnectionError, datasets.exceptions.DatasetNotFoundError) as exc:
            raise self._error(
                "path",
                f"{self.path!r} is not a local path (looked in {Path.cwd()}) and could not be loaded from "
                f"the Hugging Face Hub: {exc}",
            ) from exc

    def _split_or_error(self, load: Callable[[str], Any], split_names: Callable[[], list[str]]) -> Any:
        try:
            return load(self.split)
        except ValueError as exc:
            if "split" not in str(exc).lower():
                raise
            names = split_names()
        return self._pick({}, names)

    def _pick(self, splits: Any, available: list[str]) -> Any:
        if self.split in splits:
            return splits[self.split]
        raise self._error(
            "split",
            f"{self.split!r} is not a split of {self.path!r}; available: {', '.join(available)}"
            f"{_suggest(self.split, available)}",
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
class ModelConfig(_Checked):
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

    def _validate(self) -> None:
        if not self.model_path:
            raise _FieldError("model_path", "must not be empty")
        _at_least("max_model_len", self.max_model_len, 1)
        _at_least("max_tokens", self.max_tokens, 1)
        if self.max_tokens > self.max_model_len:
            raise _FieldError("max_tokens", f"({self.max_tokens}) must not exceed max_model_len ({self.max_model_len})")
        _at_least("temperature", self.temperature, 0.0)
        _finite("temperature", self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise _FieldError("top_p", f"must be in (0, 1], got {self.top_p}")
        _at_least("lora_rank", self.lora_rank, 1)
        _at_least("lora_alpha", self.lora_alpha, 1)
        if not 0.0 <= self.lora_dropout < 1.0:
            raise _FieldError("lora_dropout", f"must be in [0, 1), got {self.lora_dropout}")
        _choice("dtype", self.dtype, _DTYPES)
        if self.api_key is not None and self.api_key_env is not None:
            raise _FieldError("api_key", "set api_key or api_key_env, not both")

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


@dataclass
class AlgorithmConfig(_Checked):
    """Which RL algorithm updates the policy, and its hyperparameters."""

    algorithm_type: str = "grpo"
    learning_rate: float = 1e-6
    group_size: int = 8
    batch_size: int = 32
    kl_coef: float = 0.0
    clip_range: float = 0.2
    clip_range_high: float | None = None
    scale_rewards: str = "group"
    loss_agg_mode: str = "token-mean"
    ppo_epochs: int = 1
    max_grad_norm: float = 1.0
    save_interval_steps: int = 100
    eval_interval_steps: int = 0
    seed: int = 42

    def _prepare(self) -> None:
        if self.algorithm_type in ("reinforce++", "reinforce_plus_plus"):
            self.algorithm_type = "reinforce_pp"

    def _validate(self) -> None:
        _choice("algorithm_type", self.algorithm_type, ALGORITHMS)
        _at_least("learning_rate", self.learning_rate, 0.0, strict=True)
        _finite("learning_rate", self.learning_rate)
        _at_least("group_size", self.group_size, 1)
        _at_least("batch_size", self.batch_size, 1)
        _at_least("kl_coef", self.kl_coef, 0.0)
        _at_least("clip_range", self.clip_range, 0.0, strict=True)
        _at_least("clip_range_high", self.clip_range_high, 0.0, strict=True)
        _choice("scale_rewards", self.scale_rewards, ("group", "batch", "none"))
        _choice("loss_agg_mode", self.loss_agg_mode, ("token-mean", "sequence-mean"))
        _at_least("ppo_epochs", self.ppo_epochs, 1)
        _at_least("max_grad_norm", self.max_grad_norm, 0.0, strict=True)
        _at_least("save_interval_steps", self.save_interval_steps, 0)
        _at_least("eval_interval_steps", self.eval_interval_steps, 0)


@dataclass
class RunnerConfig(_Checked):
    """How rollouts run: concurrency, timeouts, retries, what to do with short groups."""

    max_concurrency: int = 32
    rollout_timeout_s: float = 600.0
    judge_timeout_s: float = 120.0
    max_retries: int = 2
    drop_incomplete_groups: bool = False
    min_group_size: int = 2

    def _validate(self) -> None:
        _at_least("max_concurrency", self.max_concurrency, 1)
        _at_least("rollout_timeout_s", self.rollout_timeout_s, 0.0, strict=True)
        _at_least("judge_timeout_s", self.judge_timeout_s, 0.0, strict=True)
        _at_least("max_retries", self.max_retries, 0)
        _at_least("min_group_size", self.min_group_size, 1)


# --------------------------------------------------------------------------- rewards and components


@dataclass
class ScoreConfig(_Checked):
    """Explicit rewards for boundary cases; ``None`` means "judge it normally"."""

    empty: float | None = 0.0
    truncated: float | None = None
    oversized: float | None = 0.0
    max_response_chars: int | None = None
    timeout: float = 0.0
    gate_fail: float = 0.0

    def _validate(self) -> None:
        for name in ("empty", "truncated", "oversized", "timeout", "gate_fail"):
            _finite(name, getattr(self, name))
        _at_least("max_response_chars", self.max_response_chars, 1)


@dataclass
class RewardConfig(_Checked):
    """How judge scores combine. Metrics are always reported under ``metric_prefix``."""

    metric_prefix: ClassVar[str] = "reward"

    strict_weights: bool = False
    scores: ScoreConfig = field(default_factory=ScoreConfig)


@dataclass
class ComponentSpec(_Checked):
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

    @classmethod
    def _normalize(cls, data: dict[str, Any]) -> dict[str, Any]:
        # the design brief's form: `{name: <function>, metric: <metric name>, weight, args}`
        if "metric" in data:
            metric = data.pop("metric")
            if "ref" not in data and "name" in data:
                data["ref"] = data.pop("name")
            if "name" in data:
                raise _FieldError("metric", "set name or metric (the metric name), not both")
            data["name"] = metric
        if "ref" not in data and isinstance(data.get("name"), str):
            data["ref"] = data["name"]
        return data

    def _validate(self) -> None:
        if isinstance(self.ref, str) and not self.ref.strip():
            raise _FieldError("ref", "must not be empty")
        _finite("weight", self.weight)
        if self.kind is not None:
            _choice("kind", self.kind, ("rule", "model"))
        for metric, w in (self.metric_weights or {}).items():
            _finite(f"metric_weights.{metric}", w)
        if self.name is not None and not self.name.strip():
            raise _FieldError("name", "must not be empty")

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
class EvalConfig(_Checked):
    """Evaluation: which reward dimension counts as accuracy, and on what split."""

    accuracy_key: str = "reward"
    threshold: float = 1.0
    split: str = "test"
    limit: int | None = None
    group_size: int = 1

    def _validate(self) -> None:
        _finite("threshold", self.threshold)
        if not self.split:
            raise _FieldError("split", "must not be empty")
        _at_least("limit", self.limit, 1)
        _at_least("group_size", self.group_size, 1)


@dataclass(kw_only=True)
class RunConfig(_Checked):
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
    source: str | None = field(default=None, metadata=_NOT_YAML)
    base_dir: str | None = field(default=None, metadata=_NOT_YAML)

    @classmethod
    def _normalize(cls, data: dict[str, Any]) -> dict[str, Any]:
        if "judge" in data:
            if "judges" in data:
                raise _FieldError("judge", "set either judge (one) or judges (a list), not both")
            one = data.pop("judge")
            data["judges"] = one if isinstance(one, list) else [one]
        return data

    def _prepare(self) -> None:
        if self.judges is None:
            self.judges = []
        elif isinstance(self.judges, (str, ComponentSpec)) or callable(self.judges):
            self.judges = [self.judges]  # one judge given directly in Python

    def _validate(self) -> None:
        if self.model_interface is not None:
            _choice("model_interface", self.model_interface, MODEL_INTERFACES)
        seen: dict[str, int] = {}
        for i, spec in enumerate(self.judges):
            name = spec.metric_name
            if name in seen:
                raise _FieldError(
                    f"judges[{i}]", f"metric name {name!r} is already used by judges[{seen[name]}]; set name:"
                )
            seen[name] = i
        if self.reward.strict_weights:
            weighted = [s.weight for s in self.judges if not s.gate]
            if weighted and abs(sum(weighted) - 1.0) > 1e-6:
                raise _FieldError(
                    "judges",
                    f"weights sum to {sum(weighted):g}, not 1 (reward.strict_weights is true; gates not counted)",
                )
        if self.runner.min_group_size > self.algorithm.group_size:
            raise _FieldError(
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

    class Loader(yaml.SafeLoader):
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
    Registered names are checked too when a ``registry`` is given.
    """
    file = Path(path)
    where = str(path)
    data = _read_yaml(file)
    if data is None:
        raise ConfigError(f"{where}: the run file is empty; it needs at least a workflow")
    run: RunConfig = from_dict(RunConfig, data, where=where)
    base = file.resolve().parent
    run.source, run.base_dir = str(file.resolve()), str(base)
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
    from .refs import resolve_component

    specs = [("workflow", "workflow", run.workflow)]
    specs += [(f"judges[{i}]", "judge", s) for i, s in enumerate(run.judges)]
    if run.group_reward is not None:
        specs.append(("group_reward", "group_reward", run.group_reward))
    for key, role, spec in specs:
        if registry is not None or not isinstance(spec.ref, str) or ":" in spec.ref:
            resolve_component(spec, role, registry, where=f"{where}: {key}", base_dir=run.base_dir)


def dump_run(run: RunConfig, path: str | os.PathLike[str]) -> None:
    """Write ``run`` as YAML that :func:`load_run` reads back (API keys left out)."""
    yaml = require("yaml", "yaml")
    Path(path).write_text(yaml.safe_dump(to_dict(run), sort_keys=False, allow_unicode=True), encoding="utf-8")
