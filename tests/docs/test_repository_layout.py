"""Layout rules a reader of the repository relies on.

``benchmarks/`` (measurements of the product) and ``experiments/`` (research studies) are packages whose
scripts run as ``python -m benchmarks.NAME`` / ``python -m experiments.NAME`` from the repository root, import
one another as package modules, and are each listed in their folder's README table. No tracked file cites a
numbered issue or item: a reader cannot resolve one, so code, tests and docs name the question or behaviour.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT_FOLDERS = ("benchmarks", "experiments")
# "issue", "issues" or "item" then a number (after a space, "_", "#" or "-"), in prose or inside an identifier.
NUMBERED_REFERENCE = re.compile(r"(?:issue|item)s?[ _#-]?\d+", re.IGNORECASE)
# Scripts still put their own folder on sys.path (written while the folders became packages); an entry goes
# when its script imports `benchmarks.*` instead (the test below fails once it no longer needs the exemption).
PATH_INSERT_PENDING: set[str] = set()


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [REPO / name for name in out.decode("utf-8").split("\0") if name]


def _scripts(folder: str) -> list[Path]:
    return sorted(p for p in (REPO / folder).glob("*.py") if p.name != "__init__.py")


def test_no_tracked_file_cites_a_numbered_issue_or_item() -> None:
    found = []
    for path in _tracked_files():
        if not path.is_file():  # deleted in the working tree, not yet in the index
            continue
        data = path.read_bytes()
        if b"\0" in data:  # binary (plots)
            continue
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            found += [f"{path.relative_to(REPO)}:{number}: {m.group(0)!r}" for m in NUMBERED_REFERENCE.finditer(line)]
    assert not found, "name the question or the behaviour instead of a number:\n" + "\n".join(found)


@pytest.mark.parametrize("folder", SCRIPT_FOLDERS)
def test_every_script_has_a_row_in_its_folders_readme(folder: str) -> None:
    readme = (REPO / folder / "README.md").read_text(encoding="utf-8")
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+\.py)` \|(.*)$", readme, re.MULTILINE)}
    assert sorted(rows) == [p.name for p in _scripts(folder)]
    for name, row in rows.items():
        if "imported by" not in row:  # a shared helper has no command
            assert f"python -m {folder}.{name.removesuffix('.py')}" in row, f"{folder}/README.md, {name}: no command"


@pytest.mark.parametrize("folder", SCRIPT_FOLDERS)
def test_scripts_import_each_other_as_package_modules(folder: str) -> None:
    siblings = {p.stem for f in SCRIPT_FOLDERS for p in _scripts(f)}
    wrong = []
    for path in _scripts(folder):
        rel = path.relative_to(REPO).as_posix()
        source = path.read_text(encoding="utf-8")
        if rel in PATH_INSERT_PENDING:
            assert "sys.path.insert" in source, f"{rel} no longer needs its exemption: drop it from the set"
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                wrong += [f"{rel}:{node.lineno}: import {a.name}" for a in node.names if a.name in siblings]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in siblings:
                wrong.append(f"{rel}:{node.lineno}: from {node.module} import ...")
            elif isinstance(node, ast.Attribute) and ast.unparse(node) == "sys.path.insert":
                wrong.append(f"{rel}:{node.lineno}: sys.path.insert")
    assert not wrong, f"import siblings as `from {folder}.NAME import ...`:\n" + "\n".join(wrong)


@pytest.mark.parametrize("folder", SCRIPT_FOLDERS)
def test_every_script_imports_as_a_package_module(folder: str) -> None:
    for path in _scripts(folder):
        if path.relative_to(REPO).as_posix() not in PATH_INSERT_PENDING:  # importing it would change sys.path
            importlib.import_module(f"{folder}.{path.stem}")


def test_a_script_runs_with_python_dash_m_from_the_repository_root() -> None:
    # core_all imports seven of its siblings, one of which imports another: the package imports resolve.
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.core_all", "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "docs/benchmarks.md" in done.stdout


def test_the_script_folders_are_not_installed_with_the_wheel() -> None:
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    packages = re.search(r"^packages = \[(.*?)\]", text, re.MULTILINE | re.DOTALL)
    assert packages is not None
    listed = re.findall(r'"([\w.]+)"', packages.group(1))
    assert listed and all(name.split(".")[0] == "care_retriever" for name in listed)


def test_no_store_module_is_over_400_lines() -> None:
    """The stores are split by concern (faiss/, qdrant/): a module that grows past 400 lines does more than one job."""
    stores = Path(__file__).resolve().parents[2] / "care_retriever" / "stores"
    long = {
        str(p.relative_to(stores)): n
        for p in sorted(stores.rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400
    }
    assert long == {}
