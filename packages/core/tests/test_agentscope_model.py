"""Workflows written for AgentScope's tuner: detection, the adapter and its errors, without AgentScope.

Nothing here needs AgentScope installed (nor is skipped without it): AgentScope
is either hidden or replaced by a small stand-in package on ``sys.path``. The
real thing runs the tutorial in backend-local's ``test_agentscope_tutorial.py``
(``nox -s agentscope``).
"""

import asyncio
import json
import sys
import textwrap
from typing import Optional

import pytest

from reinforge import JudgeOutput, WorkflowOutput
from reinforge.agentscope_model import (
    ChatModelClient,
    agentscope_adapter,
    agentscope_chat_model,
    annotated_for_agentscope,
    wants_agentscope,
)
from reinforge.config import RunConfig
from reinforge.errors import ConfigError, MissingExtraError, ReinforgeError
from reinforge.job import build_job
from reinforge.models import ChatResponse, RecordingChatModel
from reinforge.plugins import get_plugin_manager
from reinforge.rewards import RewardComposer
from reinforge.runner import Runner
from reinforge.signatures import bind
from reinforge.testing import ScriptedChatModel
from reinforge.trajectory import Trajectory

# Classes that look like AgentScope's to the detection (which never imports AgentScope).
ChatModelBase = type("ChatModelBase", (), {"__module__": "agentscope.model._model_base"})
OpenAIChatModel = type("OpenAIChatModel", (ChatModelBase,), {"__module__": "agentscope.model._openai_model"})
NotAgentScope = type("ChatModelBase", (), {"__module__": "my_project.models"})


async def plain(task, model):
    return WorkflowOutput(response="plain")


async def by_class(task, model: ChatModelBase, auxiliary_models=None):
    return WorkflowOutput(response=model)


async def by_optional(task, model: Optional[ChatModelBase]):  # noqa: UP045 - the typing spelling on purpose
    return WorkflowOutput()


async def by_union(task, model: ChatModelBase | None):
    return WorkflowOutput()


async def by_subclass(task, model: OpenAIChatModel):
    return WorkflowOutput()


async def by_string(task, model: "ChatModelBase"):
    return WorkflowOutput()


async def by_other_class(task, model: NotAgentScope):
    return WorkflowOutput()


async def by_other_string(task, model: "NotAgentScope"):
    return WorkflowOutput()


@pytest.mark.parametrize("workflow", [by_class, by_optional, by_union, by_subclass, by_string])
def test_a_model_annotated_with_agentscope_chat_model_base_wants_an_agentscope_model(workflow):
    assert annotated_for_agentscope(workflow)
    assert wants_agentscope(bind(workflow, "workflow"))


@pytest.mark.parametrize("workflow", [plain, by_other_class, by_other_string])
def test_other_workflows_get_a_reinforge_chat_model(workflow):
    assert not annotated_for_agentscope(workflow)
    assert not wants_agentscope(bind(workflow, "workflow"))


def _agentscope_modules() -> list[str]:
    return [m for m in sys.modules if m == "agentscope" or m.startswith("agentscope.")]


@pytest.fixture
def forget_agentscope():
    """AgentScope's modules (real or not) are forgotten during the test and put back after it."""
    saved = {m: sys.modules.pop(m) for m in _agentscope_modules()}
    yield
    for m in _agentscope_modules():
        del sys.modules[m]
    sys.modules.update(saved)


def _module_with_future_annotations(source: str) -> dict:
    namespace: dict = {"__name__": "user_workflows"}
    exec(
        compile("from __future__ import annotations\n" + textwrap.dedent(source), "user_workflows.py", "exec"),
        namespace,
    )
    return namespace


def test_string_annotations_are_read_without_importing_agentscope(forget_agentscope):
    ns = _module_with_future_annotations(
        """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            import agentscope.model
            from agentscope.model import ChatModelBase

        async def tutorial(task: dict, model: ChatModelBase, auxiliary_models: dict[str, ChatModelBase] | None = None):
            ...

        async def dotted(task, model: agentscope.model.ChatModelBase | None = None):
            ...

        async def plain(task: dict, model: ChatModel):
            ...
        """
    )
    assert annotated_for_agentscope(ns["tutorial"])
    assert annotated_for_agentscope(ns["dotted"])
    assert not annotated_for_agentscope(ns["plain"])
    assert _agentscope_modules() == []


def test_a_string_naming_a_class_of_the_module_is_decided_by_that_class():
    ns = _module_with_future_annotations(
        """
        class ChatModelBase:  # the user's own, not AgentScope's
            pass

        async def own(task, model: ChatModelBase):
            ...
        """
    )
    ns["Alias"] = OpenAIChatModel
    exec("async def aliased(task, model: Alias): ...", ns)
    assert not annotated_for_agentscope(ns["own"])
    assert annotated_for_agentscope(ns["aliased"])


def test_model_interface_overrides_the_annotation_and_is_checked():
    assert wants_agentscope(plain, "agentscope")
    assert not wants_agentscope(by_class, "reinforge")
    assert wants_agentscope(by_class, None) and not wants_agentscope(plain, None)
    with pytest.raises(ConfigError, match="model_interface"):
        wants_agentscope(plain, "langchain")
    with pytest.raises(ConfigError, match=r"model_interface: must be one of reinforge, agentscope.*'agentscope'\?"):
        RunConfig(workflow=plain, model_interface="agentscop")
    assert RunConfig(workflow=plain, model_interface="agentscope").model_interface == "agentscope"


@pytest.fixture
def no_agentscope(forget_agentscope):
    """AgentScope cannot be imported, whether or not it is installed."""
    sys.modules["agentscope"] = None
    sys.modules["agentscope.model"] = None


class EndpointModel:
    """A ChatModel that exposes an OpenAI-compatible endpoint, like the local backend's policy model."""

    base_url = "http://127.0.0.1:9/rollouts/r0/v1"
    model_name = "policy"
    api_key = "reinforge-local"

    def __init__(self):
        self.released = 0

    async def chat(self, messages, tools=None, **sampling):
        raise AssertionError("an AgentScope workflow talks to the endpoint, not to chat()")

    def release(self):
        self.released += 1


def test_without_agentscope_the_adapter_names_the_extra(no_agentscope):
    with pytest.raises(MissingExtraError, match=r"pip install 'reinforge\[agentscope\]'"):
        agentscope_chat_model(EndpointModel())
    with pytest.raises(MissingExtraError, match=r"reinforge\[agentscope\]"):
        agentscope_adapter({"max_tokens": 8})


def test_without_agentscope_an_agentscope_workflow_fails_before_any_model_loads(no_agentscope):
    pm = get_plugin_manager(load_entrypoints=False)
    with pytest.raises(MissingExtraError, match=r"reinforge\[agentscope\]"):
        build_job(RunConfig(workflow=by_class), pm)
    with pytest.raises(MissingExtraError, match=r"reinforge\[agentscope\]"):
        build_job(RunConfig(workflow=plain, model_interface="agentscope"), pm)
    build_job(RunConfig(workflow=by_class, model_interface="reinforge"), pm)  # opted out: no AgentScope needed


def test_an_installed_agentscope_that_does_not_import_says_so(forget_agentscope, monkeypatch, tmp_path):
    (tmp_path / "agentscope").mkdir()
    (tmp_path / "agentscope" / "__init__.py").write_text(
        "raise ImportError(\"cannot import name 'streamablehttp_client' from 'mcp.client.streamable_http'\")\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingExtraError, match=r"installed but does not import .*streamablehttp_client.*agentscope\]"):
        agentscope_chat_model(EndpointModel())


FAKE_AGENTSCOPE_MODEL = """
class ChatModelBase:
    def __init__(self, model_name, stream):
        self.model_name, self.stream = model_name, stream


class OpenAIChatModel(ChatModelBase):
    def __init__(self, model_name, api_key=None, stream=True, client_kwargs=None, generate_kwargs=None, **kwargs):
        super().__init__(model_name, stream)
        self.api_key, self.client_kwargs, self.generate_kwargs = api_key, client_kwargs, generate_kwargs
        self.client = "an openai.AsyncClient"

    async def __call__(self, messages, tools=None, **kwargs):
        # what AgentScope 1.x's model sends (tools already in OpenAI's format here)
        request = {"model": self.model_name, "messages": messages, "stream": self.stream, **self.generate_kwargs}
        if tools:
            request["tools"] = tools
        return await self.client.chat.completions.create(**request, **kwargs)
"""


@pytest.fixture
def fake_agentscope(forget_agentscope, monkeypatch, tmp_path):
    """A stand-in ``agentscope.model`` with the constructor signature of AgentScope 1.x's OpenAIChatModel."""
    (tmp_path / "agentscope").mkdir()
    (tmp_path / "agentscope" / "__init__.py").write_text("")
    (tmp_path / "agentscope" / "model.py").write_text(FAKE_AGENTSCOPE_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    import agentscope.model

    return agentscope.model


def test_the_adapter_binds_an_openai_chat_model_to_the_endpoint(fake_agentscope):
    model = agentscope_chat_model(EndpointModel(), {"max_tokens": 8, "temperature": 0.5, "top_p": 1.0, "bogus": 1})
    assert isinstance(model, fake_agentscope.OpenAIChatModel)
    assert model.client_kwargs == {"base_url": "http://127.0.0.1:9/rollouts/r0/v1"}
    assert (model.model_name, model.api_key, model.stream) == ("policy", "reinforge-local", False)
    assert model.generate_kwargs == {"max_tokens": 8, "temperature": 0.5, "top_p": 1.0}


def test_make_runner_hands_the_workflow_an_agentscope_model_and_still_releases_the_policy_model(fake_agentscope):
    async def tutorial_like(task, model: fake_agentscope.ChatModelBase):
        return WorkflowOutput(response=model)

    def judge(task, response):
        return JudgeOutput(reward=1.0)

    run = RunConfig(workflow=tutorial_like, judges=[judge], model={"model_path": "policy", "max_tokens": 8})
    job = build_job(run, get_plugin_manager(load_entrypoints=False))
    given = []

    def provider(trajectory):
        given.append(EndpointModel())
        return RecordingChatModel(given[-1], trajectory)

    result = job.make_runner(model_provider=provider, group_size=2).run([{"question": "1 + 1?"}])
    responses = [t.response for t in result.trajectories]
    assert len(responses) == 2 and all(isinstance(r, fake_agentscope.OpenAIChatModel) for r in responses)
    assert responses[0].generate_kwargs == {"temperature": 1.0, "top_p": 1.0, "max_tokens": 8}
    assert [m.released for m in given] == [1, 1]  # the runner released each rollout's own model

    plain_job = build_job(
        RunConfig(workflow=tutorial_like, judges=[judge], model_interface="reinforge"),
        get_plugin_manager(load_entrypoints=False),
    )
    (t,) = plain_job.make_runner(model_provider=provider, group_size=1).run([{"question": "?"}]).trajectories
    assert isinstance(t.response, RecordingChatModel)  # opted out: the plain ChatModel


def test_a_failing_adapter_still_releases_the_rollout_model():
    released = []

    class Model(EndpointModel):
        def release(self):
            released.append(True)

    def adapter(model):
        raise ReinforgeError("adapter says no")

    runner = Runner(
        bind(by_class, "workflow"), RewardComposer([]), model_provider=lambda t: Model(), model_adapter=adapter
    )
    with pytest.raises(ReinforgeError, match="adapter says no"):
        runner.run([{}])
    assert released == [True]


TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]


def test_a_model_without_an_endpoint_is_reached_through_its_chat_and_recorded(fake_agentscope):
    reply = ChatResponse(
        message={
            "role": "assistant",
            "content": "Let me add.",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}],
        },
        finish_reason="tool_calls",
        usage={"prompt_tokens": 7, "completion_tokens": 3},
    )
    scripted = ScriptedChatModel(
        [reply, ChatResponse(message={"role": "assistant", "content": "2"}, finish_reason="eos")]
    )
    trajectory = Trajectory(task={})
    model = agentscope_chat_model(RecordingChatModel(scripted, trajectory), {"max_tokens": 8, "temperature": 0.5})
    assert isinstance(model.client, ChatModelClient) and model.client_kwargs == {}
    assert (model.model_name, model.api_key, model.stream) == ("scripted", "sk-none", False)

    first = asyncio.run(model([{"role": "user", "content": "1 + 1?"}], tools=TOOLS, tool_choice="auto"))
    assert first.choices[0].message.content == "Let me add." and first.choices[0].finish_reason == "tool_calls"
    (call,) = first.choices[0].message.tool_calls
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == ("c1", "add", {"a": 1})
    assert (first.usage.prompt_tokens, first.usage.completion_tokens, first.usage.total_tokens) == (7, 3, 10)
    second = asyncio.run(model([{"role": "user", "content": "so?"}], top_p=0.9))
    assert second.choices[0].message.content == "2" and second.choices[0].message.tool_calls is None
    assert second.choices[0].finish_reason == "stop"  # a reason OpenAI's type does not know reads as stop

    # both calls reached the ChatModel with the sampling keys, and the trajectory recorded them
    assert [c.tools for c in scripted.calls] == [TOOLS, None]
    assert scripted.calls[0].sampling == {"max_tokens": 8, "temperature": 0.5, "tool_choice": "auto"}
    assert scripted.calls[1].sampling == {"max_tokens": 8, "temperature": 0.5, "top_p": 0.9}
    assert [c.messages[-1]["content"] for c in trajectory.calls] == ["1 + 1?", "so?"]
    assert trajectory.calls[0].response is reply


def test_the_client_refuses_streaming_and_structured_output_clearly(fake_agentscope):
    client = ChatModelClient(ScriptedChatModel(["x"]))
    with pytest.raises(ReinforgeError, match="stream=False"):
        asyncio.run(client.chat.completions.create(messages=[], stream=True))
    with pytest.raises(ReinforgeError, match="messages must be a list, got str"):
        asyncio.run(client.chat.completions.create(messages="hi"))
    with pytest.raises(ReinforgeError, match="response_format"):
        asyncio.run(client.chat.completions.parse(messages=[]))


def test_an_agentscope_workflow_runs_on_a_model_without_endpoint(fake_agentscope):
    async def tutorial_like(task, model: fake_agentscope.ChatModelBase):
        completion = await model([{"role": "user", "content": task["question"]}])
        return WorkflowOutput(response=completion.choices[0].message.content, reward=1.0)

    scripted = ScriptedChatModel(["2"])
    runner = Runner(
        bind(tutorial_like, "workflow"),
        RewardComposer([]),
        model=scripted,
        model_adapter=agentscope_chat_model,
    )
    (t,) = runner.run([{"question": "1 + 1?"}]).trajectories
    assert t.response == "2" and len(t.calls) == 1 and t.calls[0].messages == [{"role": "user", "content": "1 + 1?"}]
