"""Safe evaluation of the coder's arithmetic subtasks (``48213 - 31002``, ``1743 < 1802``).

Used to write the gold answers and by the rule-based expert judge. Walks the ``ast`` and
allows only number literals, ``+ - * / // %``, unary minus, comparisons, and the calls
``abs``/``min``/``max``/``round``; powers are refused (``9**9**9`` would hang the judge).

What this module does not do: run arbitrary code (that is the sandbox's job).
"""

from __future__ import annotations

import ast
import operator

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_COMPARE = {ast.Gt: operator.gt, ast.Lt: operator.lt, ast.GtE: operator.ge,
            ast.LtE: operator.le, ast.Eq: operator.eq, ast.NotEq: operator.ne}
_CALLS = {"abs": abs, "min": min, "max": max, "round": round}
_MAX_ABS = 10**18  # keeps products of products from growing without bound


def _eval(node: ast.AST) -> int | float | bool:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        value = _BINARY[type(node.op)](_eval(node.left), _eval(node.right))
        if abs(value) > _MAX_ABS:
            raise ValueError(f"intermediate value {value} exceeds {_MAX_ABS}")
        return value
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        return _COMPARE[type(node.ops[0])](_eval(node.left), _eval(node.comparators[0]))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in _CALLS and not node.keywords):
        return _CALLS[node.func.id](*[_eval(a) for a in node.args])
    raise ValueError(f"unsupported syntax {type(node).__name__} in an arithmetic task; allowed: "
                     "numbers, + - * / // %, one comparison, abs/min/max/round")


def format_number(value: int | float | bool) -> str:
    """Canonical text: ``True``/``False``, integers plainly, integral floats as integers."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, float):
        return repr(round(value, 6))
    return str(value)


def evaluate_arithmetic(expression: str) -> str:
    """The canonical value of ``expression``; ValueError if it is not plain arithmetic."""
    if len(expression) > 500:
        raise ValueError(f"arithmetic task of {len(expression)} chars; at most 500 allowed")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r} ({exc.msg})") from None
    try:
        return format_number(_eval(tree.body))
    except (ZeroDivisionError, OverflowError, TypeError, RecursionError) as exc:
        raise ValueError(f"cannot evaluate {expression!r}: {exc}") from None
