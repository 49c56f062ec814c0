"""Run configuration: the dataclasses of a run file and their checks, and nothing else.

The same run can be written in Python (``tune(...)``) or YAML
(``reinforge tune run.yaml``); both build these classes, so a typo or a wrong
type fails before any model loads, naming the key (and the file). This module
is a leaf: it imports only :mod:`reinforge.errors` and :mod:`reinforge.settings`.
Reading a dataset is :mod:`reinforge.dataset_io`'s job (``DatasetConfig.load()``
calls it on use); reading, checking and writing a run file is :mod:`reinforge.runfile`'s.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .errors import ConfigError
from .settings import FieldError, Settings, at_least, convert, finite, load, one_of

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
    "from_dict",
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
    spec: ComponentSpec = convert(obj, ComponentSpec, where=where, key="")
    return spec


# --------------------------------------------------------------------------- datasets

DEFAULT_SPLIT = "train"  # what a dataset with no ``split`` reads (a single file is read whole under this name)


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

    def set_origin(self, key: str, where: str = "") -> None:
        """Remember where this config came from (its run-file key and file), for error messages."""
        self._key, self._where = key, where

    def field_error(self, field_name: str, detail: str) -> ConfigError:
        """A :class:`ConfigError` about one of this dataset's keys, naming the key and the run file."""
        loc = f" ({self._where})" if self._where else ""
        return ConfigError(f"{self._key}.{field_name}: {detail}{loc}")

    # Reading is done by reinforge.dataset_io (imported on use: this module does no I/O).

    def load(self) -> Any:
        """The split as a ``datasets.Dataset`` (limit and shuffle applied)."""
        from .dataset_io import load_dataset

        return load_dataset(self)

    def rows(self) -> list[dict[str, Any]]:
        """Every task as a plain dict, after limit and shuffle."""
        from .dataset_io import dataset_rows

        return dataset_rows(self)

    def preview(self, n: int = 5) -> list[dict[str, Any]]:
        """Print the first ``n`` tasks as indented JSON and return them, to check loading."""
        from .dataset_io import preview_dataset

        return preview_dataset(self, n)


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
    """A whole run, as written in ``run.yaml``; ``source`` and ``base_dir`` are set by ``runfile.load_run``."""

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
    # plugins' own top-level sections (register_run_sections): raw until checked against the run's registry
    sections: dict[str, Any] = field(default_factory=dict, metadata=_NOT_YAML)
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
                ds.set_origin(key, self.source or "")

    def section(self, name: str) -> Any:
        """A plugin's checked section (``register_run_sections``); ``None`` when the run file has none.

        :raises ConfigError: the section is still unchecked (the run was not loaded or built with its
            plugins' registry), so its values could be anything.
        """
        value = self.sections.get(name)
        if value is None or isinstance(value, Settings):
            return value
        raise ConfigError(f"{self.where(name)}: not checked yet: load the run with its registry (load_run(registry=))")

    def where(self, key: str) -> str:
        """``"run.yaml: key"`` for error messages about this run."""
        return f"{self.source}: {key}" if self.source else key
