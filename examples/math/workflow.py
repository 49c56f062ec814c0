"""The math workflow, written as in AgentScope's tuner tutorial (only the import differs)."""

from __future__ import annotations

from reinforge import ChatModel, WorkflowOutput

SYSTEM_PROMPT = "You are a careful calculator. Reply with just the number."


async def math_workflow(
    task: dict,
    model: ChatModel,
    auxiliary_models: dict[str, ChatModel] | None = None,
) -> WorkflowOutput:
    """Ask the model one question; the judges decide how good the answer is."""
    response = await model.chat(
        [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task["question"]},
        ]
    )
    return WorkflowOutput(response=response)
