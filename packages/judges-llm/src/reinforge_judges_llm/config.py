"""Settings of the LLM judges: what a run file's ``args`` may say, with checks that name the key.

One dataclass per judge kind. The registered judge functions take these fields
as keyword settings (core fills them from ``args``), so ``reinforge try`` and
core's signature check see every key, and an unknown key is an error.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from reinforge.errors import ConfigError

__all__ = [
    "DEFAULT_RUBRIC",
    "JudgeConfig",
    "ListwiseConfig",
    "PairwiseConfig",
    "PointwiseConfig",
    "SELF_PREFERENCE_MODES",
]

DEFAULT_RUBRIC = (
    "How well does the response accomplish the task: is it correct, complete, relevant and clear? "
    "A response that is wrong or ignores the task scores lowest whatever its style."
)
SELF_PREFERENCE_MODES = ("error", "warn", "off")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class JudgeConfig:
    """Settings shared by every LLM judge. See the package README for each key."""

    kind: ClassVar[str] = "judge"
    registered_name: ClassVar[str] = "llm-judge"

    # which model judges: a LiteLLM model (any provider, or a name served at api_base) ...
    model: str | None = None
    api_base: str | None = None
    api_key_env: str | None = None
    # ... or, when `model` is not set, the auxiliary model of this name
    auxiliary_model: str = "judge"
    # what is judged and how
    rubric: str = DEFAULT_RUBRIC
    scale: tuple[int, int] = (1, 5)
    prompt_field: str | None = None
    reference_field: str | None = "reference"
    length_instruction: bool = True
    # sampling: deterministic where the provider allows
    temperature: float = 0.0
    seed: int | None = 0
    max_tokens: int = 1024
    json_mode: bool = False
    # robustness
    timeout_s: float = 60.0
    max_retries: int = 3
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    max_concurrency: int = 8
    cache: bool = True
    cache_path: str | None = None
    # self-preference guard
    policy_model: str | None = None
    self_preference: str = "error"
    # boundary cases: a number scores without calling the model; None sends it to the judge
    empty_score: float | None = 0.0
    truncated_score: float | None = None
    oversized_score: float | None = None
    max_response_chars: int = 16000

    # --------------------------------------------------------------------------------------------
    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_settings(cls, settings: dict[str, Any], *, where: str | None = None) -> JudgeConfig:
        """Build from ``args``; errors name the judge and the key."""
        where = where or f"judge {cls.registered_name!r}"
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(settings) - set(known))
        if unknown:
            raise ConfigError(f"{where}: unknown setting(s) {unknown} in args; known: {', '.join(sorted(known))}")
        values = dict(settings)
        if "scale" in values:
            values["scale"] = _scale(values["scale"], where)
        if "anchors" in values:
            values["anchors"] = _canonical(values["anchors"], where)
        try:
            cfg = cls(**values)
        except TypeError as exc:  # pragma: no cover - unknown keys are caught above
            raise ConfigError(f"{where}: {exc}") from None
        cfg.validate(where)
        return cfg

    def validate(self, where: str) -> None:
        def bad(key: str, detail: str) -> ConfigError:
            return ConfigError(f"{where}: args.{key} {detail}, got {getattr(self, key)!r}")

        for key in ("model", "api_base", "api_key_env", "prompt_field", "reference_field", "cache_path"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise bad(key, "must be a non-empty string or null")
        if not isinstance(self.auxiliary_model, str) or not self.auxiliary_model:
            raise bad("auxiliary_model", "must be the name of an auxiliary model")
        if not isinstance(self.rubric, str) or not self.rubric.strip():
            raise bad("rubric", "must be a non-empty string")
        for key in ("length_instruction", "json_mode", "cache"):
            if not isinstance(getattr(self, key), bool):
                raise bad(key, "must be true or false")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise bad("temperature", "must be a number >= 0")
        if self.seed is not None and not _is_int(self.seed):
            raise bad("seed", "must be an integer or null")
        for key, low in (("max_tokens", 1), ("max_retries", 0), ("max_concurrency", 1), ("max_response_chars", 1)):
            value = getattr(self, key)
            if not _is_int(value) or value < low:
                raise bad(key, f"must be an integer >= {low}")
        if not _is_number(self.timeout_s) or self.timeout_s <= 0:
            raise bad("timeout_s", "must be a number > 0")
        for key in ("backoff_s", "backoff_max_s"):
            if not _is_number(getattr(self, key)) or getattr(self, key) < 0:
                raise bad(key, "must be a number >= 0")
        if self.self_preference not in SELF_PREFERENCE_MODES:
            raise bad("self_preference", f"must be one of {', '.join(SELF_PREFERENCE_MODES)}")
        if self.policy_model is not None and (not isinstance(self.policy_model, str) or not self.policy_model):
            raise bad("policy_model", "must be a model name or null")
        for key in ("empty_score", "truncated_score", "oversized_score"):
            value = getattr(self, key)
            if value is not None and (not _is_number(value) or not 0.0 <= value <= 1.0):
                raise bad(key, "must be a number in [0, 1] or null (null: send it to the judge)")
        if self.model is None and self.api_base is not None:
            raise bad("api_base", "needs args.model (the model name served there)")

    # --------------------------------------------------------------------------------------------
    @property
    def low(self) -> int:
        return self.scale[0]

    @property
    def high(self) -> int:
        return self.scale[1]

    def normalize(self, score: float) -> float:
        """A score on the discrete scale mapped onto [0, 1]."""
        return (float(score) - self.low) / (self.high - self.low)


def _scale(value: Any, where: str) -> tuple[int, int]:
    if _is_int(value) and value >= 2:
        return (1, int(value))  # `scale: 5` means 1..5
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(_is_int(v) for v in value):
        low, high = int(value[0]), int(value[1])
        if low < high and high - low <= 100:
            return (low, high)
    raise ConfigError(
        f"{where}: args.scale must be [low, high] integers with low < high (e.g. [1, 5]) or the top of a 1-based "
        f"scale (e.g. 5), got {value!r}"
    )


def _canonical(value: Any, where: str) -> str | None:
    """Anchors as canonical JSON, so a config stays hashable and its cache key stable."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    except TypeError as exc:
        raise ConfigError(
            f"{where}: args.anchors must be plain data (mappings, lists, strings, numbers): {exc}"
        ) from None


@dataclass(frozen=True)
class _Calibrated(JudgeConfig):
    """Judges that score one response can require a calibration pass on a gold set."""

    require_calibration: str | None = None
    calibration_min_rho: float = 0.6

    def validate(self, where: str) -> None:
        super().validate(where)
        if self.require_calibration is not None and (
            not isinstance(self.require_calibration, str) or not self.require_calibration.strip()
        ):
            raise ConfigError(
                f"{where}: args.require_calibration must be the path of a gold JSONL file, "
                f"got {self.require_calibration!r}"
            )
        if not _is_number(self.calibration_min_rho) or not -1.0 <= self.calibration_min_rho <= 1.0:
            raise ConfigError(
                f"{where}: args.calibration_min_rho must be a number in [-1, 1], got {self.calibration_min_rho!r}"
            )


@dataclass(frozen=True)
class PointwiseConfig(_Calibrated):
    """``llm-pointwise``: rubric + discrete scale + anchors, reason before verdict."""

    kind: ClassVar[str] = "pointwise"
    registered_name: ClassVar[str] = "llm-pointwise"

    anchors: Any = None
    length_normalization: bool = False
    length_slope: float | None = None
    length_window: int = 512
    length_min_samples: int = 16

    def validate(self, where: str) -> None:
        super().validate(where)
        if not isinstance(self.length_normalization, bool):
            raise ConfigError(f"{where}: args.length_normalization must be true or false")
        if self.length_slope is not None and not _is_number(self.length_slope):
            raise ConfigError(f"{where}: args.length_slope must be a number or null, got {self.length_slope!r}")
        for key, low in (("length_window", 2), ("length_min_samples", 2)):
            value = getattr(self, key)
            if not _is_int(value) or value < low:
                raise ConfigError(f"{where}: args.{key} must be an integer >= {low}, got {value!r}")
        from .prompts import parse_anchors

        parse_anchors(self.anchors, self.scale, where)


@dataclass(frozen=True)
class PairwiseConfig(_Calibrated):
    """``llm-pairwise``: the response against ``task[reference_field]``, asked in both orders."""

    kind: ClassVar[str] = "pairwise"
    registered_name: ClassVar[str] = "llm-pairwise"

    both_orders: bool = True
    tie_score: float = 0.5

    def validate(self, where: str) -> None:
        super().validate(where)
        if not isinstance(self.both_orders, bool):
            raise ConfigError(f"{where}: args.both_orders must be true or false")
        if not _is_number(self.tie_score) or not 0.0 <= self.tie_score <= 1.0:
            raise ConfigError(f"{where}: args.tie_score must be a number in [0, 1], got {self.tie_score!r}")
        if self.reference_field is None:
            raise ConfigError(f"{where}: args.reference_field must name the task field holding the reference response")


@dataclass(frozen=True)
class ListwiseConfig(JudgeConfig):
    """``llm-listwise``: all responses of a group scored together, over K shuffled orders."""

    kind: ClassVar[str] = "listwise"
    registered_name: ClassVar[str] = "llm-listwise"

    scale: tuple[int, int] = (1, 10)
    permutations: int | None = None  # None: as many as responses, so each is shown once at every position
    shuffle: bool = True

    def validate(self, where: str) -> None:
        super().validate(where)
        if self.permutations is not None and (not _is_int(self.permutations) or self.permutations < 1):
            raise ConfigError(
                f"{where}: args.permutations must be an integer >= 1 or null (one per response), "
                f"got {self.permutations!r}"
            )
        if not isinstance(self.shuffle, bool):
            raise ConfigError(f"{where}: args.shuffle must be true or false")


CONFIGS: dict[str, type[JudgeConfig]] = {
    "pointwise": PointwiseConfig,
    "pairwise": PairwiseConfig,
    "listwise": ListwiseConfig,
}


def defaults_of(cls: type[JudgeConfig]) -> dict[str, Any]:
    """``{key: default}`` of a config class, with tuples shown as lists (as a run file writes them)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        value = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out
