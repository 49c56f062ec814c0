import statistics

import pytest

from reinforge import ChatResponse, ModelCall, Trajectory
from reinforge.plugin import AlgorithmConfig, BatchResult, ConfigError, GroupResult
from reinforge_backend_local.training.algorithms import ALGORITHMS, advantages, algorithm
from reinforge_backend_local.training.trainer import build_samples

REWARDS = [1.0, 0.0, 0.5, 0.5]  # mean 0.5, population std sqrt(0.125)


def test_grpo_advantages_by_hand():
    std = 0.125**0.5
    (got,) = advantages(ALGORITHMS["grpo"], [REWARDS], "group")
    assert got == pytest.approx([0.5 / std, -0.5 / std, 0.0, 0.0], rel=1e-5)
    (dr,) = advantages(ALGORITHMS["grpo"], [REWARDS], "none")  # Dr.GRPO: no std division
    assert dr == pytest.approx([0.5, -0.5, 0.0, 0.0])
    groups = [[1.0, 0.0], [3.0, 3.0]]  # batch std over all four rewards
    batch_std = statistics.pstdev([1.0, 0.0, 3.0, 3.0])
    got = advantages(ALGORITHMS["grpo"], groups, "batch")
    assert got[0] == pytest.approx([0.5 / batch_std, -0.5 / batch_std], rel=1e-5)
    assert got[1] == pytest.approx([0.0, 0.0])


def test_rloo_leaves_one_out():
    (got,) = advantages(ALGORITHMS["rloo"], [REWARDS], "group")
    assert got == pytest.approx([1.0 - 1.0 / 3, 0.0 - 2.0 / 3, 0.5 - 1.5 / 3, 0.5 - 1.5 / 3])


def test_reinforce_pp_normalizes_over_the_batch():
    groups = [[1.0, 0.0], [2.0, 4.0]]
    centered = [0.5, -0.5, -1.0, 1.0]
    mean, std = statistics.fmean(centered), statistics.pstdev(centered)
    got = advantages(ALGORITHMS["reinforce_pp"], groups, "group")
    assert [a for g in got for a in g] == pytest.approx([(c - mean) / std for c in centered], rel=1e-5)


def test_gspo_and_ppo_use_group_advantages_and_unknown_is_an_error():
    assert (
        advantages(ALGORITHMS["gspo"], [REWARDS])
        == advantages(ALGORITHMS["grpo"], [REWARDS])
        == advantages(ALGORITHMS["ppo"], [REWARDS])
    )
    with pytest.raises(ConfigError, match="reinforce_pp"):
        algorithm("a2c")
    assert algorithm("reinforce++") is ALGORITHMS["reinforce_pp"]


def _trajectory(reward, calls, task_index=0):
    t = Trajectory(task={}, task_index=task_index, reward=reward)
    for i in range(calls):
        response = ChatResponse(
            {"role": "assistant", "content": "x"},
            prompt_token_ids=[1, 2, i],
            completion_token_ids=[3, 4],
            logprobs=[-0.1, -0.2],
        )
        t.calls.append(ModelCall(messages=[], response=response))
    return t


def test_multi_step_grpo_gives_every_call_its_runs_advantage():
    group = GroupResult(task={}, task_index=0, group_id="g", kept=[_trajectory(1.0, 3), _trajectory(0.0, 2)])
    flat = GroupResult(task={}, task_index=1, group_id="h", kept=[_trajectory(1.0, 1), _trajectory(1.0, 1)])
    result = BatchResult([group, flat], counters=None, metrics={}, seconds=0.0)
    samples = build_samples(result, ALGORITHMS["multi_step_grpo"])
    assert samples.zero_variance_groups == 1  # the all-equal group is skipped and counted
    advs = [s.advantage for s in samples.items]
    assert advs[:3] == [pytest.approx(1.0, rel=1e-5)] * 3 and advs[3:] == [pytest.approx(-1.0, rel=1e-5)] * 2
    assert [s.weight for s in samples.items] == [pytest.approx(1 / 3)] * 3 + [0.5, 0.5]
    assert [s.prompt_ids[-1] for s in samples.items] == [0, 1, 2, 0, 1]


def test_micro_batches_are_capped_by_sequences_and_by_padded_tokens():
    from reinforge_backend_local.training.trainer import Sample, _micro_batches

    def sample(n):
        return Sample([1] * (n - 1), [2], [0.0], 1.0)

    short = [sample(50) for _ in range(10)]
    long = [sample(400) for _ in range(5)]
    batches = _micro_batches(long + short, 8, 1024)
    widths = [[len(s.prompt_ids) + len(s.completion_ids) for s in b] for b in batches]
    assert widths == [[50] * 8, [50] * 2, [400] * 2, [400] * 2, [400]]
    assert all(len(b) * max(w) <= 1024 for b, w in zip(batches, widths))
    # a sequence over the budget still goes (alone); no budget: sequences only
    assert [len(b) for b in _micro_batches([sample(2000), sample(3000)], 8, 1024)] == [1, 1]
    assert [len(b) for b in _micro_batches(long + short, 8, None)] == [8, 7]


def test_every_algorithm_keeps_the_old_defaults_of_its_loss_keys():
    from reinforge_backend_local.training.algorithms import GroupSettings, LossSettings

    assert set(ALGORITHMS) == {"grpo", "multi_step_grpo", "rloo", "reinforce_pp", "gspo", "ppo"}
    defaults = {
        "kl_coef": 0.0,
        "clip_range": 0.2,
        "clip_range_high": None,
        "loss_agg_mode": "token-mean",
        "ppo_epochs": 1,
        "max_grad_norm": 1.0,
    }
    for name, record in ALGORITHMS.items():
        cls = record.settings
        assert record.name == name
        got = vars(cls())
        assert {k: got[k] for k in defaults} == defaults, name
        assert issubclass(cls, LossSettings)
        assert (got.get("scale_rewards") == "group") == issubclass(cls, GroupSettings), name


def _checked(algo):
    """What core hands the backend: the canonical name and the algorithm's checked settings."""
    from reinforge_backend_local.backend import LocalBackend

    backend = LocalBackend()
    return backend.algorithm_name(algo, where="algorithm"), backend.check_algorithm(algo, where="algorithm")


def test_the_backend_checks_the_loss_keys_with_the_records_settings():
    from reinforge_backend_local.training.algorithms import GroupSettings, LossSettings

    name, settings = _checked(AlgorithmConfig(algorithm_type="reinforce++", kl_coef=0.05))
    assert name == "reinforce_pp" and type(settings) is LossSettings and settings.kl_coef == 0.05
    name, settings = _checked(AlgorithmConfig(algorithm_type="gspo", scale_rewards="none", clip_range_high=0.28))
    assert name == "gspo" and isinstance(settings, GroupSettings) and settings.scale == "none"
    assert type(settings) is ALGORITHMS[name].settings
    with pytest.raises(ConfigError, match=r"algorithm\.ppo_epochs: expected an integer, got str '2'"):
        _checked(AlgorithmConfig(ppo_epochs="2"))
    with pytest.raises(ConfigError, match=r"algorithm\.scale_rewards: must be one of group, batch, none; got 'std'"):
        _checked(AlgorithmConfig(scale_rewards="std"))
    with pytest.raises(ConfigError, match=r"algorithm\.clip_range: must be greater than 0"):
        _checked(AlgorithmConfig(clip_range=0))
    # rloo and reinforce_pp have no reward scaling: the key is an error there, not silently ignored
    with pytest.raises(ConfigError, match=r"unknown key 'algorithm\.scale_rewards'.*algorithm 'rloo'"):
        _checked(AlgorithmConfig(algorithm_type="rloo", scale_rewards="batch"))
    with pytest.raises(ConfigError, match=r"unknown key 'algorithm\.kl_coeff' \(did you mean 'kl_coef'\?\)"):
        _checked(AlgorithmConfig(kl_coeff=0.1))


def test_the_records_flags_are_what_the_trainer_reads():
    """One record per name: the flags that used to be name checks in the trainer."""
    flags = {
        name: (r.group_relative, r.sequence_ratio, r.per_call_weight, r.call_rewards) for name, r in ALGORITHMS.items()
    }
    assert flags == {
        "grpo": (True, False, False, False),
        "multi_step_grpo": (True, False, True, True),
        "rloo": (True, False, False, False),
        "reinforce_pp": (False, False, False, False),
        "gspo": (True, True, False, False),
        "ppo": (True, False, False, False),
    }
    from reinforge_backend_local.backend import LocalBackend

    assert {n: r.settings for n, r in ALGORITHMS.items()} == dict(LocalBackend.algorithms)


def test_build_samples_reads_the_scaling_from_the_typed_settings():
    from reinforge_backend_local.training.algorithms import GroupSettings

    group = GroupResult(task={}, task_index=0, group_id="g", kept=[_trajectory(1.0, 1), _trajectory(0.0, 1)])
    result = BatchResult([group], counters=None, metrics={}, seconds=0.0)
    scaled = build_samples(result, ALGORITHMS["grpo"])
    unscaled = build_samples(result, ALGORITHMS["grpo"], GroupSettings(scale_rewards="none"))
    assert [s.advantage for s in scaled.items] == [pytest.approx(1.0, rel=1e-5), pytest.approx(-1.0, rel=1e-5)]
    assert [s.advantage for s in unscaled.items] == [pytest.approx(0.5), pytest.approx(-0.5)]


def test_a_call_reward_reaches_exactly_that_calls_advantage():
    from reinforge_backend_local.training.algorithms import MultiStepSettings

    def rewarded(reward, call_rewards, task_index=0):
        t = _trajectory(reward, len(call_rewards), task_index)
        for call, r in zip(t.calls, call_rewards):
            call.reward = r
        return t

    g = GroupResult(task={}, task_index=0, group_id="g", kept=[rewarded(1.0, [0.5, None]), rewarded(0.0, [0.1, None])])
    # equal trajectory rewards, different call rewards: trains on the calls' rewards alone
    h = GroupResult(task={}, task_index=1, group_id="h", kept=[rewarded(1.0, [1.0]), rewarded(1.0, [0.0])])
    # nothing differs: skipped
    k = GroupResult(task={}, task_index=2, group_id="k", kept=[rewarded(1.0, [0.3]), rewarded(1.0, [0.3])])
    result = BatchResult([g, h, k], counters=None, metrics={}, seconds=0.0)
    algo = ALGORITHMS["multi_step_grpo"]
    settings = MultiStepSettings(scale_rewards="none", call_reward_weight=2.0)
    samples = build_samples(result, algo, settings)
    # by hand: trajectory advantages +-0.5 in g, 0 in h; the rewarded calls of g are 0.5 and 0.1 (mean 0.3),
    # so +-0.2, times the weight 2.0 = +-0.4 on those two calls only; in h, 1.0 and 0.0 (mean 0.5): +-1.0
    assert [s.advantage for s in samples.items] == [
        pytest.approx(0.9),
        pytest.approx(0.5),
        pytest.approx(-0.9),
        pytest.approx(-0.5),
        pytest.approx(1.0),
        pytest.approx(-1.0),
    ]
    assert samples.zero_variance_groups == 1
    ignored = build_samples(result, algo, MultiStepSettings(scale_rewards="none", call_reward_weight=0.0))
    assert [s.advantage for s in ignored.items] == [pytest.approx(a) for a in (0.5, 0.5, -0.5, -0.5)]
    assert ignored.zero_variance_groups == 2
    grpo = build_samples(result, ALGORITHMS["grpo"])  # other algorithms do not read call rewards
    assert [s.advantage for s in grpo.items] == [pytest.approx(a, rel=1e-5) for a in (1.0, 1.0, -1.0, -1.0)]
    assert grpo.zero_variance_groups == 2


def test_call_reward_weight_is_checked():
    with pytest.raises(ConfigError, match="call_reward_weight"):
        _checked(AlgorithmConfig(algorithm_type="multi_step_grpo", call_reward_weight=-1.0))
