"""The pytest plugin of the testing kit: fixtures, hook recorder and entry-point checks."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from fake_dists import make_dist

from reinforge.plugins import build_registry
from reinforge.testing import HookRecorder, OpenAIServer, ScriptedChatModel, check_entry_point
from reinforge.trajectory import Trajectory

pytest_plugins = ["pytester"]


# -- fixtures (activated by conftest.py's pytest_plugins) -------------------------


def test_reinforge_pm_has_only_core(reinforge_pm) -> None:
    assert [reinforge_pm.get_name(p) for p in reinforge_pm.get_plugins()] == ["reinforge"]
    assert set(build_registry(reinforge_pm).by_owner()) <= {"reinforge"}


def test_reinforge_pm_ignores_installed_plugins(site: Path, monkeypatch: pytest.MonkeyPatch, request) -> None:
    make_dist(site, "rf-fake-installed", PLUGIN)
    monkeypatch.delenv("REINFORGE_LOAD_PLUGINS", raising=False)  # unset would mean "load all installed"
    pm = request.getfixturevalue("reinforge_pm")
    assert pm.get_plugin("rf-fake-installed") is None
    assert "my_judge" not in build_registry(pm).names("judges")


def test_hook_recorder_records_observer_calls(hook_recorder) -> None:
    traj = Trajectory(task={"q": 1})
    hook_recorder.pm.hook.on_trajectory(trajectory=traj, run=None)
    hook_recorder.pm.hook.on_step_end(step=1, metrics={"reward": 0.5}, kind="train", run=None)
    hook_recorder.pm.hook.on_step_end(step=2, metrics={"reward": 0.7}, kind="train", run=None)
    hook_recorder.pm.hook.on_run_end(summary={"steps": 2}, run=None)
    assert hook_recorder.getcall("on_trajectory")["trajectory"] is traj
    assert [c["step"] for c in hook_recorder.calls("on_step_end")] == [1, 2]
    assert hook_recorder.names() == ["on_trajectory", "on_step_end", "on_step_end", "on_run_end"]
    with pytest.raises(AssertionError, match="exactly one call of 'on_step_end', got 2"):
        hook_recorder.getcall("on_step_end")


def test_hook_recorder_sees_calls_that_plugins_also_handle(reinforge_pm) -> None:
    from reinforge import hookimpl

    seen = []

    class Observer:
        @hookimpl
        def on_run_end(self, summary):
            seen.append(summary)

    reinforge_pm.register(Observer())
    with HookRecorder.attach(reinforge_pm) as rec:
        reinforge_pm.hook.on_run_end(summary={"ok": True}, run=None)
    reinforge_pm.hook.on_run_end(summary={"after": "detach"}, run=None)
    assert seen == [{"ok": True}, {"after": "detach"}]
    assert rec.calls("on_run_end") == [{"summary": {"ok": True}, "run": None}]


def test_scripted_model_fixture(scripted_model) -> None:
    model = scripted_model(["hi"])
    assert isinstance(model, ScriptedChatModel)
    assert asyncio.run(model.chat([{"role": "user", "content": "x"}])).content == "hi"


def test_openai_server_fixture_starts_servers(openai_server) -> None:
    a = openai_server(lambda body: "a")
    b = openai_server(lambda body: "b", model_name="other")
    assert isinstance(a, OpenAIServer) and a.base_url != b.base_url and b.model_name == "other"


def test_importing_the_kit_does_not_import_pytest() -> None:
    import subprocess

    code = "import sys, reinforge.testing; print('pytest' in sys.modules, 'litellm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# -- opt-in activation ------------------------------------------------------------

FIXTURE_TEST = """
    def test_uses_kit(reinforge_pm, hook_recorder, scripted_model, openai_server):
        hook_recorder.pm.hook.on_run_end(summary={})
        assert hook_recorder.calls("on_run_end") == [{"summary": {}}]
"""


def test_plugin_activates_with_dash_p(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(FIXTURE_TEST)
    pytester.runpytest_subprocess("-p", "reinforge.testing").assert_outcomes(passed=1)


def test_plugin_activates_with_pytest_plugins(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["reinforge.testing"]')
    pytester.makepyfile(FIXTURE_TEST)
    pytester.runpytest_subprocess().assert_outcomes(passed=1)


def test_plugin_is_not_auto_registered(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(FIXTURE_TEST)
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'reinforge_pm' not found*"])


# -- check_entry_point --------------------------------------------------------------


def test_check_entry_point_names_a_missing_distribution() -> None:
    with pytest.raises(AssertionError, match=r"'reinforge-no-such-plugin' is not installed"):
        check_entry_point("reinforge-no-such-plugin", judges=["x"])


PLUGIN = """
    from reinforge import hookimpl

    def my_judge(task, response):
        return 1.0

    def my_workflow(task, model):
        return None

    @hookimpl
    def register_judges(register):
        register("my_judge", my_judge)
        register("other_judge", my_judge)

    @hookimpl
    def register_workflows(register):
        register("my_workflow", my_workflow)
"""


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("rf_fake")]:
        del sys.modules[name]


def test_check_entry_point_passes_and_returns_names(site: Path) -> None:
    make_dist(site, "rf-fake-ok", PLUGIN)
    found = check_entry_point("rf-fake-ok", judges=["my_judge", "other_judge"], workflows=["my_workflow"])
    assert found == {
        "workflows": ["my_workflow"],
        "judges": ["my_judge", "other_judge"],
        "group_rewards": [],
        "backends": [],
        "run_sections": [],
    }


def test_check_entry_point_reports_missing_and_unclaimed_names(site: Path) -> None:
    make_dist(site, "rf-fake-claims", PLUGIN)
    with pytest.raises(AssertionError) as info:
        check_entry_point("rf-fake-claims", judges=["my_judge", "ghost"], workflows=["my_workflow"])
    message = str(info.value)
    assert "judges: claimed but not registered: ['ghost']" in message
    assert "judges: registered but not claimed: ['other_judge']" in message
    assert "workflows" not in message
    # exact=False only needs the claimed names to be there
    check_entry_point("rf-fake-claims", judges=["my_judge"], exact=False)


def test_check_entry_point_reports_import_errors(site: Path) -> None:
    make_dist(site, "rf-fake-broken", "raise ImportError('needs torch')")
    with pytest.raises(AssertionError, match="failed to import.*needs torch"):
        check_entry_point("rf-fake-broken")


def test_check_entry_point_requires_an_entry_point_named_after_the_dist(site: Path) -> None:
    make_dist(site, "rf-fake-noep", PLUGIN, with_ep=False)
    with pytest.raises(AssertionError, match="declares no entry point in group 'reinforge'"):
        check_entry_point("rf-fake-noep")
    make_dist(site, "rf-fake-named", PLUGIN, ep_name="something_else")
    with pytest.raises(AssertionError, match="must be named after the distribution"):
        check_entry_point("rf-fake-named")


def test_check_entry_point_catches_hookimpl_typos(site: Path) -> None:
    make_dist(
        site, "rf-fake-typo", "from reinforge import hookimpl\n@hookimpl\ndef register_judge(register):\n    pass\n"
    )
    with pytest.raises(AssertionError, match="register_judge"):
        check_entry_point("rf-fake-typo")


def test_check_entry_point_reports_clashes_with_core(site: Path, reinforge_pm) -> None:
    core_judges = build_registry(reinforge_pm).names("judges")
    if not core_judges:
        pytest.skip("core registers no judge to clash with")
    name = core_judges[0]
    source = f"from reinforge import hookimpl\n@hookimpl\ndef register_judges(register):\n    register({name!r}, lambda task, response: 1.0)\n"
    make_dist(site, "rf-fake-clash", source)
    with pytest.raises(AssertionError, match=f"rf-fake-clash: judge {name!r} is a built-in of 'reinforge'"):
        check_entry_point("rf-fake-clash", judges=[name])
