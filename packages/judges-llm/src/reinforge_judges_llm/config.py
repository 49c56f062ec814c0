"""Settings of the LLM judges: what a run file's ``args`` may say, checked by core's settings checker.

One :class:`reinforge.settings.Settings` dataclass per judge kind, declared when
the judge class is registered (``register("llm-pointwise", PointwiseJudge,
settings=PointwiseConfig, kind="model")``). Core checks a run file's ``args``
against it before any model loads (types from the annotations, unknown keys
with a suggestion, the value checks of :meth:`check`), so a typo fails
``reinforge tune --dry-run`` with ``run.yaml: judges[1]: args.temperatur: ...``.
Instances built in Python are checked the same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from reinforge.plugin import FieldError, Settings, at_least, finite, in_range, one_of

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


def _non_empty(key: str, value: str | None, what: str = "a non-empty string or null") -> None:
    if value is not None and not value.strip():
        raise FieldError(key, f"must be {what}, got {value!r}")


@dataclass
class JudgeConfig(Settings):
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
    scale: tuple[int, int] = (1, 5)  # `scale: 5` in a run file means (1, 5)
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

    def _prepare(self) -> None:
        # the shorthand `scale: 5` is the top of a 1-based scale (bool is not a scale)
        if isinstance(self.scale, int) and not isinstance(self.scale, bool):
            self.scale = (1, self.scale)

    def check(self) -> None:
        for key in ("model", "api_base", "api_key_env", "prompt_field", "reference_field", "cache_path"):
            _non_empty(key, getattr(self, key))
        _non_empty("auxiliary_model", self.auxiliary_model, "the name of an auxiliary model")
        _non_empty("rubric", self.rubric, "a non-empty string")
        low, high = self.scale
        if not (low < high and high - low <= 100):
            raise FieldError(
                "scale",
                "must be [low, high] integers with low < high (e.g. [1, 5]) or the top of a 1-based scale "
                f"(e.g. 5), got {list(self.scale)!r}",
            )
        finite("temperature", self.temperature)
        at_least("temperature", self.temperature, 0)
        at_least("max_tokens", self.max_tokens, 1)
        at_least("max_retries", self.max_retries, 0)
        at_least("max_concurrency", self.max_concurrency, 1)
        at_least("max_response_chars", self.max_response_chars, 1)
        finite("timeout_s", self.timeout_s)
        at_least("timeout_s", self.timeout_s, 0, strict=True)
        for key in ("backoff_s", "backoff_max_s"):
            finite(key, getattr(self, key))
            at_least(key, getattr(self, key), 0)
        one_of("self_preference", self.self_preference, SELF_PREFERENCE_MODES)
        _non_empty("policy_model", self.policy_model, "a model name or null")
        for key in ("empty_score", "truncated_score", "oversized_score"):
            in_range(key, getattr(self, key), 0.0, 1.0)
        if self.model is None and self.api_base is not None:
            raise FieldError("api_base", "needs args.model (the model name served there)")

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

    def values(self) -> dict[str, Any]:
        """``{key: value}`` of every setting (to build a sibling judge with some keys changed)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass
class _Calibrated(JudgeConfig):
    """Judges that score one response can require a calibration pass on a gold set."""

    require_calibration: str | None = None
    calibration_min_rho: float = 0.6

    def check(self) -> None:
        super().check()
        _non_empty("require_calibration", self.require_calibration, "the path of a gold JSONL file")
        in_range("calibration_min_rho", self.calibration_min_rho, -1.0, 1.0)


@dataclass
class PointwiseConfig(_Calibrated):
    """``llm-pointwise``: rubric + discrete scale + anchors, reason before verdict."""

    kind: ClassVar[str] = "pointwise"
    registered_name: ClassVar[str] = "llm-pointwise"

    anchors: Any = None  # {score: description} or a list of {response, score, task?, reason?}
    length_normalization: bool = False
    length_slope: float | None = None
    length_window: int = 512
    length_min_samples: int = 16

    def check(self) -> None:
        super().check()
        finite("length_slope", self.length_slope)
        at_least("length_window", self.length_window, 2)
        at_least("length_min_samples", self.length_min_samples, 2)
        from .prompts import parse_anchors

        parse_anchors(self.anchors, self.scale)


@dataclass
class PairwiseConfig(_Calibrated):
    """``llm-pairwise``: the response against ``task[reference_field]``, asked in both orders."""

    kind: ClassVar[str] = "pairwise"
    registered_name: ClassVar[str] = "llm-pairwise"

    both_orders: bool = True
    tie_score: float = 0.5

    def check(self) -> None:
        super().check()
        in_range("tie_score", self.tie_score, 0.0, 1.0)
        if self.reference_field is None:
            raise FieldError("reference_field", "must name the task field holding the reference response")


@dataclass
class ListwiseConfig(JudgeConfig):
    """``llm-listwise``: all responses of a group scored together, over K shuffled orders."""

    kind: ClassVar[str] = "listwise"
    registered_name: ClassVar[str] = "llm-listwise"

    scale: tuple[int, int] = (1, 10)
    permutations: int | None = None  # None: as many as responses, so each is shown once at every position
    shuffle: bool = True

    def check(self) -> None:
        super().check()
        at_least("permutations", self.permutations, 1)


CONFIGS: dict[str, type[JudgeConfig]] = {
    "pointwise": PointwiseConfig,
    "pairwise": PairwiseConfig,
    "listwise": ListwiseConfig,
}
