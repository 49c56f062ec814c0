"""Baselines for ungrouped rewards: per prompt cluster, running, std scaling, state round trip."""

from __future__ import annotations

import json

import pytest

from reinforge_backend_local.online.baselines import Baseline, cluster_key


def test_cluster_key_ignores_whitespace_but_not_roles_or_words():
    a = [{"role": "user", "content": "What is  2+2?\n"}]
    assert cluster_key(a) == cluster_key([{"role": "user", "content": "What is 2+2?"}])
    assert cluster_key(a) != cluster_key([{"role": "system", "content": "What is 2+2?"}])
    assert cluster_key(a) != cluster_key([{"role": "user", "content": "What is 2+3?"}])
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert cluster_key(parts) == cluster_key(json.loads(json.dumps(parts)))


def test_first_batch_uses_its_own_mean_then_the_running_average():
    b = Baseline("running", decay=0.5)
    assert b.advantages([("a", 1.0), ("b", 0.0)]) == [0.5, -0.5]
    b.update([("a", 1.0), ("b", 0.0)])
    assert b.mean == pytest.approx(0.5)  # 1.0, then halfway to 0.0
    assert b.advantages([("c", 1.0)]) == [pytest.approx(0.5)]


def test_same_batch_is_given_the_same_advantages_until_it_is_folded_in():
    b = Baseline("cluster")
    items = [("q1", 1.0), ("q1", 0.0), ("q2", 0.5)]
    assert b.advantages(items) == b.advantages(items)


def test_cluster_peers_in_the_batch_give_a_leave_one_out_baseline():
    b = Baseline("cluster")
    b.update([("other", 0.2)])  # some history, none for q1
    adv = b.advantages([("q1", 1.0), ("q1", 0.0), ("q1", 0.5), ("lone", 1.0)])
    assert adv[:3] == [pytest.approx(0.75), pytest.approx(-0.75), pytest.approx(0.0)]
    assert adv[3] == pytest.approx(0.8)  # no peers, no own history: the running mean (0.2)


def test_a_cluster_with_enough_history_is_its_own_baseline():
    b = Baseline("cluster", decay=0.0, min_count=2)  # decay 0: the last reward is the average
    b.update([("easy", 1.0), ("easy", 1.0), ("hard", 0.0), ("hard", 0.0)])
    adv = b.advantages([("easy", 1.0), ("hard", 1.0)])
    assert adv == [pytest.approx(0.0), pytest.approx(1.0)]  # the easy one was expected, the hard one is news
    b2 = Baseline("cluster", decay=0.0, min_count=3, state=b.state())  # now too little history
    assert b2.advantages([("easy", 1.0)]) == [pytest.approx(1.0)]  # the global average (0.0, decay 0)


def test_std_scaling_divides_by_the_reward_spread():
    b = Baseline("running", scale="std")
    adv = b.advantages([("a", 2.0), ("b", 0.0)])
    assert adv == [pytest.approx(1.0), pytest.approx(-1.0)]  # (+-1) / std 1
    flat = Baseline("running", scale="std").advantages([("a", 1.0), ("b", 1.0)])
    assert flat == [0.0, 0.0]  # never a division by zero


def test_state_round_trips_through_json_and_forgets_the_oldest_clusters():
    b = Baseline("cluster", max_clusters=2)
    b.update([("a", 1.0), ("b", 0.0), ("c", 0.5)])
    state = json.loads(json.dumps(b.state()))
    again = Baseline("cluster", max_clusters=2, state=state)
    assert set(again.clusters) == {"b", "c"} and again.count == 3 and again.mean == pytest.approx(b.mean)
    assert again.advantages([("c", 1.0)]) == b.advantages([("c", 1.0)])


@pytest.mark.parametrize(("kind", "scale"), [("grouped", "none"), ("cluster", "zscore")])
def test_bad_kind_or_scale_is_an_error_naming_it(kind, scale):
    with pytest.raises(ValueError, match="baseline"):
        Baseline(kind, scale=scale)
