"""Pytest fixtures of the reinforge testing kit.

Loaded by ``-p reinforge.testing`` / ``pytest_plugins = ["reinforge.testing"]``;
never auto-registered, so installing reinforge does not change anyone's test run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pluggy
import pytest

from . import HookRecorder
from .openai_server import OpenAIServer, Responder
from .scripted import ScriptedChatModel

__all__ = ["hook_recorder", "openai_server", "reinforge_pm", "scripted_model"]


@pytest.fixture
def reinforge_pm() -> pluggy.PluginManager:
    """A fresh plugin manager with only core's default plugin: no entry-point autoload."""
    from ..plugins import get_plugin_manager

    return get_plugin_manager(load_entrypoints=False)


@pytest.fixture
def hook_recorder(reinforge_pm: pluggy.PluginManager) -> Iterator[HookRecorder]:
    """Records every hook call made through ``reinforge_pm`` (``hook_recorder.pm``)."""
    recorder = HookRecorder.attach(reinforge_pm)
    yield recorder
    recorder.detach()


@pytest.fixture
def scripted_model() -> Callable[..., ScriptedChatModel]:
    """Factory: ``scripted_model(["reply 1", {"tool_calls": [...]}, ...], **options)``."""
    return ScriptedChatModel


@pytest.fixture
def openai_server() -> Iterator[Callable[..., OpenAIServer]]:
    """Factory: ``openai_server(responder, **options)`` returns a started server, stopped at teardown."""
    servers: list[OpenAIServer] = []

    def start(responder: Responder, **options: Any) -> OpenAIServer:
        server = OpenAIServer(responder, **options).start()
        servers.append(server)
        return server

    yield start
    for server in reversed(servers):
        server.stop()
