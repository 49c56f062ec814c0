"""Continuous batching on the real SmolLM2-135M: rows that join a running batch decode exactly as alone."""

import asyncio
import os
import threading

import pytest
import torch
from test_decoder import ATOL, _prompt  # the decoder tests' tolerance and prompts

from reinforge_backend_local.inference.decoder import DecodeSession, LlamaDecoder
from reinforge_backend_local.inference.engine import Engine, GenRequest
from reinforge_backend_local.inference.scheduler import Scheduler


def _alone(model, prompt, feed):
    """Each next-token logits of ``prompt`` decoded alone, teacher-forced with ``feed``."""
    session = LlamaDecoder(model).session()
    out = [session.prefill([prompt], [0], len(feed) + 1)[0]]
    for t in feed:
        out.append(session.step(torch.tensor([t]))[0])
    return out


def test_rows_joining_mid_decode_match_each_row_decoded_alone(policy, poisoned_caches):
    """A joins, B joins after 3 steps (in place), C with a longer prompt than the slot (a new layout), A leaves."""
    model, tok = policy
    a = _prompt(tok, "What is 2 + 3?")
    b = _prompt(tok, "What is 41 + 17?")
    c = _prompt(tok, "Please add these two numbers for me and explain: 1234 + 5678?", system="Be brief. " * 12)
    feeds = {name: [1000 + 53 * i + 7 * k for k in range(10)] for i, name in enumerate("abc")}
    with torch.inference_mode():
        ref = {"a": _alone(model, a, feeds["a"]), "b": _alone(model, b, feeds["b"]), "c": _alone(model, c, feeds["c"])}
        session = LlamaDecoder(model).session()
        got = {"a": [session.prefill([a], [0], 16, row_capacity=4)[0]]}
        order, done = ["a"], {"a": 0}

        def step() -> None:
            feed = torch.tensor([feeds[n][done[n]] for n in order])
            for n in order:
                done[n] += 1
            for n, row in zip(order, session.step(feed)):
                got[n].append(row)

        for _ in range(3):
            step()
        cache = session.cache
        part = session.fresh()
        got["b"] = [part.prefill([b], [0], 0)[0]]
        session.join(part, 6, 8)
        assert session.cache is cache  # fits: written in place
        order.append("b")
        done["b"] = 0
        step()
        assert len(c) > session.slot  # its prompt is longer than the batch so far: a new layout
        part = session.fresh()
        got["c"] = [part.prefill([c], [0], 0)[0]]
        session.join(part, 6, 8)
        assert session.cache is not cache
        order.append("c")
        done["c"] = 0
        step()
        step()
        session.keep([1, 2])  # A finishes
        order.remove("a")
        laid_out = session.cache
        session.compact(4, 8)  # and the batch is laid out again, right-aligned, in its own cache
        assert session.cache is laid_out
        step()
        step()
    for name in "abc":
        for k, row in enumerate(got[name]):
            torch.testing.assert_close(row, ref[name][k], atol=ATOL, rtol=0, msg=f"row {name}, token {k}")


def test_rows_admitted_within_a_step_match_each_row_decoded_alone(policy, poisoned_caches):
    """One pass steps A and prefills B and C (a reused prefix, different lengths); then all step together."""
    model, tok = policy
    a = _prompt(tok, "Please add these two numbers for me and explain: 1234 + 5678?")
    b, c = _prompt(tok, "What is 41 + 17?"), _prompt(tok, "Add 100 and 250, please, and say why.")
    feeds = {name: [1000 + 53 * i + 7 * k for k in range(8)] for i, name in enumerate("abc")}
    with torch.inference_mode():
        ref = {n: _alone(model, p, feeds[n]) for n, p in zip("abc", (a, b, c))}
        session = LlamaDecoder(model).session()
        got = {"a": [session.prefill([a], [0], 12, row_capacity=4)[0]]}
        session.step(torch.tensor([feeds["a"][0]]))  # A is one token in
        got["a"].append(ref["a"][1])
        ids, k, v = session.computed_prefix
        common = len(os.path.commonprefix([a, b, c]))
        prefix = (ids[:common], k[:, :, :, :common], v[:, :, :, :common])
        assert session.can_admit([b, c], common, 8)
        assert not session.can_admit([b, c + [5] * session.slot], common, 8)  # would start before slot 0
        logits = session.step_admitting(torch.tensor([feeds["a"][1]]), [b, c], prefix)
        assert session.prefix_hits == 2 * common and list(session.computed_prefix[0]) == c[:-1]
        got["a"].append(logits[0])
        got["b"], got["c"] = [logits[1]], [logits[2]]
        done = {"a": 2, "b": 0, "c": 0}
        for _ in range(4):
            feed = torch.tensor([feeds[n][done[n]] for n in "abc"])
            for n, row in zip("abc", session.step(feed)):
                done[n] += 1
                got[n].append(row)
    for name in "abc":
        for i, row in enumerate(got[name]):
            torch.testing.assert_close(row, ref[name][i], atol=ATOL, rtol=0, msg=f"row {name}, token {i}")


def test_a_reused_prefix_gives_the_logits_of_computing_it(policy, poisoned_caches):
    """The shared part of an earlier prefill (its keys and values) stands in for computing it again."""
    model, tok = policy
    a, b, c = (_prompt(tok, q) for q in ("What is 2 + 3?", "What is 41 + 17?", "Add 100 and 250, please."))
    with torch.inference_mode():
        earlier = LlamaDecoder(model).session()
        earlier.prefill([a], [0], 0)
        ids, k, v = earlier.computed_prefix
        assert list(ids) == a[:-1]
        common = len(os.path.commonprefix([a, b, c]))
        assert common >= 8  # the system prompt and the chat template's framing
        prefix = (ids[:common], k[:, :, :, :common], v[:, :, :, :common])
        for prompts, row_src in (([b], [0]), ([b, c], [0, 1, 1])):
            plain, reused = LlamaDecoder(model).session(), LlamaDecoder(model).session()
            torch.testing.assert_close(
                reused.prefill(prompts, row_src, 3, prefix=prefix),
                plain.prefill(prompts, row_src, 3),
                atol=ATOL,
                rtol=0,
            )
            assert reused.prefix_hits == common and plain.prefix_hits == 0
            feed = torch.tensor([900 + 13 * r for r in range(len(row_src))])
            torch.testing.assert_close(reused.step(feed), plain.step(feed), atol=ATOL, rtol=0)
        other = LlamaDecoder(model).session()  # a prefix the prompts do not start with is not used
        other.prefill([b], [0], 0, prefix=((1, 2, 3, 4, 5), k[:, :, :, :5], v[:, :, :, :5]))
        assert other.prefix_hits == 0


def test_one_prompt_is_prefilled_in_one_pass_over_the_weights(policy, monkeypatch):
    """A request joining alone costs one forward (not a prefix pass and a one-token pass), reused prefix or not."""
    model, tok = policy
    a, b = (_prompt(tok, q) for q in ("What is 2 + 3?", "What is 41 + 17?"))
    passes = []
    forward = DecodeSession._forward
    monkeypatch.setattr(
        DecodeSession, "_forward", lambda self, ids, *rest: passes.append(ids.shape) or forward(self, ids, *rest)
    )
    with torch.inference_mode():
        first = LlamaDecoder(model).session()
        first.prefill([a], [0], 0)
        ids, k, v = first.computed_prefix
        common = len(os.path.commonprefix([a, b]))
        joined = LlamaDecoder(model).session()
        joined.prefill([b], [0], 0, prefix=(ids[:common], k[:, :, :, :common], v[:, :, :, :common]))
    assert passes == [(1, len(a)), (1, len(b) - common)]
    assert joined.prefix_hits == common and list(joined.computed_prefix[0]) == b[:-1]


def _request(prompt, max_tokens=12, **kw):
    return GenRequest(prompt_ids=prompt, max_tokens=max_tokens, temperature=kw.pop("temperature", 0.0), **kw)


@pytest.fixture(scope="module")
def engine(policy):
    model, tok = policy
    return Engine(model, tok, max_model_len=512, max_batch=8)


def test_a_request_arriving_mid_decode_joins_the_running_batch(engine, policy):
    _, tok = policy
    first, second = _prompt(tok, "Count from one to twenty in words."), _prompt(tok, "What is 12 + 30?")
    scheduler = Scheduler(engine, max_batch=8)
    steps_at_join = []

    async def main():
        s1 = scheduler.submit(_request(first, max_tokens=24))
        seen = 0
        async for _ in s1.events():
            seen += 1
            if seen == 3:  # the first request is decoding: send the second now
                steps_at_join.append(scheduler.stats.steps)
                s2 = scheduler.submit(_request(second, max_tokens=8))
        return s1.result, await s2.finished()

    try:
        one, two = asyncio.run(main())
    finally:
        scheduler.close()
    assert scheduler.stats.joined == 1 and scheduler.stats.admitted == 2
    assert scheduler.stats.prefix_tokens_reused >= 8  # the second reused the first's system prompt
    assert scheduler.stats.max_rows == 2
    alone = engine.generate([_request(first, max_tokens=24), _request(second, max_tokens=8)])
    assert one.token_ids == alone[0].token_ids and one.text == alone[0].text
    assert two.token_ids == alone[1].token_ids
    assert two.finish_reason == alone[1].finish_reason
    assert 1 <= len(two.token_ids) <= 8


def test_per_request_limits_stop_strings_top_logprobs_and_length(engine, policy):
    _, tok = policy
    prompt = _prompt(tok, "List the numbers 1, 2, 3, 4, 5, 6.", system=None)
    scheduler = Scheduler(engine, max_batch=8)

    async def main():
        streams = [
            scheduler.submit(_request(prompt, max_tokens=3)),
            scheduler.submit(_request(prompt, max_tokens=20, top_logprobs=3)),
            scheduler.submit(_request(prompt, max_tokens=30, stop=["3"])),
        ]
        return [await s.finished() for s in streams]

    try:
        short, tops, stopped = asyncio.run(main())
    finally:
        scheduler.close()
    assert short.finish_reason == "length" and len(short.token_ids) == 3
    assert tops.top_logprobs is not None and len(tops.top_logprobs) == len(tops.token_ids)
    for t, lp, alternatives in zip(tops.token_ids, tops.logprobs, tops.top_logprobs):
        assert len(alternatives) == 3
        assert alternatives[0][0] == t  # greedy: the sampled token is the likeliest
        assert alternatives[0][1] == pytest.approx(lp, abs=1e-5)
        assert [v for _, v in alternatives] == sorted((v for _, v in alternatives), reverse=True)
    assert stopped.finish_reason == "stop" and "3" not in stopped.text
    assert "3" in tok.decode(stopped.token_ids)


def test_max_batch_holds_the_rest_back_and_every_request_completes(engine, policy):
    _, tok = policy
    prompts = [_prompt(tok, f"What is {n} + {n}?") for n in range(5)]
    scheduler = Scheduler(engine, max_batch=2)

    async def main():
        return await asyncio.gather(*(scheduler.generate(_request(p, max_tokens=6)) for p in prompts))

    try:
        results = asyncio.run(main())
    finally:
        scheduler.close()
    assert scheduler.stats.max_rows == 2 and scheduler.stats.admitted == 5
    assert all(1 <= len(r.token_ids) <= 6 for r in results)


def test_a_cancelled_request_leaves_the_batch_and_a_failure_reaches_every_waiter(engine, policy, monkeypatch):
    _, tok = policy
    prompt = _prompt(tok, "Tell me a long story about a dragon.")
    scheduler = Scheduler(engine, max_batch=8)

    async def cancel_one():
        keep, leave = (
            scheduler.submit(_request(prompt, max_tokens=16)),
            scheduler.submit(_request(prompt, max_tokens=16)),
        )
        async for _ in leave.events():
            leave.cancel()
            break
        return await keep.finished()

    try:
        kept = asyncio.run(cancel_one())
        assert len(kept.token_ids) >= 1 and scheduler.stats.cancelled == 1

        def broken(*args, **kwargs):
            raise RuntimeError("kernel exploded")

        async def fail_then_serve():
            with monkeypatch.context() as m:
                m.setattr(type(engine.decoder.session()), "step", broken)
                streams = [scheduler.submit(_request(prompt, max_tokens=8)) for _ in range(2)]
                for s in streams:  # every waiter gets the failure
                    with pytest.raises(RuntimeError, match="kernel exploded"):
                        await s.finished()
            return await scheduler.generate(_request(prompt, max_tokens=4))

        after = asyncio.run(fail_then_serve())
    finally:
        scheduler.close()
    assert len(after.token_ids) >= 1  # the loop survived the failure


def test_a_call_runs_on_the_decode_thread_between_steps_and_a_failure_reaches_its_caller(engine, policy):
    _, tok = policy
    prompt = _prompt(tok, "Count from one to twenty in words.")
    scheduler = Scheduler(engine, max_batch=8)
    seen = []

    def note():
        seen.append((threading.current_thread().name, scheduler.stats.steps, engine.lock.locked()))
        return "done"

    def fails():
        raise ValueError("bad adapter")

    async def main():
        stream = scheduler.submit(_request(prompt, max_tokens=12))
        count = 0
        async for _ in stream.events():
            count += 1
            if count == 3:  # mid-decode: the call waits for the step in progress, then the batch goes on
                before = scheduler.stats.steps
                assert await asyncio.wrap_future(scheduler.call(note)) == "done"
                with pytest.raises(ValueError, match="bad adapter"):
                    await asyncio.wrap_future(scheduler.call(fails))
        return before, stream.result

    try:
        assert scheduler.call(note).result(timeout=60) == "done"  # no batch running: it runs at once
        before, result = asyncio.run(main())
    finally:
        scheduler.close()
    (idle_thread, _, _), (thread, steps, locked) = seen
    assert idle_thread == thread == "reinforge-serve-decode"
    assert steps >= before and not locked  # between two steps, not inside one
    assert len(result.token_ids) > 3 and result.finish_reason in ("stop", "length")  # it went on after the calls
    with pytest.raises(RuntimeError, match="closed"):
        scheduler.call(note)
