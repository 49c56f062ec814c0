"""The command line through its real parts: run files, a real HTTP model server, litellm."""

import json
import re
import shutil
from pathlib import Path

import pytest

from reinforge.cli import main
from reinforge.testing.openai_server import OpenAIServer

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "math"

# The DashScope test inputs exactly as their docs show them (../shared/seeds/004_*.txt).
ROLLOUT_INPUT = {
    "func_type": "rollout",
    "messages": [{"role": "user", "content": "Calculate 48 + 24 = ?"}],
    "ground_truth": "72",
    "sampling_params": {"temperature": 0.7, "max_tokens": 1024, "max_turns": 25},
    "model_resource": {
        "model_name": "qwen3-4b-instruct-2507",
        "base_url": "https://dashscope.aliyuncs.com/compatible-mode/v1",
        "api_key": "your-api-key",
    },
}
REWARD_INPUT = {
    "func_type": "reward",
    "ground_truth": "72",
    "agent_output": {
        "messages": [{"role": "user", "content": "Calculate 48 + 24 = ?"}],
        "rollout_metrics": {"accuracy": 0.95},
        "reward_score": None,
    },
}

# Workflow and judge in the style of AgentScope's tuner tutorial (../shared/seeds/001_*.txt).
AGENTSCOPE_STYLE = """
from typing import Any
from reinforge import WorkflowOutput, JudgeOutput

async def example_workflow_function(task: dict, model, auxiliary_models=None) -> WorkflowOutput:
    question = task.get("question") or task["messages"][-1]["content"]
    response = await model.chat([{"role": "system", "content": "You are a helpful math agent."},
                                 {"role": "user", "content": question}])
    return WorkflowOutput(response=response)

async def example_judge_function(task: dict, response: Any, auxiliary_models=None) -> JudgeOutput:
    ground_truth = task["answer"]
    text = response.get_text_content() if hasattr(response, "get_text_content") else str(response)
    return JudgeOutput(reward=1.0 if ground_truth in text else 0.0)

async def count_group(task, responses):
    return [float(len(str(r))) for r in responses]
"""


def adder(body):
    """A scripted model: right answer for a + b, in a sentence."""
    a, b = map(int, re.findall(r"\d+", body["messages"][-1]["content"])[:2])
    return f"The answer is {a + b}."


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "tutorial_funcs.py").write_text(AGENTSCOPE_STYLE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def write(path: Path, data) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def test_try_workflow_with_the_dashscope_rollout_input(project, capsys):
    inp = write(project / "rollout_input.json", ROLLOUT_INPUT)
    with OpenAIServer(adder) as server:
        code = main(
            [
                "try",
                "workflow",
                "tutorial_funcs:example_workflow_function",
                "--input",
                inp,
                "--api-base",
                server.base_url,
                "--judge",
                "tutorial_funcs:example_judge_function",
                "--judge",
                "last_number",
            ]
        )
        sent = server.requests[0]
    out = capsys.readouterr().out
    assert code == 0
    assert sent["messages"][-1]["content"] == "Calculate 48 + 24 = ?"
    assert sent["temperature"] == 0.7 and sent["max_tokens"] == 1024  # sampling_params applied, max_turns not sent
    assert "response: The answer is 72." in out
    assert "[user] Calculate 48 + 24 = ?" in out  # the transcript
    assert re.search(r"judge .*example_judge_function: reward 1.0", out)
    assert re.search(r"judge .*last_number: reward 1.0", out)


def test_try_judge_with_the_dashscope_reward_input(project, capsys):
    inp = write(project / "reward_input.json", REWARD_INPUT)
    assert main(["try", "judge", "tutorial_funcs:example_judge_function", "--input", inp]) == 0
    out = capsys.readouterr().out
    assert "no assistant message" in out
    assert re.search(r"reward 0.0, status success", out)
    with_answer = dict(REWARD_INPUT, agent_output={"messages": [{"role": "assistant", "content": "48 + 24 = 72"}]})
    assert main(["try", "judge", "contains", "--input", write(project / "r2.json", with_answer)]) == 0
    assert re.search(r"reward 1.0, status success", capsys.readouterr().out)


def test_try_group_reward_our_format_and_wrong_length(project, capsys):
    inp = write(project / "g.json", {"task": {"q": 1}, "responses": ["a", "bbb"]})
    assert main(["try", "group-reward", "tutorial_funcs:count_group", "--input", inp]) == 0
    out = capsys.readouterr().out
    assert "[0] reward 1.0  a" in out and "[1] reward 3.0  bbb" in out


def test_try_warns_when_scoring_is_slower_than_a_third_of_the_rollout(project, capsys):
    (project / "slow.py").write_text(
        "import time\n"
        "def slow_judge(task, response):\n"
        "    t = time.perf_counter()\n"
        "    while time.perf_counter() - t < 0.05: pass\n"
        "    return 1.0\n"
    )
    inp = dict(REWARD_INPUT)
    inp["agent_output"] = dict(REWARD_INPUT["agent_output"], rollout_metrics={"latency": 0.01})
    assert main(["try", "judge", "slow:slow_judge", "--input", write(project / "in.json", inp)]) == 0
    assert "more than a third of the rollout" in capsys.readouterr().err


def test_try_reports_bad_input_with_the_file(project, capsys):
    bad = project / "bad.json"
    bad.write_text("{not json")
    assert main(["try", "judge", "contains", "--input", str(bad)]) == 1
    assert "bad.json: invalid JSON at line 1" in capsys.readouterr().err
    assert main(["try", "judge", "nosuch:judge", "--input", str(bad)]) == 1
    assert "nosuch" in capsys.readouterr().err


def test_eval_of_the_math_example_through_litellm_and_a_real_server(tmp_path, capsys):
    shutil.copytree(EXAMPLE, tmp_path / "math")
    with OpenAIServer(lambda body: "The answer is " + str(eval(body["messages"][-1]["content"][8:-1]))) as server:
        code = main(
            ["eval", str(tmp_path / "math" / "run.yaml"), "--api-base", server.base_url, "--limit", "12", "--json"]
        )
        calls = server.call_count
    out = capsys.readouterr().out
    assert code == 0 and calls == 12
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["accuracy"] == 1.0 and summary["tasks"] == 12
    dims = summary["dimensions"]
    assert dims["reward/correct"] == 1.0
    assert dims["reward/format"] == 0.0  # "The answer is N" is not just the number
    assert 0 < dims["reward/concise"] < 1
    assert dims["reward"] == pytest.approx(0.7 + 0.1 * dims["reward/concise"])
    assert "accuracy (reward/correct >= 1): 1" in out


def test_eval_with_a_flaky_server_retries_and_never_scores_failures(tmp_path, capsys):
    shutil.copytree(EXAMPLE, tmp_path / "math")
    from reinforge.testing.openai_server import Reply

    seen = {}

    def flaky(body):
        q = body["messages"][-1]["content"]
        seen[q] = seen.get(q, 0) + 1
        if q.endswith("+ 25?") or seen[q] == 1:  # one question always fails, every question fails once
            return Reply(status=503)
        return "42"

    with OpenAIServer(flaky) as server:
        code = main(
            ["eval", str(tmp_path / "math" / "run.yaml"), "--api-base", server.base_url, "--limit", "5", "--json"]
        )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    assert summary["counters"]["failed/workflow"] == 1 and summary["kept"] == 4
    assert summary["counters"]["retries"] >= 4


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("workflow: wf:echo\ntrain_dataset: {path: missing.jsonl}\n", "train_dataset.path"),
        ("workflow: wf:echo\nalgoritm: {}\n", "unknown key 'algoritm'"),
        ("workflow: wf:echo\nalgorithm: {group_size: many}\n", "algorithm.group_size"),
        ("workflow: wf:bad\n", "parameter 'extra'"),
        ("workflow: nosuchmodule:echo\n", "nosuchmodule"),
    ],
)
def test_bad_run_files_name_the_file_and_key(tmp_path, capsys, yaml_text, message):
    (tmp_path / "wf.py").write_text(
        "from reinforge import WorkflowOutput\n"
        "async def echo(task, model): return WorkflowOutput(response='x')\n"
        "async def bad(task, model, extra): return WorkflowOutput(response='x')\n"
    )
    run = tmp_path / "run.yaml"
    run.write_text(yaml_text + "eval_dataset: {path: data.jsonl}\n")
    (tmp_path / "data.jsonl").write_text('{"q": 1}\n')
    assert main(["eval", str(run), "--api-base", "http://127.0.0.1:9/v1"]) == 1
    err = capsys.readouterr().err
    assert "run.yaml" in err and message in err


def test_tune_without_a_backend_says_what_to_install(tmp_path, capsys):
    shutil.copytree(EXAMPLE, tmp_path / "math")
    assert main(["tune", str(tmp_path / "math" / "run.yaml"), "--backend", "nonexistent"]) == 1
    assert "pip install reinforge-backend-nonexistent" in capsys.readouterr().err


def test_plugins_lists_core_builtins(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("reinforge ")
    assert "last_number" in out and "length_penalty" in out


def test_plugins_add_subcommands_through_register_commands(monkeypatch, capsys):
    from reinforge import hookimpl
    from reinforge.plugins import get_plugin_manager

    class Commands:
        @hookimpl
        def register_commands(self, register):
            def run(args):
                print(f"audited {args.judge}")
                return 3

            register("judge audit", run, help="audit a judge", arguments=lambda p: p.add_argument("--judge"))

    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(Commands(), name="cmds")
    monkeypatch.setattr("reinforge.plugins.get_plugin_manager", lambda: pm)
    assert main(["judge", "audit", "--judge", "x"]) == 3
    assert capsys.readouterr().out == "audited x\n"
