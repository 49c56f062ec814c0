"""The README's Python example runs as written."""

import asyncio
import re
from pathlib import Path

from reinforge.testing import ScriptedChatModel

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_python_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (example,) = [b for b in blocks if "async def main" in b]
    namespace: dict = {}
    exec(compile(example, str(README), "exec"), namespace)
    model = ScriptedChatModel(
        [
            'Thought: I need the price.\nAction: lookup_price\nAction Input: {"item": "widget"}',
            "Action: calculator[17 * 23.5]",
            "Final Answer: 399.5",
        ]
    )
    asyncio.run(namespace["main"](model))
    out = capsys.readouterr().out
    assert "[user] Observation: 23.5" in out and "[user] Observation: 399.5" in out
    assert out.strip().endswith("399.5 2.0")
