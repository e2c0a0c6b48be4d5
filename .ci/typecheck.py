"""Type-check the wheel's three import packages under their installed names: mypy, pyproject's [tool.mypy].

``integrations/`` and ``training/`` install as ``care_retriever.integrations`` / ``care_retriever.training``,
``integrations/haystack_integrations/`` as ``haystack_integrations`` (pyproject's package-dir), which an editable
install maps with an import hook that mypy cannot follow:
plain ``mypy`` would call them ``integrations.*`` / ``training.*`` and find none of the imports between
the packages. So the source files mypy finds are renamed to their installed modules before the build.

Usage: ``python .ci/typecheck.py [mypy options]`` from the repository root; exits 1 on any error.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from mypy import build
from mypy.main import process_options

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: mypy's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    os.chdir(ROOT)  # [tool.mypy] files are relative to the repository root
    package_dir = tomllib.loads(Path("pyproject.toml").read_text("utf-8"))["tool"]["setuptools"]["package-dir"]
    # folder as a dotted prefix -> its installed name; the longest prefix wins (a folder inside another may install
    # under a name of its own, as integrations/haystack_integrations does)
    renamed = {folder.replace("/", "."): package for package, folder in package_dir.items() if folder != package}
    sources, options = process_options(["--config-file", "pyproject.toml", *argv])
    for source in sources:
        prefixes = [p for p in renamed if source.module == p or source.module.startswith(p + ".")]
        prefix = max(prefixes, key=len, default=None)
        if prefix is not None:
            source.module = renamed[prefix] + source.module[len(prefix) :]
    try:
        messages = build.build(sources, options).errors
    except build.CompileError as exc:  # a blocking error (syntax error, a module found twice)
        messages = exc.messages
    for line in messages:
        print(line)
    errors = sum(": error: " in line for line in messages)
    files = len({line.split(":", 1)[0] for line in messages if ": error: " in line})
    summary = f"{errors} errors in {files} files" if errors else "no issues"
    print(f"mypy: {summary} ({len(sources)} source files checked, {time.perf_counter() - started:.0f} s)")
    return 1 if errors else 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)  # as mypy's own command does: freeing the build object by object takes longer than the check
