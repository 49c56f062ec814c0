"""Findings of the core 0.4 issue on plugin management and the testing kit (the third-party author's).

Each test fails on the core before 0.4 (commit cdd16e7): ``plugins --check``, registration checks,
built-in names kept for core, ``run_command``'s prefix, ``hook_recorder`` seeing ``register_*``,
``build_and_install`` leaving the project folder alone, the template's error and imports; where to install from.
``test_registration_accepts_what_serves_its_kind`` is the guard the other way: it passes before and after.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from fake_dists import make_dist

from reinforge import hookimpl
from reinforge.cli import main
from reinforge.errors import PluginError
from reinforge.plugin import ConfigurationError, Registry
from reinforge.plugins import build_registry, describe_plugins, get_plugin_manager
from reinforge.testing import build_and_install, plugin_registry, run_command, run_process


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in [m for m in sys.modules if m.startswith("rf_check")]:
        del sys.modules[name]


GOOD = """
from reinforge import hookimpl

@hookimpl
def register_judges(register):
    register("polite", lambda task, response: float("please" in str(response)))
"""


# -- `reinforge plugins --check`: a CI check ------------------------------------------------------------


def test_plugins_check_exits_1_naming_a_broken_plugin(site: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    make_dist(site, "rf-check-good", GOOD)
    make_dist(site, "rf-check-broken", "raise ImportError('needs torch')")
    monkeypatch.setenv("REINFORGE_LOAD_PLUGINS", "rf-check-good,rf-check-broken")
    assert main(["plugins"]) == 0  # plain listing still lists, and exits 0
    assert "rf-check-broken 0.1 [broken]" in capsys.readouterr().out
    assert main(["plugins", "--check"]) == 1
    out, err = capsys.readouterr()
    assert "rf-check-good" in out  # --check lists too
    assert "error: plugin rf-check-broken is broken: failed to import 'rf_check_broken'" in err, err
    assert "needs torch" in err and "rf-check-good" not in err


def test_plugins_check_exits_1_naming_both_owners_of_a_name(
    site: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    make_dist(site, "rf-check-one", GOOD)
    make_dist(site, "rf-check-two", GOOD)
    monkeypatch.setenv("REINFORGE_LOAD_PLUGINS", "rf-check-one,rf-check-two")
    assert main(["plugins", "--check", "--json"]) == 1
    err = capsys.readouterr().err
    assert "error: judge 'polite' is registered by more than one plugin: rf-check-one, rf-check-two" in err, err


def test_plugins_check_exits_0_when_every_plugin_is_fine(site: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    make_dist(site, "rf-check-fine", GOOD)
    monkeypatch.setenv("REINFORGE_LOAD_PLUGINS", "rf-check-fine")
    assert main(["plugins", "--check"]) == 0
    assert capsys.readouterr().err == ""


# -- registration checks what it registers ---------------------------------------------------------------


def no_response(task):
    return 1.0


def judge_shaped(task, response):
    return 1.0


class NoCall:
    def __init__(self, keyword: str = "please") -> None:
        self.keyword = keyword


class CallWithoutResponse:
    def __call__(self, task):
        return 1.0


@pytest.mark.parametrize(
    ("kind", "obj", "detail"),
    [
        ("judges", 42, "expected a function or a class, got int 42"),
        ("judges", no_response, "expected 'response'"),
        ("judges", NoCall, "has no __call__"),
        ("judges", CallWithoutResponse, "expected 'response'"),
        ("group_rewards", judge_shaped, "parameter 2 is 'response', expected 'responses'"),
        ("workflows", judge_shaped, "parameter 2 is 'response', expected 'model'"),
        ("backends", judge_shaped, "expected a class (a reinforge.plugin.Backend subclass)"),
    ],
)
def test_register_refuses_what_cannot_serve_its_kind(kind: str, obj: object, detail: str) -> None:
    register = Registry().registrar(kind, "reinforge-judge-x")
    with pytest.raises(PluginError) as err:
        register("x", obj)
    message = str(err.value)
    singular = {"judges": "judge", "group_rewards": "group reward", "workflows": "workflow", "backends": "backend"}
    assert message.startswith(f"reinforge-judge-x: {singular[kind]} 'x': "), message
    assert detail in message, message


def test_a_plugin_registering_a_bad_judge_is_listed_broken_not_fine() -> None:
    class Plugin:
        @hookimpl
        def register_judges(self, register):
            register("x", 42)

    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(Plugin(), name="reinforge-judge-x")
    registry = build_registry(pm)
    assert "x" not in registry.names("judges")
    row = next(r for r in describe_plugins(pm) if r["name"] == "reinforge-judge-x")
    assert "judge 'x': expected a function or a class, got int 42" in row["broken"], row


def test_registration_accepts_what_serves_its_kind() -> None:
    class Judge:
        def __call__(self, task, response, logger=None):
            return 1.0

    register = Registry().registrar("judges", "pkg")
    register("function", judge_shaped)
    register("settings_without_defaults", lambda task, response, keyword: 1.0)  # args fill `keyword`
    register("class", Judge)
    register("callable_object", Judge())


# -- core's built-in names -------------------------------------------------------------------------------


def test_a_plugin_taking_a_builtin_name_is_an_error_naming_both_and_the_builtin_still_works() -> None:
    class Taker:
        @hookimpl
        def register_judges(self, register):
            register("json_valid", lambda task, response: 0.0)

    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(Taker(), name="reinforge-judge-taker")
    registry = build_registry(pm)
    assert registry.get("judges", "json_valid").owner == "reinforge"
    assert registry.broken["reinforge-judge-taker"].endswith(
        "reinforge-judge-taker: judge 'json_valid' is a built-in of 'reinforge'; a plugin cannot register a "
        "built-in name (it would replace it for every run): register it under another name"
    )


def test_core_collected_after_a_plugin_still_keeps_its_name() -> None:
    registry = Registry()
    registry.registrar("judges", "reinforge-judge-taker")("json_valid", judge_shaped)
    registry.registrar("judges", "reinforge")("json_valid", judge_shaped)
    assert registry.get("judges", "json_valid").owner == "reinforge"
    assert "reinforge-judge-taker: judge 'json_valid' is a built-in" in registry.broken["reinforge-judge-taker"]


# -- the testing kit does what its docs say ---------------------------------------------------------------


def test_run_command_runs_python_m_reinforge(tmp_path: Path) -> None:
    proc = run_command(["--version"], cwd=tmp_path)
    assert proc.stdout.startswith("reinforge "), proc.stdout
    other = run_process([sys.executable, "-c", "print('any program')"], cwd=tmp_path)
    assert other.stdout == "any program\n"
    with pytest.raises(AssertionError, match=r"pass the subcommand only \(run_command\(\['plugins'\]"):
        run_command([sys.executable, "-m", "reinforge", "plugins"], cwd=tmp_path)  # the old convention, named


def test_hook_recorder_sees_the_register_hooks(hook_recorder) -> None:
    class Plugin:
        @hookimpl
        def register_judges(self, register):
            register("mine", judge_shaped)

    registry = plugin_registry(hook_recorder.pm, {"reinforge-judge-mine": Plugin()})
    assert registry.get("judges", "mine").owner == "reinforge-judge-mine"
    calls = hook_recorder.calls("register_judges")
    assert len(calls) == 2, hook_recorder.names()  # core's built-ins, then the plugin: one call per plugin
    assert all(callable(call["register"]) for call in calls)


PROJECT = """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "rf-check-wheel"
version = "0.1"

[tool.hatch.build.targets.wheel]
packages = ["rf_check_wheel"]
"""


@pytest.mark.slow
def test_build_and_install_leaves_the_project_folder_alone(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "rf_check_wheel").mkdir(parents=True)
    (project / "rf_check_wheel" / "__init__.py").write_text("")
    (project / "pyproject.toml").write_text(PROJECT)
    before = sorted(p.relative_to(project) for p in project.rglob("*"))
    wheel = build_and_install(project, tmp_path / "site")
    assert wheel.is_file() and project not in wheel.parents
    assert sorted(p.relative_to(project) for p in project.rglob("*")) == before
    assert (tmp_path / "site" / "rf_check_wheel" / "__init__.py").is_file()


# -- the plugin template: the error the docs name, and core through its public API only -------------------

TEMPLATE = Path(__file__).resolve().parents[3] / "templates" / "plugin"
CORE_IMPORT = re.compile(r"^\s*(?:from|import)\s+reinforge\.([a-z_]+)", re.M)


def test_the_template_imports_core_only_through_its_public_modules() -> None:
    found = [
        f"{path.relative_to(TEMPLATE)}: reinforge.{module}"
        for path in sorted(TEMPLATE.rglob("*.py"))
        for module in CORE_IMPORT.findall(path.read_text())
        if module not in {"plugin", "testing"}
    ]
    assert not found, found


def test_the_template_raises_the_error_its_docs_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TEMPLATE / "src"))
    monkeypatch.delitem(sys.modules, "reinforge_judge_example.plugin", raising=False)
    from reinforge_judge_example.plugin import PoliteJudge

    with pytest.raises(ConfigurationError, match="example_polite: max_words must be >= 1"):
        PoliteJudge(max_words=0)
    assert "ConfigurationError" in (TEMPLATE / "README.md").read_text()
    for module in [m for m in sys.modules if m.startswith("reinforge_judge_example")]:
        monkeypatch.delitem(sys.modules, module)


# -- install from a checkout or a git URL: the packages are not on PyPI ------------------------------------

REPO = TEMPLATE.parents[1]
FOLDERS = sorted(p.parent.name for p in (REPO / "packages").glob("*/pyproject.toml"))
BARE = re.compile(r"^'?\"?reinforge(?:-[a-z-]+)?(?:\[[^\]]*\])?'?\"?$")  # a name pip looks up on the index


def repository_url() -> str:
    """The repository URL from the packages' ``[project.urls]`` (``.../blob/main/packages/...``)."""
    text = (REPO / "packages" / "core" / "pyproject.toml").read_text()
    return re.search(r'"(https://github\.com/[^/"]+/[^/"]+)/blob/', text).group(1)


def pip_lines(readme: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    return [line for block in blocks for line in block.replace("\\\n", " ").splitlines() if "pip install" in line]


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_package_readme_installs_from_a_checkout_or_git(folder: str) -> None:
    readme = (REPO / "packages" / folder / "README.md").read_text()
    lines = pip_lines(readme)
    assert any(f"./packages/{folder}" in line for line in lines), lines
    assert f"{repository_url()}#subdirectory=packages/{folder}" in readme
    bare = [
        line
        for line in lines
        for word in line.split("#")[0].split()
        if BARE.match(word) and "@" not in line.split("#")[0]
    ]
    assert not bare, f"packages/{folder}/README.md installs from PyPI, where reinforge is not: {bare}"


def test_root_readme_says_how_to_install_each_package() -> None:
    readme = (REPO / "README.md").read_text()
    install = readme[readme.index("\n## Install") : readme.index("\n## ", readme.index("\n## Install") + 1)]
    assert "./packages/core" in install and f"@ git+{repository_url()}#subdirectory=packages/core" in install
    for folder in FOLDERS:
        assert f"`packages/{folder}`" in readme, folder  # the table names every folder the commands take


def test_core_readme_documents_the_check_and_the_kit() -> None:
    readme = (REPO / "packages" / "core" / "README.md").read_text()
    api = readme[readme.index("\n## Writing a plugin") :]
    assert "reinforge plugins --check" in readme
    for words in ("base_dir=None", "`run_process(", "python -m reinforge *args", "`plugin_registry(", "dist=None"):
        assert words in api, words
