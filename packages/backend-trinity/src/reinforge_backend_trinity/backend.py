"""The ``trinity`` backend: a reinforge run written as a Trinity-RFT config for a Ray cluster.

Core checks ``backend_args`` against :class:`~reinforge_backend_trinity.settings.TrinitySettings` and
the algorithm against :meth:`TrinityBackend.algorithm_name` before anything loads; :meth:`check`
then builds the Trinity config (so a run that cannot be written fails there too). ``tune --dry-run``
writes it to ``<output_dir>/<project>/<experiment>/trinity_config.yaml`` and prints its path.
``run`` writes the same file and launches it (:mod:`reinforge_backend_trinity.launch`): Trinity's
``check_and_update()`` and ``run_stage`` on Ray; its tasksets run on :mod:`reinforge_backend_trinity.workflow`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reinforge.plugin import Backend, ConfigError, load_settings, suggest

from .algorithms import (
    ALIASES,
    TO_TRINITY,
    TRINITY_ALGORITHMS,
    TrinityAlgorithmSettings,
    trinity_name,
    unknown_algorithm,
)
from .extra import require_trinity
from .mapping import load_trinity_yaml, run_folder, trinity_config, write_config
from .settings import TrinitySettings

if TYPE_CHECKING:
    from reinforge.plugin import AlgorithmConfig, RunConfig, TuneJob

__all__ = ["TrinityBackend"]


class TrinityBackend(Backend):
    """Registered as ``trinity``: Trinity-RFT on Ray (vLLM explorers, verl trainers)."""

    name = "trinity"
    settings = TrinitySettings
    algorithms = {name: TrinityAlgorithmSettings for name in sorted({*TO_TRINITY, *TRINITY_ALGORITHMS})}
    algorithm_aliases = ALIASES

    # -- checks ------------------------------------------------------------------------------

    def algorithm_name(self, algorithm: AlgorithmConfig, *, where: str) -> str:
        """reinforge's names and every Trinity algorithm; checked against Trinity's registry when it is installed."""
        wanted = self.algorithm_aliases.get(algorithm.algorithm_type, algorithm.algorithm_type)
        known = unknown_algorithm(wanted)  # None: Trinity has it, or Trinity is not installed to ask
        if known is not None:
            names = sorted({*TO_TRINITY, *known})
            raise ConfigError(
                f"{where}: algorithm.algorithm_type: Trinity-RFT has no algorithm {algorithm.algorithm_type!r}"
                f"{suggest(algorithm.algorithm_type, names)}; reinforge's names: {', '.join(sorted(TO_TRINITY))}; "
                f"Trinity's: {', '.join(known)}"
            )
        return wanted

    def check_algorithm(self, algorithm: AlgorithmConfig, *, where: str) -> TrinityAlgorithmSettings:
        """The keys under ``algorithm:`` besides core's, as Trinity's algorithm keys (any algorithm)."""
        self.algorithm_name(algorithm, where=where)
        settings: TrinityAlgorithmSettings = load_settings(
            TrinityAlgorithmSettings, dict(algorithm.options), where=where, prefix="algorithm"
        )
        return settings

    def check(self, job: TuneJob) -> None:
        """The run must be writable as a Trinity config: build it (nothing is written)."""
        self.config(job)

    # -- the config --------------------------------------------------------------------------

    def _settings(self, job: TuneJob) -> TrinitySettings:
        settings = job.backend_settings
        return settings if isinstance(settings, TrinitySettings) else TrinitySettings()

    def config_path(self, run: RunConfig, settings: TrinitySettings) -> str | None:
        """The hand-written Trinity YAML: the run file's ``config_path`` or ``backend_args.config_path``."""
        where = run.source or "run"
        own = settings.config_path
        if own is not None:
            path = Path(own).expanduser()
            if not path.is_absolute() and run.base_dir:
                path = Path(run.base_dir) / path
            if not path.is_file():
                raise ConfigError(f"{where}: backend_args.config_path: {own!r} does not exist (looked for {path})")
            own = str(path)
        if own is not None and run.config_path is not None and Path(own) != Path(run.config_path):
            raise ConfigError(f"{where}: config_path and backend_args.config_path name different files; set one")
        return own or run.config_path

    def config(self, job: TuneJob) -> dict[str, Any]:
        """The run's Trinity-RFT config as plain data."""
        run, settings = job.run, self._settings(job)
        path = self.config_path(run, settings)
        base = load_trinity_yaml(path, where=f"{run.source or 'run'}: config_path") if path else None
        name = job.algorithm_name or self.algorithm_name(run.algorithm, where=run.source or "run")
        algo = job.algorithm_settings if isinstance(job.algorithm_settings, TrinityAlgorithmSettings) else None
        return trinity_config(run, settings, name, algo, base=base)

    def write(self, job: TuneJob) -> Path:
        """Write the Trinity config into the run folder; return its path."""
        return write_config(self.config(job), run_folder(job.run, self._settings(job)))

    # -- what the backend does ---------------------------------------------------------------

    def dry_run(self, job: TuneJob) -> dict[str, Any]:
        config = self.config(job)
        path = write_config(config, run_folder(job.run, self._settings(job)))
        print(f"wrote the Trinity-RFT config: {path}", file=sys.stderr)
        algorithm = job.algorithm_name or job.run.algorithm.algorithm_type
        return {
            **job.describe(),
            "trinity_config": str(path),
            "trinity_algorithm": config.get("algorithm", {}).get("algorithm_type", trinity_name(algorithm)),
            "mode": config.get("mode", "both"),
            "model": config.get("model", {}).get("model_path"),
            "launch": f"trinity run --config {path}",
        }

    def run(self, job: TuneJob) -> dict[str, Any]:
        """Write the config, then launch it: Trinity's ``check_and_update()`` and ``run_stage`` on Ray (see launch.py)."""
        require_trinity()  # without Trinity-RFT, a MissingExtraError that says what to install
        from .launch import launch

        settings = self._settings(job)
        config = self.config(job)
        folder = run_folder(job.run, settings)
        path = write_config(config, folder)
        print(f"wrote the Trinity-RFT config: {path}", file=sys.stderr)
        where = job.run.source or "run"
        checkpoints = Path(config.get("checkpoint_root_dir", folder))
        status = launch(
            path,
            config,
            where=where,
            url=settings.external_url,
            num_cpus=settings.ray_num_cpus,
            excludes=[Path(settings.output_dir), checkpoints],  # the run's outputs do not travel to the workers
        )
        if not status["success"]:
            raise RuntimeError(
                f"{where}: Trinity-RFT's {status['stage']} stage failed: {status['error']} (config: {path}; logs under "
                f"{status['checkpoint_job_dir']})"
            )
        return {"status": "finished", "trinity_config": str(path), "trinity_stage": status}
