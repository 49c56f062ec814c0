"""The testing kit's public ways to run what a plugin registers: ``runner_for`` and ``cli_main``.

Plugin tests used to build a ``Runner`` from core internals (``RewardComposer``, ``JudgeSlot``,
``signatures.bind``); ``runner_for`` gives them the runner a backend gets from ``build_job``.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from reinforge import JudgeOutput, RunnerConfig, WorkflowOutput
from reinforge.plugin import AlgorithmConfig, ComponentSpec, RunConfig
from reinforge.testing import ScriptedChatModel, cli_main, runner_for

CLOSED: list[str] = []


async def echo(task, model):
    reply = await model.chat([{"role": "user", "content": task["question"]}])
    return WorkflowOutput(response=reply.content)


class Exact:
    """A class judge: built once per run, closed when the run's components are."""

    def __init__(self, bonus: float = 0.0) -> None:
        self.bonus = bonus

    def __call__(self, task, response):
        return JudgeOutput(reward=float(response == task["answer"]) + self.bonus)

    def close(self) -> None:
        CLOSED.append("exact")


def test_runner_for_a_run_config_runs_its_workflow_and_judges_and_closes_them(reinforge_pm) -> None:
    CLOSED.clear()
    run = RunConfig(
        workflow=ComponentSpec(ref=echo),
        judges=[ComponentSpec(ref=Exact, args={"bonus": 0.5}, name="exact")],
        algorithm=AlgorithmConfig(group_size=3),
        runner=RunnerConfig(max_concurrency=1),
    )
    model = ScriptedChatModel(["4", "5", "4"])
    with runner_for(run, model, plugin_manager=reinforge_pm) as runner:
        assert runner.settings.group_size == 3 and runner.settings.max_concurrency == 1  # from the run
        result = runner.run([{"question": "2+2?", "answer": "4"}])
        assert CLOSED == []
    assert CLOSED == ["exact"]
    assert sorted(t.reward for t in result.trajectories) == [0.5, 1.5, 1.5]
    assert all(t.rewards["reward/exact"] in (0.5, 1.5) for t in result.trajectories)
    assert [len(t.calls) for t in result.trajectories] == [1, 1, 1]  # every call recorded on its trajectory


def test_runner_for_a_run_file_reads_it_as_tune_does(tmp_path: Path, reinforge_pm) -> None:
    (tmp_path / "my_flow.py").write_text(
        textwrap.dedent(
            """
            from reinforge import WorkflowOutput

            async def answer(task, model):
                return WorkflowOutput(response=(await model.chat([{"role": "user", "content": "q"}])).content)
            """
        )
    )
    (tmp_path / "run.yaml").write_text("workflow: my_flow:answer\njudges: [last_number]\n")
    with runner_for(
        tmp_path / "run.yaml", ScriptedChatModel(["it is 7", "8"]), plugin_manager=reinforge_pm, group_size=2
    ) as runner:
        result = runner.run([{"answer": "7"}])
    assert sorted(t.reward for t in result.trajectories) == [0.0, 1.0]


def test_runner_for_needs_exactly_one_model(reinforge_pm) -> None:
    run = RunConfig(workflow=ComponentSpec(ref=echo))
    with (
        pytest.raises(TypeError, match="exactly one of model= or model_provider="),
        runner_for(run, plugin_manager=reinforge_pm),
    ):
        pass


def test_cli_main_runs_the_command_line_in_this_process(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REINFORGE_LOAD_PLUGINS", "")
    assert cli_main(["plugins", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert "last_number" in json.dumps(listed)
    with pytest.raises(SystemExit) as usage:  # argparse's usage error, as from the shell
        cli_main(["no-such-command"])
    assert usage.value.code == 2 and "invalid choice: 'no-such-command'" in capsys.readouterr().err
