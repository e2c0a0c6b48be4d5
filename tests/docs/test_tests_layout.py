"""The test tree's rules: test modules live in the folder of the code they test, no test module imports another
(or a conftest), every test module's basename is unique, and each fixture is defined once.

Shared plain code lives in ``tests/support`` (a package the tests import); shared fixtures live in the lowest
``conftest.py`` above all their users.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# Folders that hold no test modules of their own: plain code the tests import, and data files with their makers.
NOT_TEST_FOLDERS = ("support", "fixtures")


def _python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if p.relative_to(TESTS).parts[0] not in NOT_TEST_FOLDERS)


def _test_modules() -> list[Path]:
    return [p for p in _python_files() if p.name.startswith("test_")]


def _imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def _is_test_code(module: str) -> bool:
    """A test module or a conftest, by any name it can be imported under (``tests.x.test_y``, ``test_y``)."""
    last = module.split(".")[-1]
    return last == "conftest" or last.startswith("test_")


def _fixtures(path: Path) -> list[ast.FunctionDef]:
    def is_fixture(decorator: ast.expr) -> bool:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        return isinstance(target, ast.Attribute) and target.attr == "fixture"

    tree = ast.parse(path.read_text("utf-8"))
    return [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and any(is_fixture(d) for d in node.decorator_list)
    ]


def _without_docstring(node: ast.FunctionDef) -> str:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return ast.dump(ast.Module(body=body, type_ignores=[]))


def test_no_test_module_imports_another_or_a_conftest() -> None:
    found = [
        f"{path.relative_to(TESTS)}: imports {name}"
        for path in _python_files() + sorted((TESTS / "support").rglob("*.py"))
        for name in _imported_modules(path)
        if _is_test_code(name)
    ]
    assert not found, "move what is shared into tests/support (plain code) or a conftest (fixtures):\n" + "\n".join(
        found
    )


def test_every_test_module_has_a_unique_basename() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in _test_modules():
        by_name[path.name].append(str(path.relative_to(TESTS)))
    assert not {name: paths for name, paths in by_name.items() if len(paths) > 1}


def test_test_modules_live_in_a_folder_of_the_tree() -> None:
    """Only conftest.py sits at the root of tests/; test modules go in the folder of the code they test."""
    # The module-path aliases of earlier releases are tested in place until they are removed with their module.
    leftover = {"test_old_paths.py"}
    assert sorted(p.name for p in TESTS.glob("test_*.py") if p.name not in leftover) == []


def test_a_fixture_of_a_conftest_is_not_defined_again_below_it() -> None:
    conftests = {path: {f.name for f in _fixtures(path)} for path in TESTS.rglob("conftest.py")}
    found = [
        f"{path.relative_to(TESTS)}: {fixture.name} (also in {conftest.relative_to(TESTS)})"
        for path in _python_files()
        for fixture in _fixtures(path)
        for conftest, names in conftests.items()
        if conftest != path and conftest.parent in (path.parent, *path.parents) and fixture.name in names
    ]
    assert not found, "\n".join(found)


def test_no_two_fixtures_have_the_same_body() -> None:
    """A fixture copied into a second module is defined once, in the lowest conftest both modules share."""
    by_body: dict[str, list[str]] = defaultdict(list)
    for path in _python_files():
        for fixture in _fixtures(path):
            decorators = [ast.dump(d) for d in fixture.decorator_list]
            body = _without_docstring(fixture)
            by_body[f"{decorators}{ast.dump(fixture.args)}{body}"].append(f"{path.relative_to(TESTS)}::{fixture.name}")
    assert not [places for places in by_body.values() if len(places) > 1]
