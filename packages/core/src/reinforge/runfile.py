"""Run files: reading one (``load_run``), checking its components, and writing one back (``dump_run``).

The same run can be written in Python (``tune(...)``, through :func:`build_run`)
or YAML (``reinforge tune run.yaml``, through :func:`load_run`); both go through
the checks of :mod:`reinforge.config`, so a typo or a wrong type fails before any
model loads, naming the key and the file. ``load_run`` also resolves relative
paths and checks each component's reference and settings (nothing is built).
``pyyaml`` is an optional extra, imported only on use.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import typing
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import DatasetConfig, RunConfig, from_dict
from .dataset_io import looks_local
from .errors import ConfigError, require
from .settings import Settings, settings_keys, suggest

if TYPE_CHECKING:
    from .registry import Registry

__all__ = ["build_run", "check_sections", "dump_run", "load_run", "to_dict"]


def build_run(data: dict[str, Any], *, options: dict[str, Any] | None = None, where: str = "tune()") -> RunConfig:
    """A :class:`RunConfig` from keyword-style data (config objects or mappings) plus extra run-file keys.

    A key given both in ``data`` (not None) and in ``options`` is an error, not a silent override.
    """
    merged = dict(data)
    for key, value in (options or {}).items():
        if merged.get(key) is not None:
            raise ConfigError(f"{where}: {key!r} is given twice")
        merged[key] = value
    merged, sections = _split_sections(merged)
    run: RunConfig = from_dict(RunConfig, merged, where=where)
    run.sections = sections
    return run


def _split_sections(data: Any) -> tuple[Any, dict[str, Any]]:
    """Core's keys, and the rest: plugins' sections, checked against the run's registry by :func:`check_sections`."""
    if not isinstance(data, dict):
        return data, {}
    core = settings_keys(RunConfig)
    kept = {k: v for k, v in data.items() if not isinstance(k, str) or k in core or k == "judge"}
    return kept, {k: v for k, v in data.items() if k not in kept}


def check_sections(run: RunConfig, registry: Registry, *, where: str | None = None) -> None:
    """Check each plugin section of ``run`` against the settings class its plugin registered, in place.

    A key no installed plugin registered is an unknown key of the run file, with a did-you-mean over core's
    keys and the registered sections (and a note naming broken plugins, which may be the one that owns it).

    :raises ConfigError: naming the file and the dotted key.
    """
    where = where or run.source or "tune()"
    for name, value in list(run.sections.items()):
        if isinstance(value, Settings):
            continue
        comp = registry.get("run_sections", name)
        if comp is None:
            known = [*settings_keys(RunConfig), *registry.names("run_sections")]
            raise ConfigError(f"{where}: unknown key '{name}'{suggest(name, known)}{registry.broken_note()}")
        run.sections[name] = from_dict(comp.obj, {} if value is None else value, where=where, key_prefix=name)


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
        if isinstance(obj, RunConfig):  # plugins' sections are top-level keys of the run file
            out.update(to_dict(obj.sections, redact=redact))
        return out
    if isinstance(obj, (list, tuple)):
        return [to_dict(v, redact=redact) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v, redact=redact) for k, v in obj.items()}
    if callable(obj):
        from .signatures import describe

        return describe(obj)
    return obj


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
    return candidate if candidate.exists() or looks_local(raw) else None


def load_run(path: str | os.PathLike[str], *, registry: Registry | None = None) -> RunConfig:
    """Read a run file: check every key, resolve relative paths and import ``module:attr`` refs.

    Relative dataset, model and ``config_path`` paths are taken against the
    run file's directory, which is also on ``sys.path`` while refs import.
    Registered names and plugins' sections are checked too when a ``registry`` is given, and the run
    keeps it (``run.registry``): :func:`~reinforge.job.build_job` and :func:`~reinforge.evaluation.evaluate`
    build its components from it.
    """
    file = Path(path)
    where = str(path)
    data = _read_yaml(file)
    if data is None:
        raise ConfigError(f"{where}: the run file is empty; it needs at least a workflow")
    data, sections = _split_sections(data)
    run: RunConfig = from_dict(RunConfig, data, where=where)
    run.sections = sections
    base = file.resolve().parent
    run.source, run.base_dir, run.registry = str(file.resolve()), str(base), registry
    for key in ("train_dataset", "eval_dataset"):
        ds: DatasetConfig | None = getattr(run, key)
        if ds is None:
            continue
        ds.set_origin(key, where)
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
    if registry is not None:
        check_sections(run, registry, where=where)
    return run


def _check_refs(run: RunConfig, where: str, registry: Registry | None) -> None:
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
