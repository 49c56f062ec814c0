"""ScriptedChatModel: deterministic replies, recorded calls and fake tokens."""

from __future__ import annotations

import asyncio

import pytest

from reinforge.models import ChatModel, ChatResponse, RecordingChatModel
from reinforge.testing import ScriptedChatModel, ScriptExhaustedError
from reinforge.trajectory import Trajectory

USER = [{"role": "user", "content": "2+2?"}]
TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}


def run(coro):
    return asyncio.run(coro)


def test_is_a_chat_model() -> None:
    assert isinstance(ScriptedChatModel([]), ChatModel)


def test_replies_are_consumed_in_order_and_calls_recorded() -> None:
    model = ScriptedChatModel(["first", "second"])
    r1 = run(model.chat(USER, temperature=0.5))
    r2 = run(model.chat(USER + [{"role": "assistant", "content": "first"}], tools=[{"type": "function"}]))
    assert (r1.content, r2.content) == ("first", "second")
    assert r1.message == {"role": "assistant", "content": "first"}
    assert model.remaining == 0
    messages, tools, sampling = model.calls[0]
    assert messages == USER and tools is None and sampling == {"temperature": 0.5}
    assert model.calls[1].tools == [{"type": "function"}]


def test_recorded_messages_are_copies() -> None:
    model = ScriptedChatModel(["ok"])
    msgs = [{"role": "user", "content": "a"}]
    run(model.chat(msgs))
    msgs[0]["content"] = "mutated"
    assert model.calls[0].messages[0]["content"] == "a"


def test_dict_reply_with_tool_calls() -> None:
    model = ScriptedChatModel([{"tool_calls": [TOOL_CALL]}])
    r = run(model.chat(USER))
    assert r.tool_calls == [TOOL_CALL]
    assert r.message["role"] == "assistant" and r.content == ""
    assert r.finish_reason == "tool_calls"


def test_chat_response_is_returned_as_is() -> None:
    canned = ChatResponse(message={"role": "assistant", "content": "x"}, finish_reason="length")
    assert run(ScriptedChatModel([canned]).chat(USER)) is canned


def test_exception_items_are_raised_and_the_script_goes_on() -> None:
    model = ScriptedChatModel([ConnectionError("503"), "recovered"])
    with pytest.raises(ConnectionError, match="503"):
        run(model.chat(USER))
    assert run(model.chat(USER)).content == "recovered"
    assert len(model.calls) == 2


def test_running_out_raises_a_clear_error() -> None:
    model = ScriptedChatModel(["only"])
    run(model.chat(USER))
    with pytest.raises(ScriptExhaustedError, match=r"1 scripted replies and was called 2 times.*2\+2\?"):
        run(model.chat(USER))


def test_fake_tokens_decode_back_and_logprobs_are_zero() -> None:
    r = run(ScriptedChatModel(["héllo"]).chat(USER))
    assert bytes(r.completion_token_ids).decode() == "héllo"
    assert "2+2?" in bytes(r.prompt_token_ids).decode()
    assert r.logprobs == [0.0] * len(r.completion_token_ids)
    assert r.usage == {
        "prompt_tokens": len(r.prompt_token_ids),
        "completion_tokens": len(r.completion_token_ids),
        "total_tokens": len(r.prompt_token_ids) + len(r.completion_token_ids),
    }
    assert r.model == "scripted"


def test_same_input_gives_same_tokens() -> None:
    a = run(ScriptedChatModel(["x"]).chat(USER))
    b = run(ScriptedChatModel(["x"]).chat(USER))
    assert (a.prompt_token_ids, a.completion_token_ids) == (b.prompt_token_ids, b.completion_token_ids)


def test_finish_reason_and_policy_version_options() -> None:
    r = run(ScriptedChatModel(["cut"], finish_reason="length", policy_version=3).chat(USER))
    assert r.truncated and r.policy_version == 3


def test_sync_callable_script_sees_messages_tools_and_sampling() -> None:
    def reply(messages, tools, sampling):
        return f"{messages[-1]['content']}|{len(tools or [])}|{sampling.get('seed')}"

    model = ScriptedChatModel(reply)
    assert run(model.chat(USER, tools=[{}], seed=7)).content == "2+2?|1|7"
    assert run(model.chat(USER)).content == "2+2?|0|None"
    assert model.remaining == 0 and len(model.calls) == 2


def test_async_callable_script() -> None:
    async def reply(messages, tools, sampling):
        await asyncio.sleep(0)
        return {"content": "async"}

    assert run(ScriptedChatModel(reply).chat(USER)).content == "async"


def test_works_under_recording_chat_model() -> None:
    traj = Trajectory(task={"q": "2+2?"})
    model = RecordingChatModel(ScriptedChatModel(["4"]), traj, defaults={"temperature": 1.0})
    run(model.chat(USER))
    assert traj.calls[0].completion_token_ids == list(b"4")
    assert traj.calls[0].sampling == {"temperature": 1.0}
    assert model.model_name == "scripted"


def test_concurrent_calls_each_get_one_reply() -> None:
    model = ScriptedChatModel([str(i) for i in range(20)])

    async def main():
        return await asyncio.gather(*(model.chat(USER) for _ in range(20)))

    contents = sorted(r.content for r in run(main()))
    assert contents == sorted(str(i) for i in range(20))


def test_bad_item_type_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="scripted reply"):
        run(ScriptedChatModel([42]).chat(USER))
