"""Built-in tools a recipe names directly: ``calculator`` (arithmetic, evaluated in
process from the expression's syntax tree, never ``eval``) and ``python`` (model-written
code, run in ``grpokit.sandbox`` with its limits)."""

from __future__ import annotations

import ast
import operator

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_POWER = 100  # a ** b with |b| above this is refused (9**9**9 would never finish)


def _value(node: ast.AST):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_POWER:
            raise ValueError(f"exponent {right} is too large (at most {MAX_POWER})")
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"only numbers and + - * / // % ** ( ) are allowed, not {ast.unparse(node)!r}")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: The expression, with numbers, + - * / // % ** and parentheses, e.g. "(12 + 3) * 4".
    """
    tree = ast.parse(str(expression).strip(), mode="eval")
    value = _value(tree.body)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return str(value)


def python(code: str) -> str:
    """Run a Python program and return what it printed.

    Args:
        code: The program's source code; print the values you want to see.
    """
    from grpokit.sandbox import run_python

    r = run_python(code, timeout=5.0, memory_mb=512, max_output_bytes=20_000)
    out = r.stdout
    if r.returncode != 0 or r.killed_reason:
        why = r.killed_reason or f"exit status {r.returncode}"
        out += f"\n[stopped: {why}]\n{r.stderr[-2000:]}"
    return out[-4000:]


BUILTIN_TOOLS = {"calculator": calculator, "python": python}
