"""Getting the text out of whatever a workflow returned as its response."""

from __future__ import annotations

from typing import Any


def response_text(response: Any) -> str:
    """Best-effort text of a response: str, ChatResponse, AgentScope Msg, message dicts."""
    if response is None:
        return ""
    if isinstance(response, str):
        return response
    getter = getattr(response, "get_text_content", None)
    if callable(getter):
        return getter() or ""
    if isinstance(response, dict):
        if "messages" in response:
            return response_text(response["messages"])
        content = response.get("content")
        if isinstance(content, list):  # OpenAI content parts
            return "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return "" if content is None else str(content)
    if isinstance(response, list):
        for item in reversed(response):
            if isinstance(item, dict) and item.get("role") == "assistant":
                return response_text(item)
        return ""
    return str(response)
