"""The layout docs/contributing.md describes, held: every module has tests of its own
or is named by the test module that covers it, the contributor map lists every
module, no module uses another file's private names, and no two modules of
lox_core and lox_backends share a name."""

import ast
import re

from paths import REPO

PACKAGES = ("lox", "lox_core", "lox_backends")
MODULES = sorted(p.relative_to(REPO) for package in PACKAGES for p in (REPO / package).rglob("*.py"))
TESTS = sorted((REPO / "tests").rglob("test_*.py"))


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_every_module_has_tests_of_its_own_or_is_named_by_the_test_module_that_covers_it():
    named = "\n".join(ast.get_docstring(ast.parse(t.read_text())) or "" for t in TESTS)
    untested = [
        str(module) for module in MODULES
        if module.name != "__init__.py"
        and not (REPO / "tests" / module.parent / f"test_{module.stem}.py").exists()
        and str(module) not in named
    ]
    assert untested == [], (
        f"{untested} have no tests/<package>/test_<module>.py, and no test module's docstring names them: "
        "write one, or name the module in the docstring of the test module that covers it."
    )


def test_the_contributor_map_lists_every_module():
    page = (REPO / "docs" / "contributing.md").read_text()
    mapped = set(re.findall(r"`((?:lox|lox_core|lox_backends)/[\w/]+\.py)`", page))
    missing = [str(m) for m in MODULES if m.name != "__init__.py" and str(m) not in mapped]
    assert missing == [], f"docs/contributing.md's map does not list {missing}"
    gone = mapped - {str(m) for m in MODULES}
    assert gone == set(), f"the map lists modules that do not exist: {gone}"


def test_no_module_uses_another_files_private_names():
    trees = {m: ast.parse((REPO / m).read_text()) for m in MODULES}
    defined = {}
    for module, tree in trees.items():
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
        defined[module] = {n for n in names if private(n)}
    reaches = []
    for module, tree in trees.items():
        elsewhere = set().union(*(names for other, names in defined.items() if other != module)) - defined[module]
        package = module.parts[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                for alias in node.names:
                    # a package's private module (`_compat`) is shared inside its package, not beyond
                    inside = node.module == package and (REPO / package / f"{alias.name}.py").exists()
                    if private(alias.name) and not inside:
                        reaches.append(f"{module}:{node.lineno}: from {node.module} import {alias.name}")
            elif isinstance(node, ast.Attribute) and private(node.attr) and node.attr in elsewhere:
                reaches.append(f"{module}:{node.lineno}: .{node.attr}")
    assert reaches == [], "private names used outside their file:\n" + "\n".join(reaches)


def test_no_two_modules_of_lox_core_and_lox_backends_share_a_name():
    by_name: dict[str, list[str]] = {}
    for module in MODULES:
        if module.parts[0] != "lox" and module.name != "__init__.py":
            by_name.setdefault(module.stem.lstrip("_"), []).append(str(module))
    assert {name: found for name, found in by_name.items() if len(found) > 1} == {}


def test_folders_of_tests_mirror_the_packages():
    folders = {p.relative_to(REPO / "tests") for p in (REPO / "tests").rglob("test_*.py")}
    outside = [str(f) for f in folders
               if f.parts[0] not in (*PACKAGES, "docs", "frameworks") and len(f.parts) > 1]
    assert outside == []
    mirrored = [f.parent for f in folders if f.parts[0] in PACKAGES]
    assert all((REPO / folder).is_dir() for folder in mirrored), [str(f) for f in mirrored if not (REPO / f).is_dir()]

