"""The agent loop against a scripted model: trajectories, metrics, formats, and every way an action goes wrong."""

import asyncio
import json
import threading

import pytest

from reinforge import TaskStatus, Trajectory, response_text
from reinforge.plugin import ConfigError, RecordingChatModel
from reinforge.testing import ScriptedChatModel
from reinforge_rollouts_react import ReActAgent, ReActResult, calculator, check_settings, react_workflow, tool

PRICES = {"widget": 23.5, "gadget": 4.0}


@tool
def lookup_price(item: str) -> float:
    """Look up the unit price of an item in the catalogue.

    Args:
        item: The item's name, e.g. "widget".
    """
    if item not in PRICES:
        raise KeyError(f"no item {item!r} in the catalogue")
    return PRICES[item]


QUESTION = "What do 17 widgets cost?"
TEXT_EPISODE = [
    'Thought: I need the price of a widget.\nAction: lookup_price\nAction Input: {"item": "widget"}',
    'Thought: Now multiply.\nAction: calculator\nAction Input: {"expression": "17 * 23.5"}',
    "Thought: I know the cost.\nFinal Answer: 399.5",
]
JSON_EPISODE = [
    'I need the price of a widget.\n```json\n{"action": "lookup_price", "action_input": {"item": "widget"}}\n```',
    'Now multiply.\n{"action": "calculator", "action_input": {"expression": "17 * 23.5"}}',
    '{"final_answer": "399.5"}',
]


def native_call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


NATIVE_EPISODE = [
    {"content": "I need the price of a widget.", "tool_calls": [native_call("c1", "lookup_price", {"item": "widget"})]},
    {"content": "Now multiply.", "tool_calls": [native_call("c2", "calculator", {"expression": "17 * 23.5"})]},
    {"content": "399.5"},
]


def run(agent, question=QUESTION):
    return asyncio.run(agent.run(question))


def recorded(replies, **model_attrs):
    """A scripted model wrapped like the runner wraps it, and the trajectory it records into."""
    scripted = ScriptedChatModel(replies)
    for key, value in model_attrs.items():
        setattr(scripted, key, value)
    traj = Trajectory(task={"question": QUESTION})
    return RecordingChatModel(scripted, traj, {"temperature": 1.0}), traj, scripted


def summary(result: ReActResult):
    """What must not depend on the action format."""
    steps = [(s.turn, s.kind, s.tool, s.arguments, s.observation) for s in result.steps]
    metrics = {k: v for k, v in result.metrics.items() if not k.endswith("latency")}
    return steps, metrics, result.final_answer, result.finish_reason


def test_two_tools_three_turns_text_protocol_trajectory_metrics_and_answer():
    model, traj, _ = recorded(TEXT_EPISODE)
    agent = ReActAgent(model, tools=[lookup_price, calculator], sys_prompt="Answer shopping questions.", max_turns=4)
    result = run(agent)

    assert agent.action_format == "text"  # the scripted model does not claim native tool support
    assert result.final_answer == "399.5" and response_text(result) == "399.5"
    assert result.finish_reason == "answer" and result.status is TaskStatus.SUCCESS
    assert [(s.kind, s.tool, s.observation) for s in result.steps] == [
        ("tool", "lookup_price", "23.5"),
        ("tool", "calculator", "399.5"),
        ("final", None, None),
    ]
    assert result.steps[0].thought == "I need the price of a widget."
    assert result.steps[1].arguments == {"expression": "17 * 23.5"}
    m = result.metrics
    assert m["turns"] == 3 and m["tool_call_count"] == 2 and m["used_tool"] == 1.0
    assert m["invalid_action_count"] == 0 and m["tool_error_count"] == 0 and m["unknown_tool_count"] == 0
    assert m["finish_reason/answer"] == 1.0 and m["finish_reason/max_turns"] == 0.0
    assert m["latency"] >= m["model_latency"] >= 0 and m["tool_latency"] >= 0

    # one recorded model call per turn; observations only ever appear as prompt messages of the next call
    assert len(traj.calls) == 3
    system, user = traj.calls[0].messages
    assert system["role"] == "system" and system["content"].startswith("Answer shopping questions.")
    assert "lookup_price" in system["content"] and "Action Input:" in system["content"]
    assert user == {"role": "user", "content": QUESTION}
    assert traj.calls[1].messages[2:] == [
        {"role": "assistant", "content": TEXT_EPISODE[0]},
        {"role": "user", "content": "Observation: 23.5"},
    ]
    assert traj.calls[2].messages[4:] == [
        {"role": "assistant", "content": TEXT_EPISODE[1]},
        {"role": "user", "content": "Observation: 399.5"},
    ]
    for call, reply in zip(traj.calls, TEXT_EPISODE):
        assert bytes(call.completion_token_ids).decode() == reply  # completions are exactly what the model wrote
        assert "Observation" not in reply
        assert call.tools is None  # text protocol: no native tool schemas
        assert call.sampling["stop"] == ["\nObservation:"] and call.sampling["temperature"] == 1.0
    assert result.messages == traj.calls[2].messages + [{"role": "assistant", "content": TEXT_EPISODE[2]}]


def test_native_text_and_json_formats_parse_the_same_episode():
    outcomes = {}
    for name, replies, options in [
        ("text", TEXT_EPISODE, {"action_format": "text"}),
        ("json", JSON_EPISODE, {"action_format": "json"}),
        ("native", NATIVE_EPISODE, {"action_format": "native"}),
        ("auto-native", NATIVE_EPISODE, {"supports_tools": True}),
    ]:
        supports = options.pop("supports_tools", None)
        model, traj, _ = recorded(replies, **({"supports_tools": supports} if supports else {}))
        agent = ReActAgent(model, tools=[lookup_price, calculator], **options)
        outcomes[name] = (summary(run(agent)), agent.action_format, traj)

    reference = outcomes["text"][0]
    assert reference[2] == "399.5"
    for name in ("json", "native", "auto-native"):
        assert outcomes[name][0] == reference, name
    assert outcomes["json"][1] == "json" and outcomes["auto-native"][1] == "native"

    native_traj = outcomes["native"][2]
    assert len(native_traj.calls) == 3
    assert [t["function"]["name"] for t in native_traj.calls[0].tools] == ["lookup_price", "calculator"]
    assert "stop" not in native_traj.calls[0].sampling
    assert native_traj.calls[1].messages[-1] == {
        "role": "tool",
        "tool_call_id": "c1",
        "name": "lookup_price",
        "content": "23.5",
    }
    assert native_traj.calls[1].messages[-2]["tool_calls"][0]["id"] == "c1"
    assert "Action Input" not in native_traj.calls[0].messages[0]["content"]  # no text protocol in native mode
    json_system = outcomes["json"][2].calls[0].messages[0]["content"]
    assert '"action_input"' in json_system and "Action Input:" not in json_system


def test_malformed_actions_unknown_tools_and_tool_exceptions_become_observations_and_metrics():
    replies = [
        "Action: weather\nAction Input: Paris",  # unknown tool
        'Action: calculator\nAction Input: {"expr": "1 + 1"}',  # wrong argument name
        '```json\n{"action": "calculator", "action_input": \n```',  # broken JSON block
        "Action: calculator\nAction Input: 1 / 0",  # the tool raises
        'Action: lookup_price\nAction Input: {"item": "sprocket"}',  # the tool raises (KeyError)
        "Final Answer: I could not compute it.",
    ]
    model = ScriptedChatModel(replies)
    result = run(ReActAgent(model, tools=[calculator, lookup_price], max_turns=8))

    kinds = [s.kind for s in result.steps]
    assert kinds == ["unknown_tool", "invalid", "invalid", "tool_error", "tool_error", "final"]
    observations = [m["content"] for m in result.messages if m["role"] == "user"][1:]
    assert observations[0].startswith("Observation: Unknown tool 'weather'. Available tools: calculator, lookup_price.")
    assert "has no argument 'expr'" in observations[1] and "its arguments are: expression" in observations[1]
    assert "not valid JSON" in observations[2]
    assert "Action Input:" in observations[0]  # invalid actions remind the model of the format
    assert observations[3] == "Observation: Error: tool 'calculator' raised ZeroDivisionError: division by zero"
    assert "KeyError" in observations[4] and "sprocket" in observations[4]
    m = result.metrics
    assert m["invalid_action_count"] == 3 and m["unknown_tool_count"] == 1
    assert m["tool_call_count"] == 2 and m["tool_error_count"] == 2 and m["tool_timeout_count"] == 0
    assert m["turns"] == 6 and result.finish_reason == "answer" and result.status is TaskStatus.SUCCESS
    assert len(model.calls) == 6  # every observation went back to the model


def test_async_tool_timeout_is_an_observation_not_a_crash():
    never = asyncio.Event()  # never set: the tool would wait forever

    @tool(timeout=0.01)
    async def wait_for_signal(channel: str) -> str:
        """Wait for a signal on a channel.

        Args:
            channel: Which channel.
        """
        await never.wait()
        return "signal"

    model = ScriptedChatModel(["Action: wait_for_signal\nAction Input: alpha", "Final Answer: no signal"])
    result = run(ReActAgent(model, tools=[wait_for_signal], tool_timeout=60))  # the tool's own timeout wins
    step = result.steps[0]
    assert step.kind == "tool_timeout" and step.tool == "wait_for_signal" and step.arguments == {"channel": "alpha"}
    assert step.observation == "Error: tool 'wait_for_signal' timed out after 0.01s."
    assert result.metrics["tool_timeout_count"] == 1 and result.metrics["tool_error_count"] == 1
    assert result.final_answer == "no signal"
    assert model.calls[1].messages[-1]["content"] == "Observation: Error: tool 'wait_for_signal' timed out after 0.01s."


def test_sync_tools_run_in_a_thread_and_time_out_with_the_agent_default():
    release = threading.Event()
    seen_threads = []

    def blocking_lookup(key: str) -> str:
        """Look a key up in a slow store."""
        seen_threads.append(threading.current_thread().name)
        release.wait()
        return "value"

    def quick(key: str) -> str:
        """Look a key up in a fast store."""
        seen_threads.append(threading.current_thread().name)
        return key.upper()

    model = ScriptedChatModel(["Action: quick[abc]", "Action: blocking_lookup[abc]", "Final Answer: ABC"])
    agent = ReActAgent(model, tools=[quick, blocking_lookup], tool_timeout=0.01)

    async def episode():
        try:
            return await agent.run("look up abc")
        finally:
            release.set()  # let the abandoned thread finish before the loop shuts its executor down

    result = asyncio.run(episode())
    assert [s.kind for s in result.steps] == ["tool", "tool_timeout", "final"]
    assert result.steps[0].observation == "ABC"
    assert seen_threads and threading.main_thread().name not in seen_threads


def test_max_turns_ends_the_episode_with_a_recorded_finish_reason():
    model, traj, _ = recorded(['Action: calculator\nAction Input: {"expression": "1 + 1"}'] * 5)
    result = run(ReActAgent(model, tools=[calculator], max_turns=2))
    assert len(traj.calls) == 2
    assert result.finish_reason == "max_turns" and result.final_answer is None and str(result) == ""
    assert result.metrics["finish_reason/max_turns"] == 1.0 and result.metrics["finish_reason/answer"] == 0.0
    assert result.metrics["turns"] == 2 and result.metrics["tool_call_count"] == 2
    out = result.to_workflow_output()
    assert out.status is TaskStatus.SUCCESS and response_text(out.response) == ""  # no answer: the judges decide


def test_a_failed_model_call_fails_the_rollout():
    model = ScriptedChatModel(['Action: calculator\nAction Input: {"expression": "2 * 3"}', ConnectionError("reset")])
    out = asyncio.run(react_workflow({"question": "2*3?"}, model, tools=[calculator]))
    assert out.status is TaskStatus.FAILED
    assert out.error == "model call on turn 2 failed: ConnectionError: reset"
    assert out.response.finish_reason == "model_error" and out.metrics["finish_reason/model_error"] == 1.0


def test_plain_replies_are_answers_unless_the_format_is_strict():
    lenient = run(ReActAgent(ScriptedChatModel(["It is 42."]), tools=[calculator]))
    assert lenient.final_answer == "It is 42." and lenient.metrics["unmarked_answer"] == 1.0

    strict_model = ScriptedChatModel(["It is 42.", "", "Final Answer: 42"])
    strict = run(ReActAgent(strict_model, tools=[calculator], strict_format=True))
    assert [s.kind for s in strict.steps] == ["invalid", "invalid", "final"]
    assert "the reply is empty" in strict.steps[1].error
    assert strict.metrics["invalid_action_count"] == 2 and strict.metrics["unmarked_answer"] == 0.0


def test_native_tool_call_errors_are_tool_messages():
    replies = [
        {
            "content": None,
            "tool_calls": [
                native_call("a", "calculator", {"expression": "6 * 7"}),
                native_call("b", "nope", {}),
                {"id": "c", "type": "function", "function": {"name": "calculator", "arguments": "{not json"}},
            ],
        },
        {"content": "Final Answer: 42"},
    ]
    model = ScriptedChatModel(replies)
    result = run(ReActAgent(model, tools=[calculator], action_format="native"))
    tool_messages = [m for m in model.calls[1].messages if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"][:20]) for m in tool_messages] == [
        ("a", "42"),
        ("b", "Unknown tool 'nope'."),
        ("c", "Invalid action: the "),
    ]
    assert result.final_answer == "42"  # a final-answer marker is stripped in native mode too
    assert result.metrics["turns"] == 2 and result.metrics["tool_call_count"] == 1
    assert result.metrics["invalid_action_count"] == 2 and result.metrics["unknown_tool_count"] == 1


def test_observations_are_cut_and_tool_names_match_case_insensitively():
    @tool
    def dump(n: int) -> str:
        """Print n x characters.

        Args:
            n: How many.
        """
        return "x" * n

    model = ScriptedChatModel(["Action: Dump\nAction Input: 50", "Final Answer: done"])
    result = run(ReActAgent(model, tools=[dump], max_observation_chars=10))
    assert result.steps[0].arguments == {"n": 50}  # "50" coerced to the declared int
    assert result.steps[0].observation == "xxxxxxxxxx... [cut 40 chars]"


def test_messages_questions_keep_their_system_text_and_the_transcript_reads_well():
    model = ScriptedChatModel(["Final Answer: hi"])
    question = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
    result = run(ReActAgent(model, tools=[], sys_prompt="You are kind."), question)
    sent = model.calls[0].messages
    assert [m["role"] for m in sent] == ["system", "user"]
    assert sent[0]["content"].startswith("You are kind.") and sent[0]["content"].endswith("Be brief.")
    assert "Final Answer: <the answer>" in sent[0]["content"]  # no tools: only how to answer
    text = result.transcript()
    assert "[user] Say hi" in text and "[assistant] Final Answer: hi" in text and "[finish] answer: 'hi'" in text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_turns": 0}, "max_turns: must be at least 1, got 0"),
        ({"max_turns": 2.5}, "max_turns: expected an integer, got float 2.5"),
        ({"action_format": "xml"}, "action_format: must be one of auto, native, text, json; got 'xml'"),
        ({"tool_timeout": -1}, "tool_timeout: must be greater than 0"),
        ({"tools": ["no_such_tool"]}, "tools[0]: no tool named 'no_such_tool' is registered"),
        ({"max_observation_chars": 0}, "max_observation_chars: must be at least 1"),
        ({"sampling": "hot"}, "sampling: expected a mapping or null, got str 'hot'"),
    ],
)
def test_bad_settings_are_config_errors_naming_the_setting(options, message):
    with pytest.raises(ConfigError) as info:
        ReActAgent(ScriptedChatModel([]), **options)
    assert message in str(info.value)
    with pytest.raises(ConfigError) as info:  # the same check, without a model, for run files
        check_settings(options)
    assert f"react workflow: args.{message}" in str(info.value)


def test_good_settings_pass_the_check():
    checked = check_settings({"tools": ["calculator"], "max_turns": 3, "question_field": "prompt", "stop": "END"})
    assert checked.max_turns == 3 and checked.stop == ["END"] and checked.tools == ["calculator"]
    with pytest.raises(ConfigError, match="react workflow: args.question_field: must be a non-empty string"):
        check_settings({"question_field": ""})
    with pytest.raises(
        ConfigError, match=r"react workflow: unknown key 'args.max_turn' \(did you mean 'max_turns'\?\)"
    ):
        check_settings({"max_turn": 3})


def test_the_workflow_reads_a_configurable_task_field_and_says_which_is_missing():
    model = ScriptedChatModel(["Final Answer: 4"])
    out = asyncio.run(react_workflow({"prompt": "2+2?"}, model, question_field="prompt", max_turns=1))
    assert response_text(out.response) == "4" and out.metrics["turns"] == 1
    assert model.calls[0].messages[-1] == {"role": "user", "content": "2+2?"}
    with pytest.raises(ConfigError, match=r"task field 'question' is missing .* keys: prompt"):
        asyncio.run(react_workflow({"prompt": "2+2?"}, ScriptedChatModel([])))


def test_few_shot_turns_sit_between_the_system_message_and_the_question():
    shots = [
        {"role": "user", "content": "What is 2 * 3?"},
        {"role": "assistant", "content": 'Action: calculator\nAction Input: {"expression": "2 * 3"}'},
        {"role": "user", "content": "Observation: 6"},
        {"role": "assistant", "content": "Final Answer: 6"},
    ]
    model, traj, _ = recorded(["Final Answer: 1"])
    run(ReActAgent(model, tools=[calculator], few_shot=shots))
    messages = traj.calls[0].messages
    assert messages[0]["role"] == "system" and messages[1:5] == shots
    assert messages[5] == {"role": "user", "content": QUESTION}


@pytest.mark.parametrize(
    "shots, message",
    [
        ("hi", "few_shot: expected a list, got str"),
        ([{"role": "robot", "content": "x"}], "few_shot[0]: must be a message with role one of user, assistant, tool"),
        ([{"role": "assistant", "content": 3}], "few_shot[0].content: must be text, got int"),
        ([{"role": "user", "content": "q"}], "few_shot: must end with an assistant message"),
    ],
)
def test_bad_few_shot_turns_are_config_errors(shots, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_settings({"few_shot": shots})


def test_turn_rewards_reward_the_call_that_took_each_action():
    replies = [
        "Action: calc[1]",  # unknown tool
        'Action: calculator\nAction Input: {"expression": "2 * 3"}',  # a tool call that ran
        "Final Answer: 6",
    ]
    model, traj, _ = recorded(replies)
    agent = ReActAgent(model, tools=[calculator], turn_rewards={"tool": 0.5, "unknown_tool": -0.5}, max_turns=4)
    result = run(agent)
    assert result.call_rewards == [-0.5, 0.5, None]  # the final answer's kind is not listed: no reward
    assert result.to_workflow_output().call_rewards == [-0.5, 0.5, None]
    assert len(traj.calls) == 3
    plain, _, _ = recorded(replies)
    assert run(ReActAgent(plain, tools=[calculator], max_turns=4)).call_rewards is None
    with pytest.raises(ConfigError, match="turn_rewards.tool_call: must be one of tool, tool_error"):
        check_settings({"turn_rewards": {"tool_call": 1.0}})


def test_an_action_input_object_whose_value_lost_its_quotes_still_runs():
    model, _, _ = recorded(['Action: calculator\nAction Input: {"expression": 616 * 28}', "Final Answer: 17248"])
    result = run(ReActAgent(model, tools=[calculator]))
    assert [(s.kind, s.observation) for s in result.steps] == [("tool", "17248"), ("final", None)]
