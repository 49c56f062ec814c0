"""The typed interface of a training backend (``register_backends``).

A backend declares what it accepts, and core checks a run against it before
any model loads: its ``settings`` (the run file's ``backend_args``) and its
``algorithms`` (each ``algorithm_type`` with its own settings: every key
under ``algorithm:`` besides core's AgentScope-compatible fields). Core has no
list of algorithm names; an unknown one is an error listing the backend's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .errors import ConfigError
from .settings import Settings, load, suggest

if TYPE_CHECKING:
    from .config import AlgorithmConfig, ModelConfig, RunConfig
    from .job import TuneJob
    from .models import ChatModel

__all__ = ["Backend", "NoSettings"]


@dataclass
class NoSettings(Settings):
    """Settings with no keys: every key given is an error."""


class Backend:
    """Base class of every backend; register the subclass with ``register(name, cls)``.

    Class attributes a backend sets:

    :cvar name: the registered name (``"local"``), used in messages.
    :cvar settings: the dataclass of its ``backend_args`` (a
        :class:`~reinforge.settings.Settings` subclass).
    :cvar algorithms: ``{algorithm_type: settings dataclass or None}``; the
        settings hold the keys under ``algorithm:`` that this algorithm
        accepts (None: no extra keys).
    :cvar algorithm_aliases: other spellings, e.g. ``{"reinforce++": "reinforce_pp"}``.

    Core instantiates the class with no arguments once per command, checks the
    run with :meth:`check`, then calls :meth:`run` inside the run lifecycle.
    """

    name: ClassVar[str] = ""
    settings: ClassVar[type] = NoSettings
    algorithms: ClassVar[Mapping[str, type | None]] = {}
    algorithm_aliases: ClassVar[Mapping[str, str]] = {}

    # -- checks core runs before anything loads -----------------------------------------------

    def algorithm_name(self, algorithm: AlgorithmConfig, *, where: str) -> str:
        """The canonical ``algorithm_type``; an unknown one lists this backend's algorithms."""
        wanted = self.algorithm_aliases.get(algorithm.algorithm_type, algorithm.algorithm_type)
        if wanted not in self.algorithms:
            known = sorted(self.algorithms)
            raise ConfigError(
                f"{where}: algorithm.algorithm_type: backend {self.name or type(self).__name__!r} has no algorithm "
                f"{algorithm.algorithm_type!r}{suggest(algorithm.algorithm_type, known)}; its algorithms: "
                f"{', '.join(known) or 'none'}"
            )
        return wanted

    def check_algorithm(self, algorithm: AlgorithmConfig, *, where: str) -> Any:
        """The algorithm's own settings, built from the keys under ``algorithm:``; None when it has none."""
        name = self.algorithm_name(algorithm, where=where)
        cls = self.algorithms[name]
        if cls is None:
            cls = NoSettings
            if not algorithm.options:
                return None
        from .config import AlgorithmConfig
        from .settings import settings_keys

        own = settings_keys(cls)
        for key in algorithm.options:
            if key not in own:  # a typo of a core field (grop_size) is suggested too
                options = [*settings_keys(AlgorithmConfig), "algorithm_type", *own]
                raise ConfigError(
                    f"{where}: unknown key 'algorithm.{key}'{suggest(key, options)}; algorithm {name!r} of backend "
                    f"{self.name!r} takes: {', '.join(sorted(own)) or 'no keys of its own'}"
                )
        return load(cls, dict(algorithm.options), where=where, prefix="algorithm")

    def check_settings(self, run: RunConfig, *, where: str) -> Any:
        """``backend_args`` as this backend's settings object."""
        return load(self.settings, dict(run.backend_args or {}), where=where, prefix="backend_args")

    def check(self, job: TuneJob) -> None:
        """Extra checks of a whole job (datasets it needs, model settings); raise :class:`ConfigError`."""

    # -- what a backend does ------------------------------------------------------------------

    def run(self, job: TuneJob) -> dict[str, Any]:
        """Train. Runs inside ``with job.running() as run:`` (core enters it; entering again is a no-op).

        Report each step with ``run.step_end(metrics)``, each evaluation with
        ``run.eval_end(metrics)``, stop when ``run.stop_requested``; return the
        summary (it is merged into ``run.summary``).
        """
        raise NotImplementedError(f"backend {self.name!r} does not implement run()")

    def dry_run(self, job: TuneJob) -> dict[str, Any]:
        """What ``reinforge tune --dry-run`` prints: the resolved run, nothing trained."""
        return job.describe()

    def chat_model(self, model_config: ModelConfig) -> ChatModel:
        """A model over the backend's policy for ``reinforge eval``; by default there is none."""
        raise ConfigError(
            f"backend {self.name!r} cannot serve a model for evaluation; set model.api_base or pass --api-base"
        )
