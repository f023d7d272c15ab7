"""Long functions stay rare: a function over 50 lines usually does several things that deserve names
(issue 47's target: at most 1.5 % of the package's functions, and none in ``driver/``, which should read
like verl's ``fit``). Counted from the source with ``ast``, nothing imported."""

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "verl_digen"
MAX_LINES = 50  # a function longer than this is "long" (def line to last line, docstring included)
MAX_SHARE = 0.015  # of all functions and methods in the package
NONE_LONG = ("driver",)  # subpackages with no long function at all


def _defs(node: ast.AST):
    """Every def and async def under ``node``: they are statements, so only statement lists are walked
    (a full ``ast.walk`` costs several times the parse)."""
    for name in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, name, None) or ():
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield child
            yield from _defs(child)


@functools.cache
def _functions() -> list[tuple[str, str, int]]:
    """(path relative to the package, name, lines) of every function and method of the package, parsed once."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in _defs(ast.parse(path.read_text(), filename=str(path))):
            out.append((path.relative_to(PACKAGE).as_posix(), node.name, node.end_lineno - node.lineno + 1))
    return out


def _long(functions: list[tuple[str, str, int]]) -> list[str]:
    return sorted(f"{path}:{name} ({n} lines)" for path, name, n in functions if n > MAX_LINES)


def test_long_functions_are_rare():
    functions = _functions()
    assert len(functions) > 1000, "the scan found too few functions: is PACKAGE the package?"
    long = _long(functions)
    share = len(long) / len(functions)
    assert share <= MAX_SHARE, (
        f"{len(long)} of {len(functions)} functions ({share:.2%}) are over {MAX_LINES} lines, above "
        f"{MAX_SHARE:.1%}; split one by meaning (named helpers):\n" + "\n".join(long))


def test_no_long_function_in_the_driver():
    for sub in NONE_LONG:
        functions = [f for f in _functions() if f[0].startswith(sub + "/")]
        assert functions, f"verl_digen/{sub} has no function: moved?"
        long = _long(functions)
        assert not long, f"verl_digen/{sub} must have no function over {MAX_LINES} lines:\n" + "\n".join(long)
