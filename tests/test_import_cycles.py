"""The package's modules import each other without a cycle (docs/architecture.md, "Dependency direction"): every
import counts, lazy ones inside functions too, since a cycle hidden in a function is still two modules that
cannot be understood (or moved) apart. A package's ``__init__`` is its face: importing a name from it counts as
importing the module that defines the name, when ``__init__`` re-exports it from one."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "verl_digen"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _reexports(init: str) -> dict[str, str]:
    """name -> the module a package's ``__init__`` takes it from."""
    out = {}
    for node in ast.walk(ast.parse(MODULES[init].read_text())):
        if isinstance(node, ast.ImportFrom):
            base = _absolute(init, node, is_package=True)
            for alias in node.names:
                target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                out[alias.asname or alias.name] = target
    return out


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    keep = len(parts) - node.level + (1 if is_package else 0)
    base = ".".join(parts[:keep])
    return f"{base}.{node.module}" if node.module else base


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    deps: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            deps.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node, is_package=path.name == "__init__.py")
            if base not in MODULES:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in MODULES:
                    deps.add(sub)
                elif MODULES[base].name == "__init__.py" and base != module:
                    deps.add(_reexports(base).get(alias.name, base))
                else:
                    deps.add(base)
    deps.discard(module)
    return deps


def test_no_module_of_the_package_imports_itself_back_through_others():
    graph = {m: _imports(m) for m in MODULES}
    assert len(graph) > 100 and graph["verl_digen.config.planning"]  # the walk saw the package
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[str] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycles.append(" -> ".join(path[path.index(d):] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


#: docs/architecture.md's "Dependency direction" as layers: a unit (a subpackage, or a top-level module) imports
#: only units of a lower layer, lazily inside a function too. Peers share a layer and never import each other.
LAYERS = (
    ("verl_digen", "registry", "defaults", "dtypes", "data", "compat"),  # the standard library only
    ("archs",),
    ("schedule", "models", "rewards"),
    ("algo",),
    ("rollout",),
    ("workers",),
    ("config",),
    ("reporting",),
    ("driver",),
    ("main", "cli"),
    ("integrations",),
    ("plugin",),
)
LAYER = {unit: n for n, units in enumerate(LAYERS) for unit in units}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_import_runs_down_the_layers():
    graph = {m: _imports(m) for m in MODULES}
    assert {_unit(m) for m in MODULES} == set(LAYER), "a unit of the package is missing from LAYERS, or gone"
    upward = [f"{m} -> {d}" for m, deps in sorted(graph.items()) for d in sorted(deps)
              if _unit(m) != _unit(d) and LAYER[_unit(d)] >= LAYER[_unit(m)]]
    assert not upward, "imports against docs/architecture.md's dependency direction:\n" + "\n".join(upward)
