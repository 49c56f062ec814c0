"""The Python API: OnlineTrainer (the seed's TrainingRunner) and its in-process chat model."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from online_testlib import POLICY_PROMPT_IDS, POLICY_TOKENS, UPSTREAM_KEY

from reinforge import ChatModel, JudgeOutput
from reinforge.plugin import ConfigError
from reinforge_online import ApiError, ExplicitMarking, OnlineTrainer, SamplingRate
from reinforge_online.sink import JsonlCommitter

MESSAGES = [{"role": "user", "content": "2+2?"}]


class Scripted:
    """A scripted OpenAI-compatible model: a callable taking the request body; it keeps every body."""

    def __init__(self, text: str, *, token_ids: bool = False, fail: bool = False) -> None:
        self.text, self.token_ids, self.fail = text, token_ids, fail
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        self.bodies.append(body)
        if self.fail:
            raise ConnectionError("the policy is down")
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": self.text}}
        choice["finish_reason"] = "stop"
        out: dict[str, Any] = {"id": "x", "object": "chat.completion", "model": "m", "choices": [choice]}
        if self.token_ids and body.get("return_token_ids"):
            choice["token_ids"] = [7, 8]
            out["prompt_token_ids"] = [1, 2, 3]
        return out


def right_answer(task: dict, response: Any) -> JudgeOutput:
    """1 when the reply is the task's answer (a user's reward function, as in the seed)."""
    return JudgeOutput(reward=float(response.content.strip() == task["answer"]))


def trainer(tmp_path: Path, **kw: Any) -> OnlineTrainer:
    kw.setdefault("selection", SamplingRate(1.0))
    if kw.get("committer", "sink") == "sink":
        kw.setdefault("committer_args", {"path": str(tmp_path / "batches")})
    return OnlineTrainer(store=tmp_path / "traces.sqlite", **kw)


def test_sampled_calls_are_recorded_rewarded_and_committed_in_process(tmp_path):
    upstream, policy = Scripted("5"), Scripted("4", token_ids=True)
    t = trainer(tmp_path, committer="sink", reward=right_answer, commit_interval_s=3600, min_traces=2).start()
    try:
        model = t.chat_model(upstream=upstream, policy=policy, model="gpt-up", policy_model="pol")
        assert isinstance(model, ChatModel)  # what a reinforge workflow takes

        async def agent() -> list[Any]:
            return [await model.chat(MESSAGES, session_id=f"s{i}", task={"answer": "4"}) for i in range(2)]

        replies = asyncio.run(agent())
        assert [r.content for r in replies] == ["4", "4"] and upstream.bodies == []
        assert all(r.sampled and r.trace_id and r.completion_token_ids == [7, 8] for r in replies)
        assert policy.bodies[0]["model"] == "pol" and policy.bodies[0]["return_token_ids"] is True
        assert t.pipeline.outbox is not None and t.pipeline.outbox.wait_committed(1, timeout=10)
        (batch,) = (tmp_path / "batches").glob("batch-*.jsonl")
        rows = [json.loads(line) for line in batch.read_text().splitlines()]
        assert {r["trace_id"] for r in rows} == {r.trace_id for r in replies}
        assert all(row["reward"] == 1.0 and row["calls"][0]["token_ids"] == [7, 8] for row in rows)
        assert all(row["calls"][0]["prompt_token_ids"] == [1, 2, 3] and row["mode"] == "route" for row in rows)
    finally:
        assert t.stop() is True


def test_unsampled_calls_go_to_the_upstream_untouched_and_are_not_recorded(tmp_path):
    upstream, policy = Scripted("5"), Scripted("4")
    with trainer(tmp_path, committer="none", selection=SamplingRate(0.0)) as t:
        model = t.chat_model(upstream=upstream, policy=policy, model="gpt-up")
        reply = asyncio.run(model.chat(MESSAGES, temperature=0.2))
        assert reply.content == "5" and not reply.sampled and reply.trace_id is None
        assert upstream.bodies == [{"messages": MESSAGES, "temperature": 0.2, "model": "gpt-up"}]
        assert policy.bodies == [] and t.store.count("calls") == 0
        with pytest.raises(ValueError, match="without stream=True"):
            asyncio.run(model.chat(MESSAGES, stream=True))


def test_explicit_marking_sees_the_headers_given(tmp_path):
    upstream, policy = Scripted("5"), Scripted("4")
    with trainer(tmp_path, committer="none", selection=ExplicitMarking()) as t:
        model = t.chat_model(upstream=upstream, policy=policy)
        marked = asyncio.run(model.chat(MESSAGES, headers={"X-Reinforge-Sample": "1"}))
        plain = asyncio.run(model.chat(MESSAGES))
        assert marked.sampled and not plain.sampled


def test_a_policy_that_fails_falls_back_to_the_upstream_and_trips_the_breaker(tmp_path):
    upstream, policy = Scripted("5"), Scripted("4", fail=True)
    with trainer(tmp_path, committer="none") as t:
        model = t.chat_model(upstream=upstream, policy=policy)
        reply = asyncio.run(model.chat(MESSAGES))
        assert reply.content == "5" and not reply.sampled
        assert t.metrics.fallbacks.labels("unreachable")._value.get() == 1
        assert t.store.count("calls") == 0


def test_an_episode_is_one_trace_judged_once_when_closed(tmp_path):
    upstream, policy = Scripted("5"), Scripted("4")
    with trainer(tmp_path, committer="none", reward=right_answer, close_after_s=3600) as t:
        model = t.chat_model(upstream=upstream, policy=policy)

        async def agent() -> str:
            first = await model.chat(MESSAGES, task={"answer": "4"})
            assert first.trace_id is not None
            await model.chat([*MESSAGES, first.message, {"role": "user", "content": "sure?"}], trace_id=first.trace_id)
            await model.wait_recorded()
            return first.trace_id

        trace_id = asyncio.run(agent())
        assert t.pipeline.rewards is not None and t.pipeline.rewards.results == {}  # open until closed
        t.close_trace(trace_id)
        assert t.pipeline.rewards.wait_results(1, timeout=10)
        t.store.submit(lambda db: None).result(10)
        trace = t.store.trace(trace_id)
        assert len(trace["calls"]) == 2 and trace["reward"] == 1.0 and trace["task"] == {"answer": "4"}


def test_feedback_in_process_follows_the_gateways_rules(tmp_path):
    upstream, policy = Scripted("5"), Scripted("4")
    with trainer(tmp_path, committer="none", reward_range=(0.0, 1.0)) as t:
        model = t.chat_model(upstream=upstream, policy=policy)
        reply = asyncio.run(model.chat(MESSAGES))
        assert reply.trace_id is not None
        with pytest.raises(ApiError, match=r"outside the declared range \[0, 1\]"):
            t.feedback(reply.trace_id, 7.0, idempotency_key="k")
        first = t.feedback(reply.trace_id, 1.0, idempotency_key="k")
        assert first.status == 200 and first.body["reward"] == 1.0
        assert t.feedback(reply.trace_id, 0.5).status == 409  # first-wins
        assert t.feedback(reply.trace_id, 1.0, idempotency_key="k").body == first.body
        assert t.feedback(reply.trace_id, 0.5, idempotency_key="k").body["error"]["code"] == "idempotency_key_reused"
        assert t.feedback("nope", 1.0).status == 404


class DownCommitter:
    """A committer that is down: every send raises (or blocks until ``release`` is set)."""

    def __init__(self, block: bool = False) -> None:
        self.block = block
        self.release = threading.Event()
        self.seen: list[str] = []

    def send(self, batch_id: str, rows: list[dict[str, Any]]) -> None:
        self.seen.append(batch_id)
        if self.block:
            self.release.wait(30)
        raise ConnectionError("the training backend is down")


def test_stop_never_raises_when_the_backend_is_down_and_the_batch_is_resent_after(tmp_path):
    upstream, policy = Scripted("5"), Scripted("4")
    down = DownCommitter()
    t = trainer(tmp_path, committer=down, commit_interval_s=3600, min_traces=1000).start()
    model = t.chat_model(upstream=upstream, policy=policy)
    reply = asyncio.run(model.chat(MESSAGES))
    assert reply.trace_id is not None and t.feedback(reply.trace_id, 1.0).status == 200
    assert t.stop() is False  # its last pass failed: no exception, the batch waits for the next start
    (stuck,) = down.seen
    assert t.stop() is True  # a second stop has nothing left to do
    after = asyncio.run(model.chat(MESSAGES))  # fail-open: a stopped trainer no longer samples
    assert after.content == "5" and not after.sampled
    again = trainer(tmp_path, committer=JsonlCommitter(tmp_path / "batches"), commit_interval_s=3600).start()
    try:
        assert again.pipeline.outbox is not None and again.pipeline.outbox.wait_committed(1, timeout=10)
        assert again.pipeline.outbox.committed == [stuck]  # the same id
    finally:
        again.stop()


def test_stop_keeps_its_deadline_when_the_backend_hangs(tmp_path):
    upstream, policy = Scripted("5"), Scripted("4")
    hanging = DownCommitter(block=True)
    t = trainer(tmp_path, committer=hanging, commit_interval_s=3600, min_traces=1).start()
    try:
        model = t.chat_model(upstream=upstream, policy=policy)
        reply = asyncio.run(model.chat(MESSAGES))
        assert reply.trace_id is not None and t.feedback(reply.trace_id, 1.0).status == 200
        began = time.monotonic()
        assert t.stop(timeout_s=0.5) is False  # did not finish, and said so
        assert time.monotonic() - began < 5
    finally:
        hanging.release.set()


def test_a_real_openai_client_gets_token_ids_through_extra_body(tmp_path, upstream, policy, fakes):
    up = openai.OpenAI(base_url=upstream[1].v1, api_key=UPSTREAM_KEY, max_retries=0)
    pol = openai.AsyncOpenAI(base_url=policy[1].v1, api_key="p", max_retries=0)
    with trainer(tmp_path, committer="none") as t:
        model = t.chat_model(upstream=up, policy=pol, model="gpt-up", policy_model="pol")

        async def agent() -> Any:
            reply = await model.chat(MESSAGES)
            await model.wait_recorded()
            return reply

        reply = asyncio.run(agent())
        assert reply.sampled and reply.content == "policy" and reply.completion_token_ids == POLICY_TOKENS
        assert fakes[1].bodies()[0]["return_token_ids"] is True
        (call,) = t.store.trace(reply.trace_id)["calls"]
        assert call["token_ids"] == POLICY_TOKENS and call["prompt_token_ids"] == POLICY_PROMPT_IDS
    with trainer(tmp_path / "b", committer="none", selection=SamplingRate(0.0)) as t:
        model = t.chat_model(upstream=up, policy=pol, model="gpt-up")
        assert asyncio.run(model.chat(MESSAGES)).content == "from the upstream \u00e9"


def test_bad_committers_and_their_settings_are_clear_errors(tmp_path):
    with pytest.raises(
        ConfigError, match=r"OnlineTrainer\(\): committer: unknown committer 'snk' \(did you mean 'sink'\?\)"
    ):
        OnlineTrainer("snk", store=tmp_path / "t.sqlite")
    with pytest.raises(ConfigError, match=r"OnlineTrainer\(\): committer_args.path: expected a string"):
        OnlineTrainer("sink", committer_args={"path": 3}, store=tmp_path / "t.sqlite")
    with pytest.raises(ConfigError, match="committer: .* has no send"):
        OnlineTrainer(committer=object(), store=tmp_path / "t.sqlite")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="committer_args: only for a committer given by name"):
        OnlineTrainer(committer=JsonlCommitter(tmp_path), committer_args={"path": "x"}, store=tmp_path / "t.sqlite")
    with pytest.raises(ConfigError, match="reward: the run file 'missing.yaml' does not exist"):
        OnlineTrainer(reward="missing.yaml", store=tmp_path / "t.sqlite")


@pytest.mark.parametrize(
    ("keyword", "message"),
    [
        ("backend", r"backend= is now committer="),
        ("local", r"local= moved to committer_args= \(committer='local'\)"),
        ("trinity", r"trinity= moved to committer_args= \(committer='trinity'\)"),
        ("batches", r"batches= moved to committer_args=\{'path': ...\} \(committer='sink'\)"),
    ],
)
def test_the_0_1_keywords_say_where_they_moved(tmp_path, keyword, message):
    with pytest.raises(ConfigError, match=message):
        OnlineTrainer(store=tmp_path / "t.sqlite", **{keyword: "sink"})
    with pytest.raises(TypeError, match="unexpected keyword argument 'bakend'"):
        OnlineTrainer(store=tmp_path / "t.sqlite", bakend="sink")


def test_the_sink_folder_is_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with OnlineTrainer("sink", committer_args={"path": "out"}, store=tmp_path / "t.sqlite") as t:
        assert isinstance(t.pipeline.committer, JsonlCommitter) and t.pipeline.committer.directory == tmp_path / "out"


def test_from_config_uses_the_files_store_selection_and_rewards(tmp_path):
    (tmp_path / "online.yaml").write_text(
        "upstream: {url: 'http://127.0.0.1:9/v1'}\nmode: record\nselection: {sampling_rate: 1.0}\n"
        "reward: {judges: [exact_match]}\nstore: {path: mine.sqlite}\n"
    )
    with OnlineTrainer.from_config(tmp_path / "online.yaml") as t:
        model = t.chat_model(upstream=Scripted("4"))  # no policy: record mode, the upstream is the policy
        reply = asyncio.run(model.chat(MESSAGES, task={"answer": "4"}))
        assert reply.sampled and t.store.path == str(tmp_path / "mine.sqlite")
        assert t.pipeline.rewards is not None and t.pipeline.rewards.wait_results(1, timeout=10)
        t.store.submit(lambda db: None).result(10)
        assert t.store.trace(reply.trace_id)["reward"] == 1.0


def test_from_config_names_the_file_in_a_committers_errors(tmp_path):
    (tmp_path / "online.yaml").write_text(
        "upstream: {url: 'http://127.0.0.1:9/v1'}\nmode: record\ncommitter: {kind: sink, args: {path: 3}}\n"
    )
    with pytest.raises(ConfigError, match=rf"^{tmp_path / 'online.yaml'}: committer.args.path: expected a string"):
        OnlineTrainer.from_config(tmp_path / "online.yaml")
