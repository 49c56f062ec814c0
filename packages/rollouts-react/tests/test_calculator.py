"""The built-in calculator: arithmetic only, parsed with ast, never eval."""

import asyncio

import pytest

from reinforge_rollouts_react import calculator, evaluate_arithmetic
from reinforge_rollouts_react.calculator import CalculatorError


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("347 * 28", "9716"),
        ("141 + 365 + 623", "1129"),
        ("3407 - 417", "2990"),
        ("17 * 23.5", "399.5"),
        ("7 / 2", "3.5"),
        ("8 / 4", "2"),
        ("7 // 2", "3"),
        ("-(2 ** 10) % 7", str(-(2**10) % 7)),
        ("sqrt(16) + abs(-3) + max(1, 2) + min(4, 5) + round(2.6)", "16"),
        ("12 × 3 ÷ 4", "9"),
        ("2^8", "256"),
        ("`1 + 1 =`", "2"),
        ("1/3", "0.3333333333"),
    ],
)
def test_arithmetic(expression, value):
    assert evaluate_arithmetic(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('echo hi')", "Call is not allowed"),
        ("__import__('os')", "unknown function '__import__'; the functions are abs, round, min, max, sqrt"),
        ("(1).__class__", "Attribute is not allowed"),
        ("x + 1", "unknown name 'x'"),
        ("'a' * 3", "'a' is not a number"),
        ("True + 1", "True is not a number"),
        ("[1, 2]", "List is not allowed"),
        ("2 ** 1000", "exponents above 100"),
        ("99999999999 ** 99 * 99999999999 ** 99", "too large"),
        ("1 +", "cannot parse"),
        ("", "empty"),
        ("1+" * 150 + "1", "longer than 200"),
        ("abs(x=1)", "takes no keyword arguments"),
    ],
)
def test_anything_but_arithmetic_is_refused(expression, message):
    with pytest.raises(CalculatorError, match=message.replace("(", r"\(").replace("*", r"\*")):
        evaluate_arithmetic(expression)


def test_the_tool_schema_and_a_division_by_zero():
    assert calculator.name == "calculator" and calculator.required == ["expression"]
    assert "arithmetic" in calculator.description
    with pytest.raises(ZeroDivisionError):
        asyncio.run(calculator.run({"expression": "1 / 0"}))
