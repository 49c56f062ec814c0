"""Dynamic sampling (``dynamic_sampling``, ``max_sampling_rounds``): refills a batch with groups that carry signal.

The rollouts are real (core's runner, a workflow and a judge); the model is scripted: a "flat"
prompt is answered right every time (a group of equal rewards), a "mixed" one right and wrong by turns.
"""

import itertools
from collections import defaultdict

import pytest

from reinforge import JudgeOutput, RunnerConfig, WorkflowOutput
from reinforge.plugin import AlgorithmConfig, ComponentSpec, ConfigError, RunConfig
from reinforge.testing import ScriptedChatModel, runner_for
from reinforge_backend_local.training.algorithms import ALGORITHMS, GroupSettings
from reinforge_backend_local.training.dynamic_sampling import refill
from reinforge_backend_local.training.trainer import build_samples, has_signal

GROUP = 2


async def answer(task, model):
    reply = await model.chat([{"role": "user", "content": task["question"]}])
    return WorkflowOutput(response=reply.content)


def exact(task, response):
    return JudgeOutput(reward=float(response == "right"))


def _model():
    seen: dict[str, itertools.count] = defaultdict(itertools.count)

    def reply(messages, tools, sampling):
        question = messages[-1]["content"]
        if question.startswith("flat"):
            return "right"
        return "right" if next(seen[question]) % 2 == 0 else "wrong"

    return ScriptedChatModel(reply)


def _tasks(kinds, prefix="a"):
    return [{"question": f"{kind}-{prefix}{i}"} for i, kind in enumerate(kinds)]


def _run(reinforge_pm, first_kinds, stream_kinds, *, batch_size=4, max_rounds=3):
    run = RunConfig(
        workflow=ComponentSpec(ref=answer),
        judges=[ComponentSpec(ref=exact, name="exact")],
        algorithm=AlgorithmConfig(group_size=GROUP, batch_size=batch_size),
        runner=RunnerConfig(max_concurrency=1),
    )
    stream = iter(_tasks(stream_kinds, prefix="b"))
    asked: list[tuple[int, int]] = []
    with runner_for(run, _model(), plugin_manager=reinforge_pm) as runner:
        sampled = batch_size

        def more(prompts, round_):
            nonlocal sampled
            asked.append((prompts, round_))
            tasks = list(itertools.islice(stream, prompts))
            result = runner.run(tasks, start_index=sampled)
            sampled += len(tasks)
            return result

        first = runner.run(_tasks(first_kinds))
        algo, settings = ALGORITHMS["grpo"], GroupSettings(dynamic_sampling=True, max_sampling_rounds=max_rounds)
        merged, metrics = refill(
            first,
            more,
            batch_size=batch_size,
            max_rounds=max_rounds,
            signal=lambda g: has_signal(g, algo, settings),
            summarize=runner.summarize,
        )
    return merged, metrics, asked, build_samples(merged, algo, settings)


def test_it_refills_to_a_full_batch_of_groups_with_signal(reinforge_pm):
    merged, metrics, asked, samples = _run(
        reinforge_pm, ["flat", "mixed", "flat", "mixed"], ["flat", "mixed", "mixed", "mixed"]
    )
    # round 1 had 2 of 4; round 2 asks for the 2 missing, gets 1 (flat, mixed); round 3 asks for 1 and fills it
    assert asked == [(2, 1), (1, 2)]
    assert metrics == {
        "dynamic_sampling/rounds": 3.0,
        "dynamic_sampling/prompts": 7.0,
        "dynamic_sampling/groups_with_signal": 4.0,
    }
    assert samples.groups == 7 and samples.zero_variance_groups == 3
    assert len(samples.items) == 4 * GROUP  # a full batch of groups that train
    assert len({g.task_index for g in merged.groups}) == 7  # every prompt its own index
    assert merged.metrics["count/kept"] == 7 * GROUP and merged.metrics["count/rollouts"] == 7 * GROUP


def test_it_stops_at_its_bound_when_no_group_carries_signal(reinforge_pm):
    merged, metrics, asked, samples = _run(reinforge_pm, ["flat"] * 4, ["flat"] * 20, max_rounds=3)
    assert asked == [(4, 1), (4, 2)]  # three rounds in all, the first included
    assert metrics["dynamic_sampling/rounds"] == 3.0 and metrics["dynamic_sampling/groups_with_signal"] == 0.0
    assert samples.items == [] and samples.zero_variance_groups == 12


def test_a_full_first_round_samples_nothing_more(reinforge_pm):
    merged, metrics, asked, samples = _run(reinforge_pm, ["mixed"] * 4, ["mixed"] * 4)
    assert asked == [] and metrics["dynamic_sampling/rounds"] == 1.0 and len(merged.groups) == 4


def test_one_round_is_no_refill(reinforge_pm):
    merged, metrics, asked, samples = _run(reinforge_pm, ["flat", "mixed", "flat", "mixed"], ["mixed"], max_rounds=1)
    assert asked == [] and len(samples.items) == 2 * GROUP


def test_the_keys_are_checked_and_belong_to_group_relative_algorithms():
    from reinforge_backend_local.backend import LocalBackend

    def checked(**keys):
        return LocalBackend().check_algorithm(AlgorithmConfig(**keys), where="algorithm")

    for name in ("grpo", "multi_step_grpo", "rloo", "gspo", "ppo"):
        got = checked(algorithm_type=name, dynamic_sampling=True, max_sampling_rounds=5)
        assert (got.dynamic_sampling, got.max_sampling_rounds) == (True, 5)
        assert ALGORITHMS[name].group_relative
    with pytest.raises(ConfigError, match=r"algorithm\.max_sampling_rounds: must be at least 1"):
        checked(dynamic_sampling=True, max_sampling_rounds=0)
    with pytest.raises(ConfigError, match=r"algorithm\.dynamic_sampling: expected true or false"):
        checked(dynamic_sampling="yes")
    # reinforce_pp trains on equal-reward groups against the batch: nothing to refill, so the key is unknown there
    with pytest.raises(ConfigError, match=r"unknown key 'algorithm\.dynamic_sampling'.*algorithm 'reinforce_pp'"):
        checked(algorithm_type="reinforce_pp", dynamic_sampling=True)


class _ScriptedPolicy:
    """What ``TrainingSession`` asks of its policy for rollouts, over the scripted model; records the seed keys."""

    model, peft = None, False

    def __init__(self) -> None:
        self.chat = _model()
        self.seed_keys: list[tuple] = []

    def provider(self, seed_key, version, sampling):
        self.seed_keys.append(seed_key)
        return lambda t: self.chat


def test_the_session_refills_from_the_next_rows_with_a_seed_of_its_own_per_round(reinforge_pm, tmp_path):
    """The session's wiring: further rounds read on in the shuffled data; the first round's seed is as before."""
    import json

    import reinforge_backend_local.plugin as local_plugin
    from reinforge.plugin import DatasetConfig, build_job
    from reinforge_backend_local.training.session import TrainingSession

    reinforge_pm.register(local_plugin, name="reinforge-backend-local")
    rows = [{"question": f"{'flat' if i % 2 else 'mixed'}-{i}"} for i in range(10)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = RunConfig(
        workflow=ComponentSpec(ref=answer),
        judges=[ComponentSpec(ref=exact, name="exact")],
        algorithm=AlgorithmConfig(group_size=GROUP, batch_size=4, dynamic_sampling=True, max_sampling_rounds=4),
        train_dataset=DatasetConfig(path=str(data)),
    )
    job = build_job(run, reinforge_pm, need_backend=True)
    try:
        session = TrainingSession(job)
        session.rows, session.policy = rows, _ScriptedPolicy()
        tasks = session._next_batch()
        provider = session.policy.provider((run.algorithm.seed, 1), 0, {})
        runner = job.make_runner(model_provider=provider)
        first = session._rollouts(runner, tasks)
        merged, metrics = session._refill(first, runner, 1)
    finally:
        job.close()
    useful = [g for g in merged.groups if has_signal(g, ALGORITHMS["grpo"], session.loss)]
    assert len(useful) == 4 and metrics["dynamic_sampling/groups_with_signal"] == 4.0
    # half the rows are "mixed": every prompt sampled is a new row, in the session's shuffled order
    questions = [g.task["question"] for g in merged.groups]
    order = session._order(0, len(rows))
    assert questions == [rows[i]["question"] for i in order[: len(questions)]]
    assert session.state.offset == len(questions) and len(questions) == metrics["dynamic_sampling/prompts"]
    rounds = int(metrics["dynamic_sampling/rounds"])
    assert rounds > 1 and session.policy.seed_keys == [(42, 1)] + [(42, 1, r) for r in range(1, rounds)]
