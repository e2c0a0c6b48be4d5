"""The slim install (care_retriever/search/backends/slim.py): a fresh venv without torch searches and serves an
ONNX export with the same hits as the torch path, and torch-only commands fail in one line.

The venv gets the wheel with ``--no-deps`` and then exactly the ``serve-slim`` extra's list as the
installed metadata prints it (the documented two commands), with the versions pinned to this test
environment's (constraints): pip's cache serves them, and the comparison is backend against backend,
not one numpy or faiss release against another. Measured wall time about 4 minutes on 2 loaded
cores, most of it pip unpacking onnxruntime / numpy / faiss into the venv.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import venv
from importlib.metadata import version
from pathlib import Path

import onnxruntime  # noqa: F401  (the export needs it; no skip: see test_openvino_backend.py)
import pytest

from care_retriever.cli.main import main

REPO = Path(__file__).resolve().parents[2]
BUILD_IGNORE = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", "runs")
QUERIES = ["高血压患者平时饮食需要注意什么？", "宝宝发烧三十八度五，精神不好，要不要去医院"]


def _isolated_env() -> dict[str, str]:
    # PYTHONPATH would put this checkout (and an egg-info in it) beside the slim venv's packages
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _run(argv: list[object], timeout: float = 600, **kwargs) -> subprocess.CompletedProcess[str]:
    kwargs.setdefault("env", _isolated_env())
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kwargs)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def slim_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv (no system site-packages) with the wheel and the slim list, nothing else."""
    root = tmp_path_factory.mktemp("slim")
    # setuptools builds in the source's build/ folder: a copy keeps parallel builds (the wheel test
    # under -n 2) and stale build/ contents out of this one
    source = root / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*BUILD_IGNORE))
    dist = root / "dist"
    built = _run(
        [sys.executable, "-m", "pip", "wheel", source, "--no-deps", "--no-build-isolation", "-q", "-w", dist], cwd=root
    )
    assert built.returncode == 0, built.stderr
    wheel = next(dist.glob("care_retriever-*.whl"))
    env_dir = root / "venv"
    # no pip inside (ensurepip alone took 30 s here): this environment's pip installs into it
    venv.create(env_dir, with_pip=False, system_site_packages=False)
    python = env_dir / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile"]
    assert _run([*pip, "--no-deps", wheel]).returncode == 0
    listed = _run([python, "-m", "care_retriever.search.backends.slim"], cwd=root)
    assert listed.returncode == 0, listed.stderr
    requirements = listed.stdout.split()
    assert "onnxruntime>=1.20" in requirements and not [r for r in requirements if r.startswith("torch")]
    pins = []
    for requirement in requirements:
        name = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0]
        pins.append(f"{name}=={version(name)}")  # every slim requirement is also a full-install one
    constraints = root / "constraints.txt"
    constraints.write_text("\n".join(pins) + "\n")
    installed = _run([*pip, "-c", constraints, *requirements])
    assert installed.returncode == 0, installed.stderr[-2000:]
    return env_dir


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    model = tmp_path_factory.mktemp("slim-model") / "tiny"
    shutil.copytree(tiny_model_dir, model)
    assert main(["export", "--model", str(model), "--backend", "onnx", "--quantize", "none"]) == 0
    return model


@pytest.fixture(scope="module")
def slim_store(tmp_path_factory: pytest.TempPathFactory, onnx_model: Path, small_corpus_path: Path) -> str:
    spec = f"faiss:{tmp_path_factory.mktemp('slim-store') / 'store'}"
    argv = ["index", "--model", str(onnx_model), "--corpus", str(small_corpus_path), "--store", spec, "--no-progress"]
    assert main(argv) == 0
    return spec


def _slim_env_vars(env_dir: Path) -> dict[str, str]:
    env = _isolated_env()
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}"
    return env


@pytest.mark.slow
def test_slim_install_searches_and_serves_without_torch(
    slim_env: Path, onnx_model: Path, slim_store: str, tmp_path: Path, capsys
) -> None:
    python, cli = slim_env / "bin" / "python", slim_env / "bin" / "care-retriever"
    env = _slim_env_vars(slim_env)
    no_torch = _run([python, "-c", "import torch"], env=env, cwd=tmp_path)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    where = _run([python, "-c", "import care_retriever; print(care_retriever.__file__)"], env=env, cwd=tmp_path)
    assert where.stdout.strip().startswith(str(slim_env)), where.stdout

    helped = _run([cli, "--help"], env=env, cwd=tmp_path)
    assert helped.returncode == 0 and "search" in helped.stdout and "serve" in helped.stdout, helped.stderr

    # search: the same ids and scores as the torch path of this (full) environment
    argv = ["search", *QUERIES, "--model", onnx_model, "--store", slim_store, "--json", "--top-k", "4"]
    slim = _run([cli, *argv], env=env, cwd=tmp_path)
    assert slim.returncode == 0, slim.stderr
    code, out, _ = _cli_in_process(capsys, [*argv, "--backend", "torch", "--device", "cpu"])
    assert code == 0
    slim_rows = [json.loads(line) for line in slim.stdout.splitlines()]
    torch_rows = [json.loads(line) for line in out.splitlines()]
    assert len(slim_rows) == len(torch_rows) == len(QUERIES)
    for got, want in zip(slim_rows, torch_rows, strict=True):
        assert [h["id"] for h in got["hits"]] == [h["id"] for h in want["hits"]]
        for g, w in zip(got["hits"], want["hits"], strict=True):
            assert abs(g["score"] - w["score"]) <= 1e-3, (g, w)

    # a torch-only command: one line naming what is missing and the full install
    index = _run(
        [
            cli,
            "index",
            "--model",
            onnx_model,
            "--corpus",
            REPO / "care_retriever/data/sample/corpus.jsonl",
            "--store",
            f"faiss:{tmp_path / 'new-store'}",
        ],
        env=env,
        cwd=tmp_path,
    )
    assert index.returncode != 0 and "Traceback" not in index.stderr
    assert len(index.stderr.strip().splitlines()) == 1, index.stderr
    assert "needs" in index.stderr and "pip install care-retriever" in index.stderr

    # serve answers a request with the same hits
    port = _free_port()
    server = subprocess.Popen(
        [cli, "serve", "--model", onnx_model, "--store", slim_store, "--port", str(port)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        body = _post_when_up(f"http://127.0.0.1:{port}/search", {"query": QUERIES[0], "top_k": 4}, server)
    finally:
        server.terminate()
        _, err = server.communicate(timeout=60)
    assert "Traceback" not in err, err
    hits = body["results"][0]["hits"]
    assert [h["id"] for h in hits] == [h["id"] for h in torch_rows[0]["hits"]]


def _cli_in_process(capsys: pytest.CaptureFixture[str], argv: list[object]) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _post_when_up(url: str, payload: dict, server: subprocess.Popen, timeout: float = 120) -> dict:
    data = json.dumps(payload).encode()
    deadline = time.monotonic() + timeout
    while True:
        assert server.poll() is None, server.communicate()[1]
        try:
            request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 200
                return json.loads(response.read())
        except (ConnectionError, urllib.error.URLError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
