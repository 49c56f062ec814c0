"""Core 0.4 (issue 31): reward composition in the composer, and the third-party author's findings.

Each test fails on core 0.3 (commit cdd16e7): the composer had no ``score_group``, ``on_trajectory``
had no ``run``, function judges' ``args`` were not type-checked, a group reward's metrics did not
reach the eval summary, ``evaluate(run)`` used every installed plugin, the weights warning pointed at
``reinforge/job.py``, a default ``min_group_size`` was reported as the user's, and ``try`` settings
errors did not name the component.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from reinforge import GroupRewardOutput, JudgeOutput, TaskStatus, WorkflowOutput, hookimpl
from reinforge.cli import main
from reinforge.config import ComponentSpec, DatasetConfig, EvalConfig, RunConfig
from reinforge.errors import ConfigError, SignatureError
from reinforge.evaluation import evaluate
from reinforge.job import build_job
from reinforge.lifecycle import RunContext
from reinforge.plugin import Backend, Settings
from reinforge.plugins import build_registry
from reinforge.rewards import JudgeSlot, RewardComposer, Rollout
from reinforge.runfile import load_run
from reinforge.signatures import bind
from reinforge.testing import ScriptedChatModel

CORE_README = Path(__file__).resolve().parents[1] / "README.md"


async def echo(task, model):
    reply = await model.chat([{"role": "user", "content": task["text"]}])
    return WorkflowOutput(response=reply.content)


def is_a(task, response):
    return JudgeOutput(reward=float(response == "a"))


def by_length(task, responses):
    """Longer is better; reports how many responses it ranked."""
    top = max(len(r) for r in responses)
    return GroupRewardOutput(rewards=[len(r) / top for r in responses], metrics={"ranked": float(len(responses))})


@dataclass
class KwSettings(Settings):
    threshold: float = 0.5


class Plugin:
    """What these tests register on the kit's ``reinforge_pm``: nothing installed knows these names."""

    @hookimpl
    def register_workflows(self, register):
        register("only_here_echo", echo)

    @hookimpl
    def register_judges(self, register):
        register("only_here_is_a", is_a)
        register("kw", lambda task, response, threshold=0.5: float(len(response) > threshold), settings=KwSettings)

    @hookimpl
    def register_group_rewards(self, register):
        register("only_here_by_length", by_length)

    @hookimpl
    def register_backends(self, register):
        register("dry", DryBackend)


class DryBackend(Backend):
    name = "dry"
    algorithms = {"grpo": None}

    def run(self, job):  # pragma: no cover - dry runs only
        raise AssertionError("a dry run must not train")


@pytest.fixture
def pm(reinforge_pm):
    reinforge_pm.register(Plugin(), name="findings-31")
    return reinforge_pm


@pytest.fixture
def cli_pm(pm, monkeypatch: pytest.MonkeyPatch):
    """The command line sees only ``pm``'s plugins."""
    monkeypatch.setattr("reinforge.plugins.get_plugin_manager", lambda **kw: pm)
    return pm


def write_run(folder: Path, text: str, rows: list[dict] | None = None) -> Path:
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows or [{"text": "a"}]))
    path = folder / "run.yaml"
    path.write_text(text)
    return path


# -- reward composition in one place ----------------------------------------------------------------------


def test_score_group_gives_every_response_its_final_reward() -> None:
    composer = RewardComposer(
        [JudgeSlot("is_a", bind(is_a, "judge"), weight=0.5)],
        group_reward=bind(by_length, "group_reward"),
        group_reward_weight=0.5,
    )
    rollouts = [Rollout("a"), Rollout("bb"), Rollout(""), Rollout("x", preset=0.25)]
    scores = asyncio.run(composer.score_group({}, rollouts))
    assert all(s.final and s.status is TaskStatus.SUCCESS for s in scores)
    # "a": 0.5 * 1 + 0.5 * (1/2); "bb": 0.5 * 0 + 0.5 * 1; the empty one and the preset one skip the group
    assert [s.reward for s in scores] == [0.75, 0.5, 0.0, 0.25]
    assert scores[0].rewards == {"reward/is_a": 1.0, "reward/group": 0.5, "reward/group/ranked": 2.0}
    assert "reward/group" not in scores[2].rewards and "reward/group" not in scores[3].rewards


def test_score_group_retries_a_failing_group_reward_then_discards_never_zero() -> None:
    calls = []

    def down(task, responses):
        calls.append(len(responses))
        raise ConnectionError("503 from the preference model")

    composer = RewardComposer([], group_reward=bind(down, "group_reward"), max_retries=2, judge_timeout_s=5.0)
    counters: Counter[str] = Counter()
    scores = asyncio.run(composer.score_group({}, [Rollout("x"), Rollout("y")], counters=counters))
    assert calls == [2, 2, 2]
    assert all(s.status is TaskStatus.FAILED and s.reward is None for s in scores)
    assert all(s.failure == "group_reward" and "ConnectionError: 503" in (s.error or "") for s in scores)
    assert counters == Counter({"retries": 2, "failed": 2, "failed/group_reward": 2})


def test_the_job_carries_the_group_reward_inside_its_composer(pm, tmp_path: Path) -> None:
    path = write_run(
        tmp_path, "workflow: only_here_echo\njudges: [only_here_is_a]\ngroup_reward: only_here_by_length\n"
    )
    with pytest.warns(UserWarning):  # 1 + 1: normalized
        job = build_job(load_run(path), pm, need_backend=False)
    assert not hasattr(job, "group_reward")
    assert job.composer.group_reward is not None and job.composer.group_reward.name == "only_here_by_length"
    assert job.composer.weights == {"only_here_is_a": 0.5, "group": 0.5}
    assert job.components[-1] is job.composer.group_reward
    job.close()


# -- on_trajectory gets the run ------------------------------------------------------------------------------


def group_run(tmp_path: Path) -> RunConfig:
    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps({"text": "a"}) + "\n" + json.dumps({"text": "bb"}) + "\n")
    return RunConfig(
        workflow=ComponentSpec(ref=echo),
        judges=[ComponentSpec(ref=is_a)],
        group_reward=ComponentSpec(ref=by_length),
        eval_dataset=DatasetConfig(path=str(data)),
        eval=EvalConfig(group_size=2),
    )


def replies() -> ScriptedChatModel:
    """Says back what it was asked."""
    return ScriptedChatModel(lambda messages, tools, sampling: messages[-1]["content"])


@pytest.mark.filterwarnings("ignore:.*weights")
def test_on_trajectory_gets_the_run_like_the_other_observer_hooks(pm, hook_recorder, tmp_path: Path) -> None:
    run = group_run(tmp_path)
    evaluate(run, model=replies(), job=build_job(run, pm, need_backend=False))
    calls = hook_recorder.calls("on_trajectory")
    assert len(calls) == 4
    (start,) = hook_recorder.calls("on_run_start")
    assert all(isinstance(c["run"], RunContext) and c["run"] is start["run"] for c in calls)
    assert start["run"].kind == "eval"


# -- c. a group reward's metrics reach the eval summary -------------------------------------------------------


@pytest.mark.filterwarnings("ignore:.*weights")
def test_a_group_rewards_metrics_reach_the_eval_summary_like_a_judges(pm, tmp_path: Path) -> None:
    run = group_run(tmp_path)
    summary = evaluate(run, model=replies(), job=build_job(run, pm, need_backend=False)).summary()
    assert summary["metrics"]["reward/group/ranked/mean"] == 2.0
    assert summary["dimensions"]["reward/group/ranked"] == 2.0
    assert summary["dimensions"]["reward/group"] == 1.0  # both rollouts of a task say the same
    assert "reward/is_a/mean" in summary["metrics"]  # as a judge's


# -- d. evaluate(run) uses the registry the run was loaded with ------------------------------------------------


def test_evaluate_builds_from_the_registry_the_run_was_loaded_with(pm, hook_recorder, tmp_path: Path) -> None:
    path = write_run(
        tmp_path,
        "workflow: only_here_echo\njudges: [only_here_is_a]\neval_dataset: {path: data.jsonl}\n",
    )
    run = load_run(path, registry=build_registry(pm))
    report = evaluate(run, model=replies())  # no installed plugin registers these names
    assert report.accuracy == 1.0
    assert hook_recorder.names().count("on_run_end") == 1  # the observers are those of that registry too


# -- a. function judges' args are checked from their annotations ------------------------------------------------


def test_a_function_judges_arg_of_the_wrong_type_fails_load_run_naming_judge_and_key(pm, tmp_path: Path) -> None:
    path = write_run(tmp_path, 'workflow: only_here_echo\njudges: [{ref: length_penalty, args: {target: "8"}}]\n')
    message = r"judges\[0\]: judge length_penalty: args.target: expected an integer, got str '8'"
    with pytest.raises(ConfigError, match=message):
        load_run(path, registry=build_registry(pm))


def test_tune_dry_run_refuses_a_function_judges_arg_of_the_wrong_type(cli_pm, tmp_path: Path, capsys) -> None:
    path = write_run(
        tmp_path,
        "workflow: only_here_echo\n"
        "judges: [{ref: length_penalty, args: {target: 200, limit: [800]}}]\n"
        "backend: dry\ntrain_dataset: {path: data.jsonl}\n",
    )
    assert main(["tune", str(path), "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert f"{path.resolve()}: judges[0]: judge length_penalty: args.limit: expected an integer, got list [800]" in err


def test_an_unknown_function_judge_arg_gets_a_did_you_mean(pm, tmp_path: Path) -> None:
    path = write_run(tmp_path, "workflow: only_here_echo\njudges: [{ref: length_penalty, args: {targt: 8}}]\n")
    with pytest.raises(SignatureError, match=r"has no parameter 'targt' \(set in args\) \(did you mean 'target'\?\)"):
        load_run(path, registry=build_registry(pm))


class Threshold:
    """A judge class without a settings class: its constructor's annotations are checked."""

    def __init__(self, threshold: float = 0.5) -> None:
        self.threshold = threshold

    def __call__(self, task, response):
        return float(len(response) > self.threshold)


def test_a_judge_classs_constructor_args_are_checked_from_its_annotations() -> None:
    from reinforge.components import plan_component

    spec = ComponentSpec(ref=Threshold, args={"threshold": "high"})
    with pytest.raises(ConfigError, match=r"run.yaml: judges\[0\]: .*args.threshold: expected a number, got str"):
        plan_component(spec, "judge", where="run.yaml: judges[0]")
    with pytest.raises(SignatureError, match=r"\(did you mean 'threshold'\?\)"):
        plan_component(ComponentSpec(ref=Threshold, args={"treshold": 1}), "judge", where="run.yaml: judges[0]")
    assert plan_component(ComponentSpec(ref=Threshold, args={"threshold": 2}), "judge").settings == {"threshold": 2}


# -- e. the group-reward contract is documented; the weights warning points at the run file ----------------------


def test_the_readme_documents_the_group_reward_contract() -> None:
    text = CORE_README.read_text()
    section = text[text.index("### The group reward") :]
    section = section[: section.index("\n## ")]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    namespace: dict = {}
    exec(code.group(1), namespace)  # the documented example follows the contract
    bound = bind(namespace["prefer_shorter"], "group_reward")
    out = bound.check_output(asyncio.run(bound.call({}, ["a", "bbb", "cc"])), group_size=3)
    assert out.rewards == [1.0, 0.0, 0.5]
    for fact in (
        "`(task, responses, auxiliary_models=None, logger=None) -> GroupRewardOutput`",
        "exactly one reward per response",
        "`reward/group`",
        "1.0 unless set",
    ):
        assert fact in section, fact


def test_the_weights_warning_points_at_the_run_file(pm, tmp_path: Path) -> None:
    path = write_run(tmp_path, "workflow: only_here_echo\n\njudges:\n  - only_here_is_a\n  - {ref: kw, weight: 3}\n")
    with pytest.warns(UserWarning, match="weights") as record:
        build_job(load_run(path), pm, need_backend=False).close()
    (warning,) = [w for w in record if "weights" in str(w.message)]
    assert warning.filename == str(path.resolve()) and warning.lineno == 3
    assert str(warning.message).startswith(f"{path.resolve()}: judge weights:")


def test_the_weights_warning_of_a_run_built_in_python_points_at_the_caller(pm) -> None:
    run = RunConfig(workflow=ComponentSpec(ref=echo), judges=[ComponentSpec(ref=is_a), ComponentSpec(ref="kw")])
    with pytest.warns(UserWarning, match="weights") as record:
        build_job(run, pm, need_backend=False).close()
    assert record[0].filename == __file__


# -- f. a default never set is not reported as the user's -----------------------------------------------------------


def test_the_default_min_group_size_adapts_to_a_smaller_group(pm, tmp_path: Path) -> None:
    path = write_run(tmp_path, "workflow: only_here_echo\njudges: [only_here_is_a]\nalgorithm: {group_size: 1}\n")
    assert load_run(path).runner.min_group_size == 1
    path.write_text(path.read_text() + "runner: {min_group_size: 3}\n")
    with pytest.raises(ConfigError, match=r"runner.min_group_size: \(3\) is larger than algorithm.group_size \(1\)"):
        load_run(path)


# -- g. try's settings errors name the component ----------------------------------------------------------------------


def test_try_settings_errors_name_the_component(cli_pm, tmp_path: Path, capsys) -> None:
    inp = tmp_path / "in.json"
    inp.write_text(json.dumps({"task": {}, "response": "abc"}))
    assert main(["try", "judge", "kw", "--input", str(inp), "--args", '{"threshold": "high"}']) == 1
    err = capsys.readouterr().err
    assert "reinforge try: judge kw: args.threshold: expected a number, got str 'high'" in err
