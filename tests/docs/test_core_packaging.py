"""The wheel installs care_retriever, care_retriever.integrations and care_retriever.training; imports stay lazy."""

from __future__ import annotations

import email
import os
import re
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Distributions that install the module `faiss`: two of them in one environment overwrite each other's files.
FAISS_BUILDS = re.compile(r"^(faiss|faiss-cpu.*|faiss-gpu.*|faiss-cuda.*)$")


def installs(requires_dist: list[str], extra: str | None) -> set[str]:
    """The distributions ``pip install care-retriever[extra]`` asks for (None: no extra), extras of
    care-retriever itself expanded, from Requires-Dist lines (markers: ``extra == "name"``)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    names: set[str] = set()
    todo, seen = [extra or ""], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for line in requires_dist:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": current}):
                continue
            if req.marker is None and current:  # a base dependency: counted with the base install
                continue
            name = canonicalize_name(req.name)
            if name == "care-retriever":
                todo += sorted(req.extras)
            else:
                names.add(name)
    if extra:
        names |= installs(requires_dist, None)
    return names


def assert_one_faiss_build_per_install(requires_dist: list[str], extras: list[str]) -> None:
    assert "all" in extras and "dev" in extras
    for extra in [None, *extras]:
        builds = sorted(n for n in installs(requires_dist, extra) if FAISS_BUILDS.match(n))
        assert len(builds) == 1, f"care-retriever[{extra or ''}] installs {builds}"


def _pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the parser pip vendors
        from pip._vendor import tomli as tomllib
    return tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))


def test_no_install_puts_two_faiss_builds_in_one_environment() -> None:
    project = _pyproject()["project"]
    extras = project["optional-dependencies"]
    # pyproject's lists as the wheel's Requires-Dist lines: each extra's entries marked with its name
    lines = list(project["dependencies"]) + [f'{r}; extra == "{e}"' for e, reqs in extras.items() for r in reqs]
    assert_one_faiss_build_per_install(lines, list(extras))
    assert installs(lines, "all") >= {"faiss-cpu", "qdrant-client", "accelerate"}  # the expansion is real


def test_the_docs_install_no_gpu_extra_and_swap_rather_than_add_faiss_builds() -> None:
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for path in docs:
        text = path.read_text("utf-8")
        for extras in re.findall(r"care-retriever\[([^\]]+)\]", text):
            assert "gpu" not in extras.split(",") and "|gpu|" not in f"|{extras}|", f"{path.name}: [{extras}]"
        for line in text.splitlines():
            if re.search(r"pip install[^`]*faiss-(gpu|cuda)", line):
                assert "uninstall -y faiss-cpu" in line, f"{path.name}: {line.strip()}"


@pytest.mark.slow
def test_wheel_installs_all_three_import_packages(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(REPO),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
        ],
        check=True,
        timeout=300,
        cwd=tmp_path,
    )
    wheel = next(dist.glob("care_retriever-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    # the built wheel's metadata, as pip reads it: no install it offers holds two FAISS builds
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    message = email.message_from_bytes(zipfile.ZipFile(wheel).read(metadata))
    assert_one_faiss_build_per_install(message.get_all("Requires-Dist") or [], message.get_all("Provides-Extra") or [])
    assert "care_retriever/integrations/__init__.py" in names
    assert "care_retriever/training/__init__.py" in names
    # the quickstart and the example read the shipped sample from the installed package
    assert {f"care_retriever/data/sample/{n}" for n in ("corpus.jsonl", "queries.jsonl", "qrels.tsv")} <= set(names)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Dependencies come from the test environment; the package itself only from the wheel.
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=300,
    )
    code = (
        "import care_retriever, care_retriever.integrations, care_retriever.training, care_retriever.cli.main;"
        "print(care_retriever.__file__)"
    )
    out = subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(site)


def test_import_does_not_load_frameworks_or_torch() -> None:
    code = (
        "import sys, care_retriever;"
        # what a torch-free search host reads: the model's config and the encoder protocols
        "care_retriever.CareConfig, care_retriever.QueryEncoder, care_retriever.DocumentEncoder;"
        "heavy = {'haystack', 'langchain', 'langchain_core', 'qdrant_client', 'torch'};"
        "heavy = [m for m in sys.modules if m.split('.')[0] in heavy];"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
