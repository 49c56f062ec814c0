"""The run lifecycle core owns, plugin checks and broken plugins (core 0.3 issue, finding 9).

A tiny :class:`Backend` is registered on the kit's ``reinforge_pm``; the kit's
``hook_recorder`` sees every hook call. ``on_run_end`` must come exactly
once whatever ends the run. Each test fails on the core before 0.3 (commit 5195295).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from fake_dists import make_dist

from reinforge import AlgorithmConfig, JudgeOutput, TaskStatus, WorkflowOutput, hookimpl, tune
from reinforge.config import ComponentSpec, DatasetConfig, RunConfig
from reinforge.errors import RunnerError
from reinforge.evaluation import evaluate
from reinforge.job import build_job
from reinforge.plugin import Backend, Settings, at_least, hookspec
from reinforge.plugins import build_registry, check_hookimpls, get_plugin_manager
from reinforge.testing import ScriptedChatModel

TASKS = [{"question": "2 + 2", "answer": "4"}, {"question": "3 + 3", "answer": "6"}]


async def answer(task, model):
    reply = await model.chat([{"role": "user", "content": task["question"]}])
    return WorkflowOutput(response=reply.content)


async def always_fails(task, model):
    return WorkflowOutput(status=TaskStatus.FAILED, error="the sandbox is down")


def exact(task, response):
    return JudgeOutput(reward=float(str(response).strip() == task["answer"]))


class Closing:
    """A judge class: built once per run, closed when the run ends (after on_run_end)."""

    events: list[str] = []

    def __init__(self):
        Closing.events.append("built")

    def __call__(self, task, response):
        return 1.0

    def close(self):
        Closing.events.append("closed")


@dataclass
class ScriptSettings(Settings):
    steps: int = 3
    fail_at: int = 0  # raise inside this step

    def check(self) -> None:
        at_least("steps", self.steps, 1)


class ScriptBackend(Backend):
    """Steps over the same batch; raises at ``fail_at``; stops when an observer asks."""

    name = "script"
    settings = ScriptSettings
    algorithms = {"grpo": None}

    def run(self, job):
        opts = job.backend_settings
        model = ScriptedChatModel(lambda messages, tools, sampling: str(eval(messages[-1]["content"])))
        done = 0
        with job.running() as run:  # core already entered it: the same context
            for step in range(1, opts.steps + 1):
                if run.stop_requested:
                    break
                if step == opts.fail_at:
                    raise RuntimeError("the optimizer produced inf")
                result = job.make_runner(model=model).run(TASKS)
                run.step_end(result.metrics, step=step)
                done = step
        return {"steps": done, "status": "finished"}


@pytest.fixture
def pm(reinforge_pm):
    class Backends:
        @hookimpl
        def register_backends(self, register):
            register("script", ScriptBackend)

    reinforge_pm.register(Backends(), name="script-backend")
    return reinforge_pm


def run_tune(pm, workflow=answer, judge=exact, **backend_args):
    return tune(
        workflow,
        judge,
        algorithm=AlgorithmConfig(algorithm_type="grpo", group_size=2),
        backend="script",
        backend_args=backend_args,
        plugin_manager=pm,
    )


def ends(recorder) -> list[dict]:
    return [call["summary"] for call in recorder.calls("on_run_end")]


# -- on_run_start / on_run_end, whatever ends the run ---------------------------------------------------


def test_a_finished_run_starts_and_ends_once(pm, hook_recorder) -> None:
    summary = run_tune(pm)
    assert hook_recorder.names().count("on_run_start") == 1
    assert ends(hook_recorder) == [summary]
    assert summary["status"] == "finished" and summary["steps"] == 3
    steps = hook_recorder.calls("on_step_end")
    assert [(c["step"], c["kind"]) for c in steps] == [(1, "train"), (2, "train"), (3, "train")]
    assert steps[0]["metrics"]["reward/mean"] == 1.0
    names = hook_recorder.names()
    assert names.index("on_run_start") < names.index("on_step_end") < names.index("on_run_end")


def test_run_end_fires_once_when_every_rollout_of_a_batch_fails(pm, hook_recorder) -> None:
    with pytest.raises(RunnerError, match="every rollout of the batch failed"):
        run_tune(pm, workflow=always_fails)
    assert hook_recorder.names().count("on_run_start") == 1
    (summary,) = ends(hook_recorder)
    assert summary["status"] == "failed"
    assert "the sandbox is down" in summary["error"]


def test_run_end_fires_once_when_the_backend_raises_inside_a_step(pm, hook_recorder) -> None:
    with pytest.raises(RuntimeError, match="the optimizer produced inf"):
        run_tune(pm, fail_at=2)
    (summary,) = ends(hook_recorder)
    assert summary["status"] == "failed" and "RuntimeError: the optimizer produced inf" in summary["error"]
    assert [c["step"] for c in hook_recorder.calls("on_step_end")] == [1]


def test_an_observer_stops_the_run(pm, hook_recorder) -> None:
    class Sentinel:
        @hookimpl
        def on_step_end(self, step, metrics, kind, run):
            if step == 2:
                run.request_stop("reward/mean is 1.0 from step 2: suspicious")

    pm.register(Sentinel(), name="sentinel")
    summary = run_tune(pm, steps=5)
    (ended,) = ends(hook_recorder)
    assert ended is summary
    assert summary["status"] == "stopped"  # the backend's "finished" does not undo it
    assert summary["stop_reason"] == "reward/mean is 1.0 from step 2: suspicious"
    assert summary["steps"] == 2
    assert hook_recorder.names().count("on_run_start") == 1


def test_components_are_built_per_run_and_closed_after_run_end(pm, hook_recorder) -> None:
    Closing.events.clear()

    class Order:
        @hookimpl
        def on_run_end(self, summary, run):
            Closing.events.append("run_end")

    pm.register(Order(), name="order")
    run_tune(pm, judge=Closing, steps=1)
    run_tune(pm, judge=Closing, steps=1)
    assert Closing.events == ["built", "run_end", "closed"] * 2


# -- evaluate() -----------------------------------------------------------------------------------------


def test_evaluate_emits_an_eval_step_and_one_run_end(pm, hook_recorder, tmp_path: Path) -> None:
    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    run = RunConfig(
        workflow=ComponentSpec(ref=answer),
        judges=[ComponentSpec(ref=exact)],
        eval_dataset=DatasetConfig(path=str(data)),
    )
    model = ScriptedChatModel(lambda messages, tools, sampling: str(eval(messages[-1]["content"])))
    report = evaluate(run, model=model, job=build_job(run, pm, need_backend=False))
    assert report.accuracy == 1.0
    (step,) = hook_recorder.calls("on_step_end")
    assert step["kind"] == "eval" and step["step"] == 0 and step["metrics"]["accuracy"] == 1.0
    (summary,) = ends(hook_recorder)
    assert summary["status"] == "finished" and summary["accuracy"] == 1.0
    assert hook_recorder.names().count("on_run_start") == 1
    assert len(hook_recorder.calls("on_trajectory")) == len(TASKS)


# -- hookimpl checks and reinforge_addhooks ---------------------------------------------------------------


class Typo:
    @hookimpl
    def register_judge(self, register):  # meant register_judges
        register("never", exact)


def test_a_misspelt_hookimpl_names_the_plugin_and_the_hook() -> None:
    pm = get_plugin_manager(env={"REINFORGE_LOAD_PLUGINS": ""})
    pm.register(Typo(), name="typo-plugin")
    ((plugin, message),) = check_hookimpls(pm)
    assert isinstance(plugin, Typo)
    assert "'typo-plugin'" in message and "'register_judge'" in message
    assert "register_judges" in message  # the hook that was meant


def test_a_misspelt_hookimpl_in_an_installed_plugin_marks_it_broken(site: Path, monkeypatch) -> None:
    make_dist(
        site, "rf-life-typo", "from reinforge import hookimpl\n@hookimpl\ndef register_judge(register):\n    pass\n"
    )
    pm = get_plugin_manager(env={"REINFORGE_LOAD_PLUGINS": "rf-life-typo"})
    (broken,) = pm.broken
    assert broken.distribution == "rf-life-typo" and "register_judge" in broken.reason
    assert pm.get_plugin("rf-life-typo") is None  # unregistered; core keeps working
    assert "contains" in build_registry(pm).names("judges")


class ToolSpecs:
    """A package's own hookspecs (what rollouts-react does for its tools)."""

    @hookspec
    def register_tools(self, register):
        """Register tools by name."""


class ToolsPlugin:
    @hookimpl
    def reinforge_addhooks(self, pluginmanager):
        pluginmanager.add_hookspecs(ToolSpecs)


class ToolUser:
    @hookimpl
    def register_tools(self, register):
        register("calculator")


@pytest.mark.parametrize("spec_first", [True, False])
def test_a_hookspec_added_by_one_plugin_is_implemented_by_another(spec_first: bool) -> None:
    pm = get_plugin_manager(env={"REINFORGE_LOAD_PLUGINS": ""})
    plugins = [(ToolsPlugin(), "tools"), (ToolUser(), "tool-user")]
    for plugin, name in plugins if spec_first else reversed(plugins):
        pm.register(plugin, name=name)
    assert check_hookimpls(pm) == []
    seen = []
    pm.hook.register_tools(register=seen.append)
    assert seen == ["calculator"]


# -- broken plugins do not take the command line down -----------------------------------------------------


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in [m for m in sys.modules if m.startswith("rf_life")]:
        del sys.modules[name]


NAMED = """
from reinforge import hookimpl

def polite(task, response):
    return float("please" in str(response))

@hookimpl
def register_judges(register):
    register("polite", polite)
"""


def test_load_plugins_accepts_the_distribution_name_when_the_entry_point_differs(site: Path) -> None:
    make_dist(site, "rf-life-named", NAMED, ep_name="rf_life_other")
    for selected in ("rf-life-named", "rf_life_named", "rf_life_other"):
        pm = get_plugin_manager(env={"REINFORGE_LOAD_PLUGINS": selected})
        assert pm.broken == []
        registry = build_registry(pm)
        assert registry.get("judges", "polite").owner == "rf-life-named", selected


def test_a_plugin_that_fails_to_import_is_listed_broken_and_eval_still_works(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from reinforge.cli import main
    from reinforge.testing.openai_server import OpenAIServer

    make_dist(site, "rf-life-broken", "raise ImportError('needs torch, which is not installed')", ep_name="rf_ep")
    make_dist(site, "rf-life-named", NAMED, ep_name="rf_life_other")
    monkeypatch.setenv("REINFORGE_LOAD_PLUGINS", "rf-life-broken,rf-life-named")  # distribution names

    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "rf-life-broken 0.1 [broken]" in out
    assert "needs torch, which is not installed" in out
    assert "rf-life-named 0.1" in out and "polite" in out

    (tmp_path / "wf.py").write_text(
        "from reinforge import WorkflowOutput\n\nasync def echo(task, model):\n    return WorkflowOutput(response=task['text'])\n"
    )
    (tmp_path / "data.jsonl").write_text('{"text": "please"}\n{"text": "no"}\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "wf", raising=False)
    with OpenAIServer(lambda body: "unused") as server:
        (tmp_path / "run.yaml").write_text(
            "workflow: wf:echo\njudges: [polite]\neval_dataset: {path: data.jsonl}\n"
            f'model: {{model_path: scripted, api_base: "{server.base_url}"}}\n'
        )
        assert main(["eval", str(tmp_path / "run.yaml"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["accuracy"] == 0.5
