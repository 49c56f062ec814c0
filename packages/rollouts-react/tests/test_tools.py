"""@tool: schemas from type hints and docstrings, argument checks, sync/async calls and timeouts."""

import asyncio
import enum
from typing import Annotated, Literal

import pytest

from reinforge_rollouts_react import Tool, ToolArgumentError, ToolDefinitionError, ToolTimeoutError, tool
from reinforge_rollouts_react.docstrings import parse_docstring


class Unit(enum.Enum):
    CELSIUS = "c"
    FAHRENHEIT = "f"


@tool
def forecast(city: str, days: int = 3, unit: Unit = Unit.CELSIUS, hourly: bool = False) -> dict:
    """Weather forecast for a city.

    Uses the cached data only; never the network.

    Args:
        city: The city name, e.g. "Paris".
        days (int): How many days ahead,
            from 1 to 7.
        unit: Temperature unit.

    Returns:
        The forecast.
    """
    return {"city": city, "days": days, "unit": unit, "hourly": hourly}


def test_google_docstring_and_type_hints_make_the_openai_schema():
    assert isinstance(forecast, Tool)
    assert forecast("Oslo", days=1)["city"] == "Oslo"  # still callable as the function
    assert forecast.schema() == {
        "type": "function",
        "function": {
            "name": "forecast",
            "description": "Weather forecast for a city.\n\nUses the cached data only; never the network.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": 'The city name, e.g. "Paris".'},
                    "days": {"type": "integer", "description": "How many days ahead, from 1 to 7.", "default": 3},
                    "unit": {"enum": ["c", "f"], "description": "Temperature unit."},
                    "hourly": {"type": "boolean", "default": False},
                },
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }


def test_numpy_and_sphinx_docstrings():
    def numpy_style(values: list[float], mode: Literal["mean", "max"] = "mean") -> float:
        """Summarize numbers.

        Parameters
        ----------
        values : list of float
            The numbers to
            summarize.
        mode : str
            Which statistic.

        Returns
        -------
        float
        """
        return 0.0

    def sphinx_style(path: str, limit: int | None = None, **options: str) -> str:
        """Read part of a file.

        :param path: Where the file is.
        :param int limit: Read at most this many bytes.
        :returns: the text.
        """
        return ""

    n = tool(numpy_style).parameters["properties"]
    assert n["values"] == {"type": "array", "items": {"type": "number"}, "description": "The numbers to summarize."}
    assert n["mode"] == {
        "enum": ["mean", "max"],
        "type": "string",
        "description": "Which statistic.",
        "default": "mean",
    }
    assert tool(numpy_style).description == "Summarize numbers."

    s = tool(sphinx_style)
    assert s.parameters["properties"]["limit"] == {
        "type": "integer",
        "description": "Read at most this many bytes.",
        "default": None,
    }
    assert s.required == ["path"] and "additionalProperties" not in s.parameters  # **options: extra keys allowed
    assert s.description == "Read part of a file."


def test_annotated_descriptions_names_and_unions():
    @tool(name="lookup-v2", description="Find things.", timeout=2)
    def lookup(query: Annotated[str, "What to look for."], key: int | str = 0, tags: dict[str, int] | None = None):
        return query

    assert lookup.name == "lookup-v2" and lookup.description == "Find things." and lookup.timeout == 2
    props = lookup.parameters["properties"]
    assert props["query"] == {"type": "string", "description": "What to look for."}
    assert props["key"]["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert props["tags"] == {"type": "object", "additionalProperties": {"type": "integer"}, "default": None}


def test_definition_errors_name_the_function_and_argument():
    class Point:
        pass

    def bad_type(p: Point) -> str:
        return ""

    with pytest.raises(ToolDefinitionError, match=r"tool .*bad_type: argument 'p' has type .*Point"):
        tool(bad_type)

    def star(*items: str) -> str:
        return ""

    with pytest.raises(ToolDefinitionError, match=r"star: \*items cannot be described"):
        tool(star)

    def typo(text: str) -> str:
        """Count.

        Args:
            txt: The text.
        """
        return text

    with pytest.raises(ToolDefinitionError, match=r"typo: the docstring describes \['txt'\]"):
        tool(typo)
    with pytest.raises(ToolDefinitionError, match=r"tool name 'has space' .*must be 1-64 letters"):
        tool(lambda x: x, name="has space")


def test_arguments_are_checked_and_coerced_for_the_model():
    assert forecast.arguments({"city": "Oslo", "days": "5", "hourly": "true"}) == {
        "city": "Oslo",
        "days": 5,
        "hourly": True,
    }
    assert forecast.arguments("Oslo") == {"city": "Oslo"}  # one required argument: a bare value is it
    assert forecast.arguments({"city": 7}) == {"city": "7"}
    assert forecast.arguments({"city": "Oslo", "days": 2.0}) == {"city": "Oslo", "days": 2}
    cases = [
        ({"days": 2}, "needs argument 'city'"),
        ({"city": "Oslo", "weeks": 2}, "has no argument 'weeks'; its arguments are: city, days, unit, hourly"),
        ({"city": "Oslo", "days": "soon"}, "argument 'days' must be an integer"),
        ({"city": "Oslo", "unit": "kelvin"}, "argument 'unit' must be one of ['c', 'f']"),
        ({"city": "Oslo", "hourly": "maybe"}, "argument 'hourly' must be true or false"),
    ]
    for raw, message in cases:
        with pytest.raises(ToolArgumentError) as info:
            forecast.arguments(raw)
        assert message in str(info.value)

    @tool
    def pair(a: int, b: int) -> int:
        return a + b

    with pytest.raises(ToolArgumentError, match="takes a, b; give the input as a JSON object"):
        pair.arguments("1, 2")


def test_sync_and_async_tools_run_and_async_ones_time_out():
    @tool
    async def echo(text: str) -> str:
        return text * 2

    @tool
    def shout(text: str) -> str:
        return text.upper()

    assert echo.is_async and not shout.is_async
    assert asyncio.run(echo.run({"text": "ab"})) == "abab"
    assert asyncio.run(shout.run({"text": "ab"}, timeout=5)) == "AB"

    @tool
    async def hang() -> str:
        await asyncio.Event().wait()  # never set
        return "never"

    with pytest.raises(ToolTimeoutError, match=r"tool 'hang' timed out after 0.01s"):
        asyncio.run(hang.run({}, timeout=0.01))
    assert hang.replace(timeout=0.02).timeout == 0.02 and hang.timeout is None


def test_docstring_parser_edge_cases():
    assert parse_docstring(None).description == ""
    parsed = parse_docstring("Only a summary line.")
    assert parsed.description == "Only a summary line." and parsed.params == {}
    parsed = parse_docstring(
        """Summary.

        Keyword Args:
            **flag**: Emphasized name.

        Raises:
            ValueError: never an argument.
        """
    )
    assert parsed.params == {"flag": "Emphasized name."}
