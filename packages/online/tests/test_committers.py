"""Committers as plugins: the register_committers hook, args checked against a plugin's settings, unknown and
duplicate names, the moved 0.1 keys, the no-committer warning, and a committer from a real third-party wheel."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import textwrap
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from online_testlib import HTTP, SECRETS, free_port, settings

import reinforge_online.plugin as ours
from reinforge.plugin import ConfigError, FieldError, Settings, hookimpl
from reinforge_online import CommitterContext, build_committer, committer_registry
from reinforge_online.committers import COMMITTERS, plan_committer
from reinforge_online.config import load_config
from reinforge_online.pipeline import Pipeline
from reinforge_online.sink import JsonlCommitter

SRC = Path(__file__).resolve().parents[1] / "src" / "reinforge_online"


@dataclass
class ListSettings(Settings):
    label: str = "batches"
    limit: int = 10

    def check(self) -> None:
        if self.limit < 1:
            raise FieldError("limit", f"must be at least 1, got {self.limit}")


class ListCommitter:
    """Keeps every batch in memory (a committer of a test plugin)."""

    def __init__(self, settings: ListSettings, context: CommitterContext) -> None:
        self.settings, self.context = settings, context
        self.batches: list[tuple[str, list[dict[str, Any]]]] = []
        self.closed = False

    def send(self, batch_id: str, rows: list[dict[str, Any]]) -> None:
        self.batches.append((batch_id, rows))

    def close(self) -> None:
        self.closed = True


class ListPlugin:
    @hookimpl
    def register_committers(self, register):
        register("memory", ListCommitter, settings=ListSettings, description="batches kept in memory")
        register("no_send", lambda settings, context: object())
        register("raises", lambda settings, context: 1 / 0)


class OtherMemoryPlugin:
    @hookimpl
    def register_committers(self, register):
        register("memory", ListCommitter, settings=ListSettings)


@pytest.fixture
def pm(reinforge_pm):
    """A fresh plugin manager with this package's plugin (as its entry point loads it) and the test plugin."""
    reinforge_pm.register(ours, name="reinforge-online")
    reinforge_pm.register(ListPlugin(), name="reinforge-listplugin")
    return reinforge_pm


def test_a_plugin_registers_a_committer_built_with_its_checked_settings_and_the_context(tmp_path, pm):
    assert pm.hook.register_committers.has_spec() and pm.broken == []
    registry = committer_registry(pm)
    assert registry.names(COMMITTERS) == ["memory", "no_send", "raises", "sink"]  # sink: this package's own
    assert registry.get(COMMITTERS, "sink").owner == "reinforge-online"
    context = CommitterContext(where="online.yaml", base_dir=tmp_path, policy_url="http://127.0.0.1:9/v1")
    made = build_committer("memory", {"label": "x", "limit": 3}, context, pm=pm)
    assert isinstance(made, ListCommitter)
    assert made.settings == ListSettings(label="x", limit=3) and made.context is context
    assert build_committer("none", {}, context, pm=pm) is None


@pytest.mark.parametrize(
    ("kind", "args", "message"),
    [
        ("memory", {"limit": "3"}, r"^online.yaml: committer.args.limit: expected an integer, got str '3'$"),
        ("memory", {"limit": 0}, r"^online.yaml: committer.args.limit: must be at least 1, got 0$"),
        ("memory", {"lable": "x"}, r"^online.yaml: unknown key 'committer.args.lable' \(did you mean 'label'\?\)$"),
        ("sink", {"path": ""}, r"^online.yaml: committer.args.path: must not be empty$"),
        (
            "memroy",
            {},
            r"^online.yaml: committer.kind: unknown committer 'memroy' \(did you mean 'memory'\?\); known: ",
        ),
        ("none", {"path": "x"}, r"^online.yaml: committer.args: there is no committer \(committer.kind: none\)"),
        ("no_send", {}, r"committer 'no_send' \(from reinforge-listplugin\) has no send\(batch_id, rows\)"),
        ("raises", {}, r"building the committer 'raises' \(from reinforge-listplugin\) failed: ZeroDivisionError"),
    ],
)
def test_bad_kinds_and_args_are_errors_naming_the_file_and_the_key(pm, kind, args, message):
    with pytest.raises(ConfigError, match=message):
        build_committer(kind, args, CommitterContext(where="online.yaml"), pm=pm)


def test_an_unknown_kind_lists_every_known_name_and_says_where_the_backends_committers_live(pm):
    with pytest.raises(ConfigError) as info:
        plan_committer("kafka", pm=pm)
    assert str(info.value).endswith("known: memory, no_send, none, raises, sink")
    with pytest.raises(ConfigError, match=r"'local' comes with reinforge-backend-local: pip install"):
        plan_committer("local", pm=pm)


def test_two_plugins_claiming_one_name_is_an_error_naming_both(pm):
    pm.register(OtherMemoryPlugin(), name="reinforge-othermemoryplugin")
    with pytest.raises(
        ConfigError, match="online.yaml: committer.kind: committer 'memory' is registered twice"
    ) as info:
        plan_committer("memory", pm=pm)
    assert "reinforge-listplugin" in str(info.value) and "reinforge-othermemoryplugin" in str(info.value)
    assert plan_committer("sink", pm=pm) is not None  # the other names still work


def test_the_builtins_are_there_on_a_plugin_manager_that_did_not_load_this_package(reinforge_pm):
    assert not reinforge_pm.has_plugin("reinforge-online")
    assert committer_registry(reinforge_pm).names(COMMITTERS) == ["sink"]


def test_the_context_resolves_paths_and_reads_secrets_naming_the_key(tmp_path, monkeypatch):
    context = CommitterContext(where="online.yaml", base_dir=tmp_path)
    assert context.path("out") == tmp_path / "out" and context.path("/abs") == Path("/abs")
    monkeypatch.setenv("SET_KEY", "v")
    monkeypatch.delenv("UNSET_KEY", raising=False)
    assert context.secret("SET_KEY", "key_env") == "v"
    with pytest.raises(ConfigError, match=r"^online.yaml: committer.args.key_env: the environment variable UNSET_KEY"):
        context.secret("UNSET_KEY", "key_env")
    with pytest.raises(ConfigError, match=r"^online.yaml: committer.args.key_env: is required"):
        context.secret(None, "key_env")


def test_the_sink_folder_is_relative_to_online_yaml(tmp_path):
    (tmp_path / "online.yaml").write_text(
        "upstream: {url: 'http://127.0.0.1:9/v1'}\nmode: record\ndev: true\n"
        "committer: {kind: sink, args: {path: out/batches}}\n"
    )
    s = load_config(tmp_path / "online.yaml")
    pipeline = Pipeline(s, SECRETS, where=str(tmp_path / "online.yaml"))
    try:
        assert isinstance(pipeline.committer, JsonlCommitter)
        assert pipeline.committer.directory == tmp_path / "out" / "batches"
    finally:
        pipeline.close()


@pytest.mark.parametrize(
    ("committer", "message"),
    [
        ("{kind: sink, path: out}", r"online.yaml: committer.path: moved to committer.args.path$"),
        ("{kind: local, path: run}", r"online.yaml: committer.path: moved to committer.args.run_dir \(kind: local\)$"),
        (
            "{kind: local, local: {admin_key_env: K}}",
            r"online.yaml: committer.local: moved to committer.args \(kind: local\)$",
        ),
        (
            "{kind: trinity, trinity: {url: 'http://x'}}",
            r"committer.trinity: moved to committer.args \(kind: trinity\)$",
        ),
        ("{kind: ' '}", r"online.yaml: committer.kind: must not be empty"),
        ("{kind: sink, args: [1]}", r"online.yaml: committer.args: expected a mapping"),
    ],
)
def test_the_0_1_keys_say_where_they_moved(tmp_path, committer, message):
    (tmp_path / "online.yaml").write_text(
        f"upstream: {{url: 'http://127.0.0.1:9/v1'}}\nmode: record\ndev: true\ncommitter: {committer}\n"
    )
    with pytest.raises(ConfigError, match=message):
        load_config(tmp_path / "online.yaml")


def test_without_a_committer_the_start_says_nothing_trains(tmp_path, caplog):
    quiet = settings("http://127.0.0.1:1/v1", None, tmp_path / "a.sqlite", mode="record")
    pipeline = Pipeline(quiet, SECRETS)
    try:
        with caplog.at_level(logging.WARNING, logger="reinforge_online"):
            pipeline.start()
        (record,) = [r for r in caplog.records if "no committer" in r.getMessage()]
        assert record.levelno == logging.WARNING
        assert "rewarded traces stay in the store; nothing trains" in record.getMessage()
        assert pipeline.committer is None and pipeline.outbox is None
    finally:
        pipeline.close()
    caplog.clear()
    sink = settings(
        "http://127.0.0.1:1/v1",
        None,
        tmp_path / "b.sqlite",
        mode="record",
        committer={"kind": "sink", "args": {"path": str(tmp_path / "out")}},
    )
    pipeline = Pipeline(sink, SECRETS)
    try:
        with caplog.at_level(logging.WARNING, logger="reinforge_online"):
            pipeline.start()
        assert not [r for r in caplog.records if "no committer" in r.getMessage()]
    finally:
        pipeline.close()


def test_a_committer_built_by_the_pipeline_is_closed_with_it_and_a_given_one_is_not(tmp_path, pm, monkeypatch):
    import reinforge_online.committers as committers

    monkeypatch.setattr(committers, "get_plugin_manager", lambda: pm)  # the pipeline's registry: this test's plugins
    s = settings(
        "http://127.0.0.1:1/v1",
        None,
        tmp_path / "t.sqlite",
        mode="record",
        committer={"kind": "memory", "args": {"label": "l"}},
    )
    built = Pipeline(s, SECRETS).start()
    assert isinstance(built.committer, ListCommitter) and built.outbox is not None
    assert built.committer.context.where == "online.yaml" and built.committer.context.base_dir == Path.cwd()
    assert built.close() and built.committer.closed
    given = ListCommitter(ListSettings(), CommitterContext())
    mine = Pipeline(s, SECRETS, committer=given).start()
    assert mine.committer is given and mine.close() and not given.closed


def test_online_imports_no_backend_package():
    """Committers of the backends come through the hook: online's sources never name a backend's import package."""
    offenders = [
        f"{path.relative_to(SRC)}:{n}"
        for path in sorted(SRC.rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "reinforge_backend_local" in line or "reinforge_backend_trinity" in line
    ]
    assert offenders == []


# -- a committer from a third-party package, built by hatchling and used by `reinforge online serve` ---------------

PLUGIN_PYPROJECT = """
[build-system]
requires = ["hatchling>=1.21"]
build-backend = "hatchling.build"

[project]
name = "reinforge-committer-append"
version = "0.1.0"
requires-python = ">=3.10"
dependencies = ["reinforge-online>=0.2,<0.3"]

[project.entry-points.reinforge]
reinforge-committer-append = "reinforge_committer_append.plugin"

[tool.hatch.build.targets.wheel]
packages = ["src/reinforge_committer_append"]
"""

PLUGIN_MODULE = '''
"""A committer that appends each batch to a file, one JSON line per batch."""

import json
from dataclasses import dataclass

from reinforge import hookimpl
from reinforge.plugin import FieldError, Settings


@dataclass
class AppendSettings(Settings):
    file: str = "committed.jsonl"

    def check(self):
        if not self.file.strip():
            raise FieldError("file", "must not be empty")


class AppendCommitter:
    def __init__(self, path):
        self.path = path

    def send(self, batch_id, rows):
        line = {"batch_id": batch_id, "traces": [[row["trace_id"], row["reward"]] for row in rows]}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\\n")


@hookimpl
def register_committers(register):
    register("append", lambda settings, context: AppendCommitter(context.path(settings.file)), settings=AppendSettings)
'''

REINFORGE = [sys.executable, "-c", "import sys; from reinforge.cli import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def append_site(tmp_path_factory) -> Path:
    """The package above, built into a wheel by hatchling and pip-installed into a folder of its own."""
    from reinforge.testing import build_and_install

    root = tmp_path_factory.mktemp("committer_plugin")
    project = root / "project"
    package = project / "src" / "reinforge_committer_append"
    package.mkdir(parents=True)
    (project / "pyproject.toml").write_text(textwrap.dedent(PLUGIN_PYPROJECT))
    (package / "__init__.py").write_text('"""An example committer."""\n')
    (package / "plugin.py").write_text(PLUGIN_MODULE)
    site = root / "site"
    wheel = build_and_install(project, site)
    assert wheel.name.startswith("reinforge_committer_append-0.1.0-"), wheel.name
    return site


def _plugin_env(site: Path) -> dict[str, str]:
    from reinforge.testing import plugin_env

    return plugin_env(site, REINFORGE_LOAD_PLUGINS="reinforge-online,reinforge-committer-append")


@pytest.mark.slow
def test_a_third_party_committer_gets_the_gateways_batches_end_to_end(tmp_path, append_site, upstream, policy, fakes):
    port = free_port()
    (tmp_path / "online.yaml").write_text(
        json.dumps(
            {
                "upstream": {"url": upstream[1].v1},
                "policy": {"url": policy[1].v1, "model": "pol"},
                "listen": {"port": port},
                "selection": {"sampling_rate": 1.0},
                "dev": True,
                "committer": {"kind": "append", "min_traces": 1, "args": {"file": "out/committed.jsonl"}},
            }
        )
    )
    (tmp_path / "out").mkdir()
    proc = subprocess.Popen(
        [*REINFORGE, "online", "serve", str(tmp_path / "online.yaml"), "--log-level", "info"],
        stderr=subprocess.PIPE,
        text=True,
        env=_plugin_env(append_site),
        cwd=tmp_path,
    )
    ready = threading.Event()
    lines: list[str] = []

    def watch() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "Uvicorn running on" in line:
                ready.set()
        ready.set()  # it exited

    threading.Thread(target=watch, daemon=True).start()
    try:
        assert ready.wait(60) and proc.poll() is None, "".join(lines)
        base = f"http://127.0.0.1:{port}"
        r = HTTP.post(
            f"{base}/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "q"}]}
        )
        assert r.status_code == 200, r.text
        trace_id = r.headers["x-reinforge-trace-id"]
        fb = HTTP.post(
            f"{base}/online/v1/feedback",
            json={"trace_id": trace_id, "reward": 0.75},
            headers={"x-reinforge-feedback-token": r.headers["x-reinforge-feedback-token"]},
        )
        assert fb.status_code == 200, fb.text
    finally:
        proc.send_signal(signal.SIGINT)  # the outbox's last pass sends what is rewarded before the process ends
        code = proc.wait(60)
    out = "".join(lines)
    assert code in (0, 130) and "Traceback" not in out, out
    assert "no committer" not in out
    (batch,) = [json.loads(line) for line in (tmp_path / "out" / "committed.jsonl").read_text().splitlines()]
    assert batch["traces"] == [[trace_id, 0.75]]


@pytest.mark.slow
def test_a_misspelt_third_party_committer_is_an_error_with_the_name_it_meant(tmp_path, append_site):
    (tmp_path / "online.yaml").write_text(
        "upstream: {url: 'http://127.0.0.1:1/v1'}\nmode: record\ndev: true\n"
        "committer: {kind: apend, args: {file: x.jsonl}}\n"
    )
    proc = subprocess.run(
        [*REINFORGE, "online", "serve", str(tmp_path / "online.yaml")],
        capture_output=True,
        text=True,
        env=_plugin_env(append_site),
        timeout=120,
    )
    assert proc.returncode != 0
    where = tmp_path / "online.yaml"
    assert (
        f"{where}: committer.kind: unknown committer 'apend' (did you mean 'append'?); known: append, none, sink"
        in (proc.stderr)
    ), proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "traces.sqlite").exists()
