"""A safe calculator tool: arithmetic parsed with :mod:`ast`, never ``eval``.

Only numbers, ``+ - * / // % **``, parentheses and a few functions (``abs``,
``round``, ``min``, ``max``, ``sqrt``) are accepted; names, attributes, calls
of anything else and oversized numbers are refused with an error the model
reads as its observation.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from .tools import tool

__all__ = ["CalculatorError", "calculator", "evaluate_arithmetic"]

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 100
MAX_INT_BITS = 1024

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt}
# what people (and small models) write for * / ** and the marks around an expression
_SPELLINGS = {"×": "*", "·": "*", "÷": "/", "^": "**", "−": "-"}


class CalculatorError(ValueError):
    """The expression is not arithmetic the calculator accepts."""


def _check_size(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalculatorError("the result is too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is not a finite number")
    return value


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise CalculatorError(f"{node.value!r} is not a number")
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponents above {MAX_EXPONENT} are not supported")
        return _check_size(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        if node.keywords:
            raise CalculatorError(f"{node.func.id}() takes no keyword arguments")
        return _check_size(_FUNCTIONS[node.func.id](*(_eval(a) for a in node.args)))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        raise CalculatorError(f"unknown function {node.func.id!r}; the functions are {', '.join(_FUNCTIONS)}")
    if isinstance(node, ast.Name):
        raise CalculatorError(f"unknown name {node.id!r}; only numbers and {', '.join(_FUNCTIONS)} are allowed")
    raise CalculatorError(f"{type(node).__name__} is not allowed; use numbers, + - * / // % ** and parentheses")


def _format(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return format(value, ".10g")
    return str(value)


def evaluate_arithmetic(expression: str) -> str:
    """The value of ``expression`` as text; raises :class:`CalculatorError` or :class:`ZeroDivisionError`."""
    text = str(expression).strip().strip("`").strip()
    for written, meant in _SPELLINGS.items():
        text = text.replace(written, meant)
    text = text.rstrip("=? ").strip()
    if not text:
        raise CalculatorError("the expression is empty")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot parse {text!r} as arithmetic") from None
    return _format(_eval(tree))


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: The arithmetic to compute, e.g. "127 * 48 + 3". Supports + - * / // % ** and parentheses.
    """
    return evaluate_arithmetic(expression)
