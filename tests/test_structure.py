"""The house rules of ../shared/DESIGN.md that a machine can check: the loop stays short, no
function hides a helper past 60 lines, and ``grpokit.algo`` stays pure tensor math."""

import ast
from pathlib import Path

PKG = Path(__file__).parents[1] / "grpokit"
MAX_FUNCTION_LINES = 60  # from `def` to the end, without the docstring
MAX_TRAINER_LINES = 400


def _body_lines(fn: ast.FunctionDef) -> int:
    """Lines from ``def`` to the end (signature included), the docstring left out."""
    n = fn.end_lineno - fn.lineno + 1
    first = fn.body[0]
    if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant):
        if isinstance(first.value.value, str):
            n -= first.end_lineno - first.lineno + 1
    return n


def test_no_function_over_60_lines():
    long = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = _body_lines(node)
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PKG.parent)}:{node.name} {n} lines")
    assert not long, "split these into helpers:\n" + "\n".join(long)


def test_trainer_reads_in_one_sitting():
    n = len((PKG / "trainer.py").read_text().splitlines())
    assert n <= MAX_TRAINER_LINES, f"grpokit/trainer.py has {n} lines"


def test_algo_imports_torch_only():
    allowed = {"torch", "math", "__future__", "dataclasses", "typing", "collections", "importlib"}
    allowed |= {"grpokit"}  # its own modules only, checked below
    for path in sorted((PKG / "algo").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top in allowed, f"{path.name} imports {name}"
                if top == "grpokit":
                    assert name.startswith("grpokit.algo"), f"{path.name} imports {name}"
