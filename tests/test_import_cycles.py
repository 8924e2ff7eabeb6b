"""The import graph of lox, lox_core and lox_backends has no cycle, counting the
imports inside functions too (a lazy import is still a dependency: `logdict.to_arrow`
calls `lox_core/arrow_codec.py`, which does not import the logdict, while
`lox_core/arrow.py` imports both), the packages import only downwards (lox ->
lox_backends -> lox_core), and modules import lox's modules at their top, where a
reader sees them. Read from the source with `ast`, without importing anything.
Imports under ``if TYPE_CHECKING:`` are left out: they are never executed."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("lox", "lox_backends", "lox_core")  # each imports only those after it


def _modules() -> dict[str, ast.Module]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = ast.parse(path.read_text(encoding="utf-8"))
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes inside ``if TYPE_CHECKING:`` blocks."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    return skipped


def _imports(tree: ast.Module, modules: set[str]) -> set[str]:
    """The project modules `tree` imports anywhere (module level or in functions):
    ``from pkg import module`` names the module; ``from module import name`` and
    ``from pkg import name`` name the module (or package) that holds `name`."""
    skipped = _type_checking_only(tree)
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in modules:
                    found.add(submodule)
                elif node.module in modules:
                    found.add(node.module)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` (its modules in order, the first one again at the end), or None."""
    state: dict[str, str] = {}
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = "open"
        while stack:
            dep = next(stack[-1], None)
            if dep is None:
                state[path.pop()] = "done"
                stack.pop()
            elif state.get(dep) == "open":
                return path[path.index(dep):] + [dep]
            elif dep not in state:
                state[dep] = "open"
                path.append(dep)
                stack.append(iter(sorted(graph[dep])))
    return None


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(tree, set(modules)) - {name} for name, tree in modules.items()}


def test_lox_lox_core_and_lox_backends_import_each_other_without_a_cycle_even_inside_functions():
    graph = _graph()
    # The walk sees real edges, module-level and inside functions, and leaves out type-only ones.
    assert "lox_core.logdict" in graph["lox_core.arrow"]
    assert "lox_core.arrow_codec" in graph["lox_core.logdict"]  # in `to_arrow` and `from_arrow`
    assert "lox_core.logdict" not in graph["lox_core.arrow_codec"]  # under TYPE_CHECKING only
    assert "lox_core.runtime" in graph["lox_backends.logger.processes"]
    cycle = _cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle or [])}"


def test_each_package_imports_only_the_packages_below_it():
    below = {package: PACKAGES[i:] for i, package in enumerate(PACKAGES)}
    upward = sorted(f"{module} imports {dep}" for module, deps in _graph().items() for dep in deps
                    if dep.split(".")[0] not in below[module.split(".")[0]])
    assert upward == []


def test_modules_import_lox_modules_at_their_top():
    """But for what loads on first use: `logdict.to_arrow`/`from_arrow` (pyarrow only when
    asked for) and a module's own `__getattr__` (`lox.loggers`, `lox.load`...)."""
    modules = _modules()
    inside_functions = {}
    for name, tree in modules.items():
        if name == "lox_core.logdict":
            continue
        lazy = {id(n) for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "__getattr__"
                for n in ast.walk(f)}
        functions = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        nested = ast.Module(body=[n for f in functions if id(f) not in lazy for n in f.body], type_ignores=[])
        found = _imports(nested, set(modules))
        if found:
            inside_functions[name] = found
    assert inside_functions == {}


@pytest.mark.parametrize(
    "graph, cycle",
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b"}, "b": {"a"}}, ["a", "b", "a"]),
        ({"a": {"b"}, "b": {"c"}, "c": {"b"}}, ["b", "c", "b"]),
        ({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}, None),  # a diamond is no cycle
    ],
)
def test_the_cycle_finder_finds_cycles_and_only_cycles(graph, cycle):
    assert _cycle(graph) == cycle


def test_an_import_inside_a_function_is_an_edge_and_one_under_type_checking_is_not():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "from lox_core import x\n"
        "if TYPE_CHECKING:\n    from lox_core.y import Y\n"
        "def f():\n    from lox_core.z import g\n    import lox_core.w\n"
    )
    found = _imports(tree, {"lox_core", "lox_core.x", "lox_core.y", "lox_core.z", "lox_core.w"})
    assert found == {"lox_core.x", "lox_core.z", "lox_core.w"}
