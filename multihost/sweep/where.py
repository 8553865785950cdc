"""The sweep's ``--where`` filter: parsed once, checked against a whitelist, evaluated safely.

The expression is Python syntax over the grid names; only constants, names, arithmetic, not,
and/or and comparisons are allowed, with limits on nesting, exponents and result size, so a
filter can neither run code nor exhaust memory. Pure.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from multihost.errors import UsageError

Value = int | float | str

MAX_WHERE_CHARS = 1000
_MAX_DEPTH = 100  # keeps the recursive walkers far from Python's recursion limit
_MAX_BITS = 4096  # largest int a --where step may produce
_MAX_EXPONENT = 64


class _Refused(Exception):
    """A --where step this evaluator will not do (too large, wrong types)."""


def _num(value: object, symbol: str) -> int | float:
    if not isinstance(value, int | float):
        raise _Refused(f"{symbol} needs numbers, got {value!r}")
    return value


def _pow(base: int | float, exp: int | float) -> int | float:
    if abs(exp) > _MAX_EXPONENT:
        raise _Refused(f"exponent {exp} is larger than {_MAX_EXPONENT}")
    if isinstance(base, int) and isinstance(exp, int) and abs(base).bit_length() * exp > _MAX_BITS:
        raise _Refused("result too large")
    result = base**exp
    if not isinstance(result, int | float):
        raise _Refused("complex result")
    return result


_BINOPS: dict[type[ast.operator], tuple[str, Callable[[Any, Any], Any]]] = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv),
    ast.FloorDiv: ("//", operator.floordiv),
    ast.Mod: ("%", operator.mod),
    ast.Pow: ("**", _pow),
}
_UNARY: dict[type[ast.unaryop], str] = {ast.UAdd: "+", ast.USub: "-", ast.Not: "not"}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
# The whole whitelist: a node of any other type (operators included) is refused.
_ALLOWED = (
    ast.Constant,
    ast.Name,
    ast.Load,
    ast.UnaryOp,
    ast.BinOp,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.Compare,
    *_BINOPS,
    *_UNARY,
    *_COMPARE,
)
_WHAT = {  # how a refused node is named; others show their lowercased class name
    "Call": "function calls",
    "Attribute": "attribute access",
    "Subscript": "subscripts",
    "NamedExpr": ":=",
    "JoinedStr": "f-strings",
    "IfExp": "if/else",
    "ListComp": "comprehensions",
    "SetComp": "comprehensions",
    "DictComp": "comprehensions",
    "GeneratorExp": "comprehensions",
    "BitAnd": "&",
    "BitOr": "|",
    "BitXor": "^",
    "LShift": "<<",
    "RShift": ">>",
    "MatMult": "@",
    "Invert": "~",
    "Is": "is",
    "IsNot": "is not",
    "In": "in",
    "NotIn": "not in",
}


def _check(node: ast.AST, names: Sequence[str], depth: int = 0) -> None:
    """Walk a parsed --where and refuse anything outside the whitelist."""
    if depth > _MAX_DEPTH:
        raise UsageError("--where is nested too deeply")
    if not isinstance(node, _ALLOWED):
        kind = type(node).__name__
        raise UsageError(f"not allowed in --where: {_WHAT.get(kind, kind.lower())}")
    if isinstance(node, ast.Constant) and not isinstance(node.value, int | float | str):
        raise UsageError(f"not allowed in --where: the constant {node.value!r}")  # None, 1j...
    if isinstance(node, ast.Name) and node.id not in names:
        raise UsageError(f"--where: unknown name {node.id!r} (grid names: {', '.join(names)})")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        exp = node.right.value if isinstance(node.right, ast.Constant) else 0
        if isinstance(exp, int | float) and abs(exp) > _MAX_EXPONENT:  # refuse before running
            raise UsageError(f"--where: exponent {exp} is larger than {_MAX_EXPONENT}")
    for kid in ast.iter_child_nodes(node):
        _check(kid, names, depth + 1)


def _eval(node: ast.expr, env: Mapping[str, Value]) -> Any:
    """Evaluate a checked --where node; Python semantics, numbers only for arithmetic."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, env)
        if isinstance(node.op, ast.Not):
            return not value
        number = _num(value, _UNARY[type(node.op)])
        return -number if isinstance(node.op, ast.USub) else +number
    if isinstance(node, ast.BinOp):
        symbol, fn = _BINOPS[type(node.op)]
        result = fn(_num(_eval(node.left, env), symbol), _num(_eval(node.right, env), symbol))
        if isinstance(result, int) and result.bit_length() > _MAX_BITS:
            raise _Refused("result too large")
        return result
    if isinstance(node, ast.BoolOp):
        is_and = isinstance(node.op, ast.And)
        for sub in node.values:
            value = _eval(sub, env)
            if bool(value) != is_and:  # short-circuit like Python's and/or
                return value
        return value
    assert isinstance(node, ast.Compare)
    left = _eval(node.left, env)
    for op, comparator in zip(node.ops, node.comparators, strict=True):
        right = _eval(comparator, env)
        if not _COMPARE[type(op)](left, right):
            return False
        left = right
    return True


@dataclass(frozen=True)
class Where:
    """A ``--where`` filter, parsed and checked once, evaluated by walking its AST."""

    text: str
    names: tuple[str, ...]
    tree: ast.Expression = field(repr=False, compare=False)

    @classmethod
    def compile(cls, text: str, names: Sequence[str]) -> Where:
        """Parse and check ``text`` against the grid names; UsageError if not allowed."""
        if len(text) > MAX_WHERE_CHARS:
            raise UsageError(f"--where is longer than {MAX_WHERE_CHARS} characters")
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as exc:
            raise UsageError(f"--where {text!r}: invalid syntax ({exc.msg})") from None
        except (RecursionError, MemoryError):
            raise UsageError("--where is nested too deeply") from None
        _check(tree.body, tuple(names))
        return cls(text, tuple(names), tree)

    def matches(self, values: Mapping[str, Value]) -> bool:
        """Whether a point passes; an error evaluating it is a UsageError naming the point."""
        try:
            return bool(_eval(self.tree.body, values))
        except (_Refused, TypeError, ArithmeticError, ValueError) as exc:
            point = " ".join(f"{k}={v}" for k, v in values.items())
            why = str(exc) or type(exc).__name__
            raise UsageError(f"--where {self.text!r} fails for {point}: {why}") from None
