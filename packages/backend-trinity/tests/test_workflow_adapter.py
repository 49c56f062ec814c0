"""The Trinity ``Workflow`` adapter through Trinity's real ``WorkflowRunner`` against a real ``reinforge serve``.

What is real: trinity-rft 0.6.0's config loading and validation (of the config our mapping writes), its taskset
reader (which imports :class:`~reinforge_backend_trinity.workflow.ReinforgeWorkflow` from the dotted
``default_workflow_type``), ``WorkflowRunner.run_task`` with its ``ModelWrapper`` and recording OpenAI client,
``Experience`` (de)serialization, and backend-local's ``reinforge serve`` with SmolLM2-135M-Instruct returning
vLLM-style token ids and logprobs. What is not: vLLM (missing names stood in, see conftest's
``vllm_stand_in``), and the named Ray actor Trinity 0.6.0's external engine forgets to create
(conftest's ``start_external_model_actor``).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from conftest import config_of, start_external_model_actor, trinity_resolve, write_run

pytest.importorskip("trinity")
pytest.importorskip("reinforge_backend_local")

import adapter_components

HERE = Path(__file__).resolve().parent
QUESTIONS = [{"question": "What is 2 + 3?", "answer": "5"}, {"question": "What is 10 + 7?", "answer": "17"}]
GROUP_WEIGHT = JUDGE_WEIGHT = 0.5  # they sum to 1, so core's composer does not normalize them


@pytest.fixture(scope="module")
def tokenizer(smollm2: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2))


def run_file(folder: Path, smollm2: Path, name: str, **keys: Any) -> Path:
    """A run of the test components on SmolLM2, for Trinity's explore mode with the external engine."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "adapter_components.py", folder / "adapter_components.py")
    (folder / "data").mkdir(exist_ok=True)
    (folder / "data" / "train.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    data: dict[str, Any] = {
        "project_name": "adapter",
        "experiment_name": name,
        "workflow": "adapter_components:one_turn",
        "judges": [{"name": "adapter_components:length_judge", "metric": "length"}],
        "train_dataset": {"path": "data", "split": "train"},
        "model": {
            "model_path": str(smollm2),
            "max_tokens": 10,
            "temperature": 1.0,
            "max_model_len": 1024,
            "full_finetune": True,
        },
        "algorithm": {"algorithm_type": "grpo", "group_size": 4, "batch_size": 1},
        "runner": {"max_retries": 0},
        "backend_args": {
            "mode": "explore",
            "engine_type": "external",
            "node_num": 1,
            "gpu_per_node": 1,
            "runner_per_model": 1,
            "output_dir": str(folder / "runs"),
        },
    }
    data.update(keys)
    return write_run(folder, data)


def explore_one_task(
    path: Path, ray: Any, url: str, *, repeat_times: int = 4, run_id_base: int = 0
) -> tuple[Any, list[Any], Any]:
    """Our mapping's config, validated by Trinity, its first task read by Trinity and run by its WorkflowRunner."""
    from trinity.buffer import get_buffer_reader
    from trinity.common.experience import Experience
    from trinity.explorer.workflow_runner import WorkflowRunner

    config = trinity_resolve(config_of(path), path.parent)
    assert config.explorer.rollout_model.enable_history and config.explorer.rollout_model.engine_type == "external"
    actor = start_external_model_actor(ray, config, url)

    async def go() -> tuple[Any, bytes, Any]:
        reader = get_buffer_reader(config.buffer.explorer_input.tasksets[0])
        task = (await reader.read(batch_size=1))[0]
        task.batch_id, task.task_id = "7", 0  # what the explorer sets before it hands a task to a runner
        runner = WorkflowRunner(config, rollout_model_id=0, runner_id=0)
        await runner.prepare()
        status, payload = await runner.run_task(task, batch_id="7", repeat_times=repeat_times, run_id_base=run_id_base)
        return status, payload, task

    try:
        status, payload, task = asyncio.run(go())
    finally:
        ray.kill(actor)
    return status, (Experience.deserialize_many(payload) if payload else []), task


def check_tokens(exp: Any, messages: list[dict[str, Any]], tokenizer: Any) -> str:
    """The experience's tokens are the chat template of ``messages`` + the reply; returns the reply's text."""
    tokens = exp.tokens.tolist()
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tokens[: exp.prompt_length] == tokenizer(prompt, add_special_tokens=False).input_ids
    completion = tokens[exp.prompt_length :]
    assert 0 < len(completion) <= 10
    text = tokenizer.decode(completion, skip_special_tokens=True)
    assert text == exp.response_text
    assert len(exp.logprobs) == len(completion) and all(lp <= 0 for lp in exp.logprobs.tolist())
    return text


def check_two_turns(first: Any, second: Any, tokenizer: Any) -> str:
    """Both experiences of a two_turns run checked against their prompts; the final reply's text."""
    messages = [
        {"role": "system", "content": adapter_components.SYSTEM},
        {"role": "user", "content": QUESTIONS[0]["question"]},
    ]
    reply = check_tokens(first, messages, tokenizer)
    messages += [
        {"role": "assistant", "content": reply},
        {"role": "user", "content": adapter_components.FOLLOW_UP},
    ]
    return check_tokens(second, messages, tokenizer)  # the second call's prompt holds the first reply


def by_run(exps: list[Any]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = defaultdict(list)
    for exp in sorted(exps, key=lambda e: (e.eid.run, e.eid.step)):
        out[exp.eid.run].append(exp)
    return dict(out)


def task_counts(exps: list[Any]) -> dict[str, float]:
    """The task-level counts, summed as Trinity's ``:sum`` aggregation does."""
    out: dict[str, float] = defaultdict(float)
    for exp in exps:
        for key, value in exp.metrics.items():
            if key.startswith("reinforge/") and key.endswith(":sum"):
                out[key.removeprefix("reinforge/").removesuffix(":sum")] += value
    return dict(out)


def test_judges_and_group_reward_across_the_repeats(
    tmp_path: Path, smollm2: Path, served_url: str, ray_local: Any, vllm_stand_in: None, tokenizer: Any
) -> None:
    group = {"ref": "adapter_components:longest_wins", "weight": GROUP_WEIGHT}
    judges = [{"name": "adapter_components:length_judge", "metric": "length", "weight": JUDGE_WEIGHT}]
    path = run_file(tmp_path / "run", smollm2, "one-turn", judges=judges, group_reward=group)
    status, exps, task = explore_one_task(path, ray_local, served_url)

    assert status.ok and status.completed_runs == 4, status.message
    assert task.workflow.__name__ == "ReinforgeWorkflow"  # Trinity imported it from the written dotted path
    runs = by_run(exps)
    assert sorted(runs) == [0, 1, 2, 3] and all(len(r) == 1 for r in runs.values())
    messages = [
        {"role": "system", "content": adapter_components.SYSTEM},
        {"role": "user", "content": QUESTIONS[0]["question"]},
    ]
    texts = {run: check_tokens(r[0], messages, tokenizer) for run, r in runs.items()}
    longest = max(len(t.strip()) for t in texts.values())
    for run, (exp,) in runs.items():
        judged = adapter_components.length_score(texts[run])
        ranked = 1.0 if len(texts[run].strip()) == longest else 0.0
        assert exp.eid.step == 0 and exp.eid.batch == "7" and exp.eid.task == 0
        assert exp.metrics["reward/length"] == pytest.approx(judged)
        assert exp.metrics["reward/group"] == ranked
        assert exp.reward == pytest.approx(JUDGE_WEIGHT * judged + GROUP_WEIGHT * ranked)
        assert exp.metrics["workflow/calls"] == 1.0 and exp.metrics["reinforge/turns"] == 1.0
        assert exp.info["reinforge_rewards"]["reward/length"] == pytest.approx(judged)
        assert exp.info["model_version"] == 0  # from the model actor, set by Trinity's runner
    assert any(exp.metrics["reward/group"] == 1.0 for (exp,) in runs.values())
    counts = task_counts(exps)
    assert counts["rollouts"] == 4 and counts["kept"] == 4 and counts["discarded"] == 0
    assert "failed" not in counts


def test_two_model_calls_give_two_experiences_per_run(
    tmp_path: Path, smollm2: Path, served_url: str, ray_local: Any, vllm_stand_in: None, tokenizer: Any
) -> None:
    path = run_file(tmp_path / "run", smollm2, "two-turns", workflow="adapter_components:two_turns")
    # the runs after the first 6 of the task (Trinity's explorer.max_repeat_times_per_runner splits a group so)
    status, exps, _ = explore_one_task(path, ray_local, served_url, repeat_times=2, run_id_base=6)

    assert status.ok, status.message
    runs = by_run(exps)
    assert sorted(runs) == [6, 7]
    for first, second in runs.values():
        assert (first.eid.step, second.eid.step) == (0, 1)
        final = check_two_turns(first, second, tokenizer)
        # the run's reward (the judge scores the final reply) on every turn
        assert first.reward == second.reward == pytest.approx(adapter_components.length_score(final))
        assert first.metrics["reinforge/turns"] == second.metrics["reinforge/turns"] == 2.0
        assert first.info["group_id"] == second.info["group_id"]
    assert task_counts(exps)["kept"] == 2


def test_a_call_the_workflow_rewarded_keeps_its_own_reward(
    tmp_path: Path, smollm2: Path, served_url: str, ray_local: Any, vllm_stand_in: None, tokenizer: Any
) -> None:
    path = run_file(tmp_path / "run", smollm2, "call-rewards", workflow="adapter_components:two_turns_first_rewarded")
    status, exps, _ = explore_one_task(path, ray_local, served_url, repeat_times=2)

    assert status.ok, status.message
    runs = by_run(exps)
    assert len(runs) == 2
    for first, second in runs.values():
        run_reward = adapter_components.length_score(check_two_turns(first, second, tokenizer))
        assert first.reward == 0.25  # WorkflowOutput.call_rewards[0], not the judges' score of the run
        assert second.reward == pytest.approx(run_reward)  # no call reward: the run's
        assert first.info["trajectory_reward"] == second.info["trajectory_reward"] == pytest.approx(run_reward)


def test_a_failed_judge_drops_its_run_and_counts_it(
    tmp_path: Path, smollm2: Path, served_url: str, ray_local: Any, vllm_stand_in: None, tokenizer: Any
) -> None:
    judges = [{"name": "adapter_components:FailsFirstCall", "metric": "length"}]
    path = run_file(tmp_path / "run", smollm2, "flaky-judge", judges=judges)
    status, exps, _ = explore_one_task(path, ray_local, served_url)

    assert status.ok, status.message
    runs = by_run(exps)
    assert len(runs) == 3  # one of the four was dropped, not scored 0
    messages = [
        {"role": "system", "content": adapter_components.SYSTEM},
        {"role": "user", "content": QUESTIONS[0]["question"]},
    ]
    for (exp,) in runs.values():
        assert exp.reward == pytest.approx(adapter_components.length_score(check_tokens(exp, messages, tokenizer)))
    counts = task_counts(exps)
    assert counts["rollouts"] == 4 and counts["kept"] == 3 and counts["discarded"] == 1
    assert counts["failed"] == 1 and counts["failed/judge"] == 1


def test_every_rollout_failing_fails_the_task_with_the_judges_error(
    tmp_path: Path, smollm2: Path, served_url: str, ray_local: Any, vllm_stand_in: None
) -> None:
    judges = [{"name": "adapter_components:always_fails", "metric": "length"}]
    path = run_file(tmp_path / "run", smollm2, "judge-down", judges=judges)
    status, exps, _ = explore_one_task(path, ray_local, served_url, repeat_times=2)

    assert not status.ok and status.completed_runs == 0 and exps == []
    assert "the judge's service is down" in (status.message or "")


def test_a_taskset_without_reinforge_workflow_args_is_a_clear_error(vllm_stand_in: None) -> None:
    from trinity.common.workflows.workflow import Task

    from reinforge.plugin import ConfigError
    from reinforge_backend_trinity.workflow import ReinforgeWorkflow

    class Recording:
        enable_history = True

    task = Task(workflow=ReinforgeWorkflow, workflow_args={"other": 1}, raw_task={"question": "?"})
    with pytest.raises(ConfigError, match=r"workflow_args has no 'reinforge' mapping \(keys: \['other'\]\)"):
        ReinforgeWorkflow(task=task, model=Recording())


REACT_AGENTSCOPE = HERE.parents[2] / "examples" / "react-agentscope"
PRODUCT = {"question": "What is 616 * 28?", "answer": "17248", "kind": "product", "needs_tool": True}


def test_an_agentscope_react_agent_gives_one_experience_per_model_call(
    tmp_path: Path, smollm2: Path, served_url: str, ray_local: Any, vllm_stand_in: None, tokenizer: Any
) -> None:
    """examples/react-agentscope's workflow (``model: ChatModelBase``, a ReActAgent with a calculator Toolkit)."""
    pytest.importorskip("agentscope", reason="needs reinforge[agentscope] (the package's testing extra has it)")
    folder = tmp_path / "run"
    run = yaml_of_example()
    path = run_file(
        folder,
        smollm2,
        "react-agentscope",
        workflow=run["workflow"],
        judges=run["judges"],
        model={"model_path": str(smollm2), "max_tokens": 48, "temperature": 0.0, "max_model_len": 2048},
    )
    for name in ("workflow.py", "judges.py"):
        shutil.copy(REACT_AGENTSCOPE / name, folder / name)
    (folder / "data" / "train.jsonl").write_text(json.dumps(PRODUCT) + "\n")
    status, exps, _ = explore_one_task(path, ray_local, served_url, repeat_times=2)

    assert status.ok, status.message
    runs = by_run(exps)
    assert sorted(runs) == [0, 1]
    for turns in runs.values():
        # one experience per call the agent made, in order, each a turn of the same rollout
        assert [e.eid.step for e in turns] == list(range(len(turns)))
        assert all(e.metrics["reinforge/turns"] == len(turns) == e.metrics["workflow/model_calls"] for e in turns)
        called = turns[0].metrics["workflow/tool_calls"] > 0
        assert len(turns) == (2 if called else 1)  # max_iters 2: call the tool, then answer
        prompts = []
        for exp in turns:
            tokens = exp.tokens.tolist()
            prompt = tokenizer.decode(tokens[: exp.prompt_length])
            prompts.append(prompt)
            # the agent's system prompt with its tool, the demonstrations in its memory, the question
            assert "- calculator(expression: string)" in prompt and "What is 347 * 28?" in prompt
            assert PRODUCT["question"] in prompt
            assert tokenizer.decode(tokens[exp.prompt_length :], skip_special_tokens=True) == exp.response_text
            assert len(exp.logprobs) == len(tokens) - exp.prompt_length > 0
            assert exp.reward == turns[-1].reward  # the rollout's reward on every turn (no call rewards here)
            assert "reward/correct" in exp.metrics and "reward/tool_use" in exp.metrics
        if called:  # the second turn saw the tool's result
            assert "Observation:" in prompts[1] and prompts[1].startswith(prompts[0].rsplit("<|im_start|>", 1)[0])
    # greedy, so both rollouts made the same calls; SmolLM2 with two demonstrations calls the calculator here
    assert all(len(turns) == 2 for turns in runs.values()), {r: len(t) for r, t in runs.items()}
    assert task_counts(exps)["kept"] == 2


def yaml_of_example() -> dict[str, Any]:
    import yaml

    return yaml.safe_load((REACT_AGENTSCOPE / "run.yaml").read_text())
