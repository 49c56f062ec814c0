"""Testing kit for reinforge and its plugin authors.

Opt-in pytest plugin, like pytest's ``pytester``: activate it with
``pytest -p reinforge.testing`` or ``pytest_plugins = ["reinforge.testing"]``
in a top-level ``conftest.py``. It is deliberately not auto-registered through
a ``pytest11`` entry point. The fixtures live in :mod:`reinforge.testing.plugin`,
which pytest loads through this module's ``pytest_plugins``; importing this
module itself does not import pytest, so the helpers below work anywhere.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pluggy

    from ..models import ChatModel
    from ..registry import Registry
    from ..runner import Runner
    from .asgi_server import BackgroundServer
    from .openai_server import OpenAIServer, Reply
    from .scripted import ScriptedCall, ScriptedChatModel, ScriptExhaustedError

# Read by pytest when this module is registered as a plugin: it loads the fixtures.
pytest_plugins = ["reinforge.testing.plugin"]

__all__ = [
    "BackgroundServer",
    "HookCall",
    "HookRecorder",
    "OpenAIServer",
    "Reply",
    "ScriptedCall",
    "ScriptedChatModel",
    "ScriptExhaustedError",
    "build_and_install",
    "check_entry_point",
    "check_hookimpls",
    "cli_main",
    "plugin_env",
    "plugin_registry",
    "run_command",
    "run_process",
    "runner_for",
]

_LAZY = {
    "check_hookimpls": "reinforge.plugins",  # hookimpls that match no hookspec, as (plugin, message)
    "BackgroundServer": "reinforge.testing.asgi_server",
    "OpenAIServer": "reinforge.testing.openai_server",
    "Reply": "reinforge.testing.openai_server",
    "ScriptedCall": "reinforge.testing.scripted",
    "ScriptedChatModel": "reinforge.testing.scripted",
    "ScriptExhaustedError": "reinforge.testing.scripted",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'reinforge.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


@dataclass(frozen=True)
class HookCall:
    """One hook call seen by a :class:`HookRecorder`."""

    name: str
    kwargs: dict[str, Any]


class HookRecorder:
    """Records every hook call made through a plugin manager, with its kwargs.

    Uses ``pm.add_hookcall_monitoring``, so calls are recorded even when no
    plugin implements the hook (``on_trajectory``, ``on_step_end``,
    ``on_run_end`` and any hook a package adds). The ``register_*`` hooks are
    recorded too, once per plugin that implements them (the registry calls
    them one plugin at a time). Detach recorders in reverse order of attaching.
    """

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm
        self.records: list[HookCall] = []
        self._lock = threading.Lock()
        self._undo: Callable[[], None] | None = None

    @classmethod
    def attach(cls, pm: pluggy.PluginManager) -> HookRecorder:
        """Start recording the hook calls of ``pm``; returns the recorder."""
        recorder = cls(pm)
        recorder._undo = pm.add_hookcall_monitoring(recorder._before, recorder._after)
        return recorder

    def detach(self) -> None:
        if self._undo is not None:
            self._undo()
            self._undo = None

    def __enter__(self) -> HookRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def _before(self, hook_name: str, hook_impls: Any, kwargs: Any) -> None:
        with self._lock:
            self.records.append(HookCall(hook_name, dict(kwargs)))

    def _after(self, outcome: Any, hook_name: str, hook_impls: Any, kwargs: Any) -> None:
        pass

    def calls(self, name: str) -> list[dict[str, Any]]:
        """The kwargs of every recorded call of hook ``name``, in call order."""
        with self._lock:
            return [r.kwargs for r in self.records if r.name == name]

    def names(self) -> list[str]:
        """Hook names in call order (repeats kept)."""
        with self._lock:
            return [r.name for r in self.records]

    def getcall(self, name: str) -> dict[str, Any]:
        """The kwargs of the single call of ``name``; fails if it was called 0 or 2+ times."""
        calls = self.calls(name)
        if len(calls) != 1:
            raise AssertionError(f"expected exactly one call of {name!r}, got {len(calls)}; recorded: {self.names()}")
        return calls[0]

    def clear(self) -> None:
        with self._lock:
            self.records.clear()


def run_process(
    args: list[Any], *, cwd: Any, env: dict[str, str] | None = None, check: bool = True, timeout: float = 300
) -> Any:
    """Run any command and capture its output; with ``check``, a non-zero exit fails with stdout and stderr shown."""
    import subprocess

    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, args))} exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc


def run_command(
    args: list[Any], *, cwd: Any, env: dict[str, str] | None = None, check: bool = True, timeout: float = 300
) -> Any:
    """Run ``python -m reinforge *args`` (this interpreter) and capture its output, as a user's shell would.

    ``run_command(["plugins", "--check"], cwd=..., env=plugin_env(site))``;
    with ``check``, a non-zero exit fails with stdout and stderr shown. For
    any other program use :func:`run_process`.
    """
    import sys

    if args and str(args[0]) in (sys.executable, "python", "python3"):  # the pre-0.4 calling convention
        raise AssertionError(
            f"run_command runs `python -m reinforge` itself; pass the subcommand only (run_command({list(args[3:])!r}, "
            f"...)) or use run_process for any program; got {args!r}"
        )
    return run_process([sys.executable, "-m", "reinforge", *args], cwd=cwd, env=env, check=check, timeout=timeout)


def cli_main(argv: Sequence[Any]) -> int:
    """Run the ``reinforge`` command line in this process (``reinforge *argv``) and return its exit code.

    The in-process twin of :func:`run_command`: output goes to this process's
    stdout/stderr (read it with pytest's ``capsys``), and what the test
    patched or registered is seen by the command. Plugins are found as a run
    finds them (entry points, ``REINFORGE_LOAD_PLUGINS``). A usage error or
    ``--help`` raises ``SystemExit`` (argparse's), as the command itself does.
    """
    from ..cli import main

    return main([str(a) for a in argv])


@contextlib.contextmanager
def runner_for(
    run: Any,
    model: ChatModel | None = None,
    *,
    model_provider: Callable[[Any], ChatModel] | None = None,
    plugin_manager: pluggy.PluginManager | None = None,
    group_size: int | None = None,
    sampling: dict[str, Any] | None = None,
) -> Iterator[Runner]:
    """The runner a backend gets for ``run`` (a :class:`~reinforge.plugin.RunConfig` or a run file's path).

    Builds the run's workflow, judges and group reward as ``tune`` does
    (through ``plugin_manager``, default: the installed plugins; no backend is
    needed) and yields ``job.make_runner(...)`` over ``model`` (every rollout
    gets a recording wrapper of it) or ``model_provider`` (one model per
    rollout, e.g. a local policy's). ``group_size`` defaults to the run's
    ``algorithm.group_size``; the ``runner`` section gives concurrency,
    retries and timeouts. The built components are closed on exit::

        with runner_for(run, ScriptedChatModel(["4"]), plugin_manager=reinforge_pm) as runner:
            result = runner.run([{"question": "2+2?"}])
    """
    from ..config import RunConfig
    from ..job import build_job
    from ..plugins import build_registry, get_plugin_manager
    from ..runfile import load_run

    if (model is None) == (model_provider is None):
        raise TypeError("runner_for needs exactly one of model= or model_provider=")
    pm = plugin_manager or get_plugin_manager()
    if not isinstance(run, RunConfig):  # a path: read it as `tune` would, names checked against the same plugins
        run = load_run(run, registry=build_registry(pm))
    job = build_job(run, pm, need_backend=False)
    try:
        yield job.make_runner(model=model, model_provider=model_provider, group_size=group_size, sampling=sampling)
    finally:
        job.close()


def build_and_install(project: Any, target: Any, *, dist: Any = None) -> Any:
    """Build ``project`` (a folder with a pyproject.toml) into a wheel and ``pip install`` it into ``target``.

    The real packaging path of a plugin, as its users get it: the build
    backend's wheel, installed with ``--no-deps --no-index`` into a private
    folder (put it on ``PYTHONPATH`` with :func:`plugin_env`). The wheel is
    written to ``dist`` (default: a new temporary folder), never into the
    project, so a test leaves the project as it found it. Needs the build
    backend the project names and pip in the test environment. Returns the
    wheel's path.
    """
    import importlib.util
    import sys
    import tempfile
    from pathlib import Path

    project, target = Path(project), Path(target)
    for module in ("pip", "hatchling"):
        if importlib.util.find_spec(module) is None:
            raise AssertionError(f"build_and_install needs {module!r} in the test environment")
    out = Path(dist) if dist is not None else Path(tempfile.mkdtemp(prefix="reinforge-wheel-"))
    run_process([sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)], cwd=project)
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        raise AssertionError(f"expected one wheel in {out}, found {[w.name for w in wheels]}")
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", "--target", str(target)]
    run_process([*pip, str(wheels[0])], cwd=project)
    return wheels[0]


def plugin_registry(pm: pluggy.PluginManager, plugins: Mapping[str, Any] | None = None) -> Registry:
    """The registry a run would build from ``pm``, after registering ``plugins`` (``{distribution: module}``).

    Each module is registered under its distribution's name, as its entry
    point would be, so names have the owner a run gives them; one already
    registered under that name is left as it is. The registry is built through
    the hooks, so a :class:`HookRecorder` on ``pm`` sees the ``register_*`` calls.
    """
    from ..plugins import build_registry

    for name, plugin in (plugins or {}).items():
        if pm.get_plugin(name) is None:
            pm.register(plugin, name=name)
    return build_registry(pm)


def plugin_env(*sites: Any, **extra: str) -> dict[str, str]:
    """This process's environment with ``sites`` as ``PYTHONPATH`` and no plugin selection, for a subprocess."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in {"REINFORGE_LOAD_PLUGINS", "PYTHONPATH"}}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in sites)
    env.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    env.update(extra)
    return env


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def check_entry_point(
    dist_name: str,
    *,
    workflows: Iterable[str] = (),
    judges: Iterable[str] = (),
    group_rewards: Iterable[str] = (),
    backends: Iterable[str] = (),
    run_sections: Iterable[str] = (),
    exact: bool = True,
) -> dict[str, list[str]]:
    """Assert that an installed distribution's ``reinforge`` entry point registers what it claims.

    Loads the entry point(s) of ``dist_name`` into a fresh plugin manager (no
    autoload of other plugins), builds the registry and compares names per
    kind: with ``exact`` every registered name must be claimed, otherwise the
    claimed names only need to be present. Raises ``AssertionError`` naming
    what is wrong; returns ``{kind: sorted names}`` registered by the plugin.
    """
    from ..plugins import ENTRY_POINT_GROUP, KINDS, build_registry, get_plugin_manager

    claimed = {
        "workflows": workflows,
        "judges": judges,
        "group_rewards": group_rewards,
        "backends": backends,
        "run_sections": run_sections,
    }
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise AssertionError(
            f"distribution {dist_name!r} is not installed in this environment; "
            f"install it (e.g. `pip install -e path/to/{dist_name}`) before checking its entry point"
        ) from None
    eps = [ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
    if not eps:
        raise AssertionError(
            f"distribution {dist_name!r} declares no entry point in group {ENTRY_POINT_GROUP!r}; add to its "
            f'pyproject.toml: [project.entry-points.{ENTRY_POINT_GROUP}] {dist_name} = "your_module"'
        )
    pm = get_plugin_manager(load_entrypoints=False)
    owners = []
    for ep in eps:
        if _normalize(ep.name) != _normalize(dist_name):
            raise AssertionError(
                f"{dist_name!r}: entry point {ep.name!r} = {ep.value!r} must be named after the distribution "
                f"({dist_name!r}) so REINFORGE_LOAD_PLUGINS can select it"
            )
        try:
            plugin = ep.load()
        except Exception as exc:
            raise AssertionError(
                f"{dist_name!r}: entry point {ep.name} = {ep.value!r} failed to import: {exc!r}"
            ) from exc
        if pm.get_plugin(ep.name) is not plugin:
            try:
                pm.register(plugin, name=ep.name)
            except Exception as exc:
                raise AssertionError(f"{dist_name!r}: {ep.value!r} could not be registered: {exc}") from exc
        owners.append(ep.name)
    from ..plugins import check_hookimpls

    for _plugin, problem in check_hookimpls(pm):  # a @hookimpl with no matching hookspec, usually a typo
        raise AssertionError(f"{dist_name!r}: {problem}")
    registry = build_registry(pm)
    for owner, reason in registry.broken.items():
        if owner in owners or _normalize(owner) == _normalize(dist_name):
            raise AssertionError(f"{dist_name!r}: registering its components failed: {reason}")
    for (kind, name), who in registry.conflicts.items():
        if set(who) & set(owners) or any(_normalize(w) == _normalize(dist_name) for w in who):
            raise AssertionError(f"{dist_name!r}: {kind} {name!r} is registered twice: by {who[0]!r} and by {who[1]!r}")
    _check_contracts(dist_name, registry, owners)

    found: dict[str, list[str]] = {}
    problems = []
    for k in KINDS:
        kind = k.plural
        actual = sorted(c.name for c in registry.components[kind].values() if c.owner in owners)
        found[kind] = actual
        given = claimed[kind]
        want: set[str] = {given} if isinstance(given, str) else set(given)
        missing = sorted(want - set(actual))
        extra = sorted(set(actual) - want) if exact else []
        if missing:
            problems.append(f"{kind}: claimed but not registered: {missing} (registered: {actual})")
        if extra:
            problems.append(f"{kind}: registered but not claimed: {extra} (claimed: {sorted(want)})")
    if problems:
        raise AssertionError(
            f"entry point of {dist_name!r} does not register what it claims:\n  " + "\n  ".join(problems)
        )
    return found


def _check_contracts(dist_name: str, registry: Any, owners: list[str]) -> None:
    """Every registered workflow, judge and group reward follows its call contract (no call is made)."""
    import inspect

    from ..errors import SignatureError
    from ..registry import KINDS
    from ..signatures import bind

    for k in KINDS:
        if k.role is None:
            continue
        for comp in registry.components[k.plural].values():
            if comp.owner not in owners:
                continue
            target = comp.obj
            if isinstance(target, type):
                if getattr(target, "__reinforge_reward__", None) is not None:
                    continue  # a @reward_func class: its sub-dimensions were checked at import
                call = target.__call__
                params = list(inspect.signature(call).parameters.values())[1:]
                target = _signature_only(inspect.Signature(params))
            try:
                bind(target, k.role, {}, name=comp.name, contract_only=True)
            except SignatureError as exc:
                raise AssertionError(f"{dist_name!r}: {k.singular} {comp.name!r} breaks the contract: {exc}") from None


def _signature_only(sig: Any) -> Any:
    def stand_in(*args: Any, **kwargs: Any) -> None:  # pragma: no cover - never called
        raise NotImplementedError

    stand_in.__signature__ = sig  # type: ignore[attr-defined]
    return stand_in
