"""The wheel installs care_retriever, care_retriever.integrations and care_retriever.training; imports stay lazy."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


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
        "heavy = {'haystack', 'langchain', 'langchain_core', 'qdrant_client', 'torch'};"
        "heavy = [m for m in sys.modules if m.split('.')[0] in heavy];"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
