"""The registered `react` workflow through the real command line, a real HTTP model server and litellm."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reinforge.testing import cli_main
from reinforge.testing.openai_server import OpenAIServer
from reinforge_rollouts_react import __version__

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "react-calculator"
needs_example = pytest.mark.skipif(not EXAMPLE.is_dir(), reason="runs inside the monorepo only")


def calculator_student(body):
    """A scripted text-protocol agent: call the calculator on the question, then answer with the observation."""
    last = body["messages"][-1]["content"]
    if last.startswith("Observation: "):
        return f"Thought: The calculator says {last[13:]}.\nFinal Answer: {last[13:]}"
    expression = re.search(r"What is (.+)\?", last).group(1)
    return f'Thought: I should use the calculator.\nAction: calculator\nAction Input: {{"expression": "{expression}"}}'


RUN_YAML = """
workflow:
  name: react
  args:
    tools: [calculator]
    max_turns: 3
    sys_prompt: Solve the arithmetic problem.
judges:
  - {name: last_number, metric: correct}
eval_dataset: {path: tasks.jsonl}
model: {model_path: scripted-student, max_tokens: 48, temperature: 0.0}
eval: {accuracy_key: reward/correct}
"""


def test_eval_of_a_react_run_file_against_a_real_server(tmp_path, capsys):
    rows = [{"question": f"What is {a} * {b}?", "answer": str(a * b)} for a, b in [(347, 28), (912, 15), (100, 99)]]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "run.yaml").write_text(RUN_YAML)
    output = tmp_path / "eval.json"
    with OpenAIServer(calculator_student, model_name="scripted-student") as server:
        code = cli_main(
            ["eval", str(tmp_path / "run.yaml"), "--api-base", server.base_url, "--json", "--output", str(output)]
        )
        requests = server.requests
    out = capsys.readouterr().out
    assert code == 0, out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["accuracy"] == 1.0 and summary["kept"] == 3

    assert len(requests) == 6  # two turns per task: act, then answer
    for body in requests:
        assert "tools" not in body  # a litellm model does not claim native tool support: text protocol
        assert body["stop"] == ["\nObservation:"] and body["max_tokens"] == 48
        assert body["messages"][0]["content"].startswith("Solve the arithmetic problem.")
    answers = [b for b in requests if b["messages"][-1]["content"].startswith("Observation:")]
    assert sorted(b["messages"][-1]["content"] for b in answers) == [
        "Observation: 13680",
        "Observation: 9716",
        "Observation: 9900",
    ]

    trajectories = json.loads(output.read_text())["trajectories"]
    for t in trajectories:
        assert len(t["calls"]) == 2 and t["response"] == t["task"]["answer"]
        assert t["metrics"]["turns"] == 2 and t["metrics"]["tool_call_count"] == 1
        assert t["metrics"]["invalid_action_count"] == 0 and t["metrics"]["finish_reason/answer"] == 1.0


def test_try_workflow_react_prints_the_transcript(tmp_path, capsys):
    task = tmp_path / "task.json"
    task.write_text(json.dumps({"task": {"question": "What is 347 * 28?", "answer": "9716"}}))
    with OpenAIServer(calculator_student) as server:
        code = cli_main(
            [
                "try",
                "workflow",
                "react",
                "--input",
                str(task),
                "--api-base",
                server.base_url,
                "--args",
                json.dumps({"tools": ["calculator"], "max_turns": 3}),
                "--judge",
                "last_number",
            ]
        )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "status success" in out and "2 model call(s)" in out
    assert "[user] What is 347 * 28?" in out
    assert "[=> assistant] Thought: I should use the calculator." in out and "Action: calculator" in out
    assert "[user] Observation: 9716" in out
    assert "[=> assistant] Thought: The calculator says 9716." in out
    assert "response: 9716" in out
    assert re.search(r"judge .*last_number: reward 1.0", out)
    assert "tool_call_count: 1.0" in out and "finish_reason/answer: 1.0" in out


def test_plugins_lists_the_react_workflow(capsys):
    assert cli_main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"reinforge-rollouts-react {re.escape(__version__)}\n  workflows: react", out)


@needs_example
def test_the_example_evaluates_end_to_end(tmp_path, capsys):
    shutil.copytree(EXAMPLE, tmp_path / "example")
    with OpenAIServer(calculator_student) as server:
        code = cli_main(
            ["eval", str(tmp_path / "example" / "run.yaml"), "--api-base", server.base_url, "--limit", "6", "--json"]
        )
    out = capsys.readouterr().out
    assert code == 0, out
    summary = json.loads(out.strip().splitlines()[-1])
    dims = summary["dimensions"]
    assert summary["accuracy"] == 1.0 and summary["kept"] == 6
    assert dims["reward/correct"] == 1.0 and dims["reward/tool_use"] == 1.0 and dims["reward/protocol"] == 1.0
    assert dims["reward"] == pytest.approx(1.0)


@needs_example
def test_the_example_run_file_is_for_multi_step_grpo_on_the_local_backend():
    from reinforge import load_run

    run = load_run(EXAMPLE / "run.yaml")
    assert run.algorithm.algorithm_type == "multi_step_grpo" and run.backend == "local"
    assert run.workflow.ref == "react" and run.workflow.args["tools"] == ["calculator"]
    assert run.model.max_tokens <= 64


@needs_example
def test_the_example_data_is_what_the_committed_script_generates(tmp_path):
    subprocess.run(
        [sys.executable, str(EXAMPLE / "generate.py"), "--out", str(tmp_path)], check=True, capture_output=True
    )
    for name in ("train.jsonl", "test.jsonl"):
        assert (tmp_path / name).read_text() == (EXAMPLE / "data" / name).read_text(), name
    test = [json.loads(line) for line in (EXAMPLE / "data" / "test.jsonl").read_text().splitlines()]
    train_questions = {
        json.loads(line)["question"] for line in (EXAMPLE / "data" / "train.jsonl").read_text().splitlines()
    }
    hard = [r for r in test if r["needs_tool"]]
    assert len(hard) > 0.7 * len(test) and not any(r["question"] in train_questions for r in hard)
    for row in test:
        a_op_b = row["question"][len("What is ") : -1]
        assert str(eval(a_op_b)) == row["answer"]  # test-only check of the generator, on trusted data


@needs_example
def test_the_example_judges_read_the_episode(tmp_path):
    import asyncio

    sys.path.insert(0, str(EXAMPLE))
    try:
        import judges
    finally:
        sys.path.remove(str(EXAMPLE))
    from reinforge.testing import ScriptedChatModel
    from reinforge_rollouts_react import ReActAgent, calculator

    def episode(replies):
        return asyncio.run(ReActAgent(ScriptedChatModel(replies), tools=[calculator], max_turns=3).run("q"))

    used = episode(['Action: calculator\nAction Input: {"expression": "347 * 28"}', "Final Answer: 9716"])
    guessed = episode(["Final Answer: 9000"])
    sloppy = episode(["Action: calc[1]", "Final Answer: 9716"])
    hard, easy = {"needs_tool": True}, {"needs_tool": False}
    assert asyncio.run(judges.used_tool_when_needed(hard, used)).reward == 1.0
    assert asyncio.run(judges.used_tool_when_needed(hard, guessed)).reward == 0.0
    assert asyncio.run(judges.used_tool_when_needed(easy, guessed)).reward == 1.0
    assert asyncio.run(judges.used_tool_when_needed(hard, "9716")).reward == 0.0  # a plain string used no tool
    assert asyncio.run(judges.clean_protocol(hard, used)).reward == 1.0
    assert asyncio.run(judges.clean_protocol(hard, sloppy)).reward == 0.5
    sys.modules.pop("judges", None)


@needs_example
def test_the_example_reward_pays_for_tool_use_only_with_the_right_answer():
    """The run file's composed reward on hand-written episodes: the gate makes tool calls unfarmable."""
    import asyncio

    from reinforge.plugin import build_job, load_run
    from reinforge.testing import ScriptedChatModel
    from reinforge_rollouts_react import ReActAgent, calculator

    composer = build_job(load_run(EXAMPLE / "run.yaml"), need_backend=False).composer

    def reward(replies, task):
        episode = asyncio.run(ReActAgent(ScriptedChatModel(replies), tools=[calculator], max_turns=3).run("q"))
        return asyncio.run(composer.score(task, episode)).reward

    hard = {"question": "What is 347 * 28?", "answer": "9716", "needs_tool": True}
    easy = {"question": "What is 3 + 4?", "answer": "7", "needs_tool": False}
    call = 'Action: calculator\nAction Input: {"expression": "347 * 28"}'
    assert reward([call, "Final Answer: 9716"], hard) == pytest.approx(1.0)  # tool used correctly
    assert reward(["Final Answer: 9716"], hard) == pytest.approx(0.7)  # right, in its head: no tool credit
    assert reward([call, "Final Answer: 9000"], hard) == 0.0  # tool used, answer wrong: nothing to farm
    assert reward(["Final Answer: 9000"], hard) == 0.0  # not at all
    assert reward(["Action: calc[1]", "Actio Input 3", "<<garbage>>"], hard) == 0.0  # protocol garbage
    assert reward(["Action: calc[1]", call, "Final Answer: 9716"], hard) == pytest.approx(0.6 + 0.3 + 0.1 * 2 / 3)
    assert reward(["Final Answer: 7"], easy) == pytest.approx(1.0)  # no tool needed


@needs_example
def test_the_example_shows_the_model_a_worked_episode_as_chat_turns():
    from reinforge import load_run
    from reinforge_rollouts_react import check_settings

    settings = check_settings(load_run(EXAMPLE / "run.yaml").workflow.args)
    roles = [m["role"] for m in settings.few_shot]
    assert roles == ["user", "assistant", "user", "assistant"]
    action = settings.few_shot[1]["content"]
    from reinforge_rollouts_react.parsing import parse_action

    parsed = parse_action(action)  # the demonstration is an action the agent's own parser reads
    assert (parsed.kind, parsed.tool, parsed.tool_input) == ("tool", "calculator", {"expression": "254 * 37"})
