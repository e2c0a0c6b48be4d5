"""Shared fixtures: tiny models the tests build themselves, the shipped sample, the shared data."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.data import MEDICAL_TEXTS, SAMPLE_DIR, SHARED_DATA
from tests.support.eval_tasks import write_tasks
from tests.support.models import build_tiny_model
from tests.support.scheduling import XDIST_CHUNK

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Haystack telemetry tries to reach its server at import; tests run offline.
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
# `pytest -n 2` on two cores: one intra-op thread per worker (and per CLI subprocess it starts)
# instead of two workers each spawning a thread per core and fighting over them.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def small_corpus_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six short Chinese medical passages as a JSONL corpus with metadata."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for i, (doc_id, title, text) in enumerate(MEDICAL_TEXTS):
            row = {
                "_id": doc_id,
                "title": title,
                "text": text,
                "metadata": {"group": "odd" if i % 2 else "even"},
            }
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


@pytest.fixture(scope="session")
def sample_corpus_path() -> Path:
    path = SAMPLE_DIR / "corpus.jsonl"
    if not path.is_file():
        pytest.skip(f"shipped sample corpus missing at {path}")
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, small_corpus_path: Path) -> Path:
    """A saved tiny CARE model (random weights, tokenizers trained on the corpora) that tells texts apart."""
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", small_corpus_path)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set CARE_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="module")
def embedder(tiny_model_dir: Path):
    """The tiny model with both towers on the CPU in fp32 (the same numbers on any machine), loaded once per test
    module (tests may change its settings)."""
    from care_retriever.model.embedder import AsymmetricEmbedder

    return AsymmetricEmbedder.from_pretrained(tiny_model_dir, device="cpu", dtype="fp32")


@pytest.fixture(scope="module")
def docs(small_corpus_path: Path) -> list:
    """The small corpus as ``Document`` objects."""
    from care_retriever.indexing.corpus import read_corpus

    return list(read_corpus(small_corpus_path))


@pytest.fixture
def tasks(tmp_path: Path) -> dict[str, Path]:
    """Small task folders of each kind ``eval`` reads (retrieval, rerank, STS), by kind."""
    return write_tasks(tmp_path / "tasks")


@pytest.fixture
def compiled_graphs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """``torch.compile`` with a backend that records each graph it is handed (its node count) and runs it."""
    import torch

    graphs: list[int] = []
    real_compile = torch.compile

    def counting_backend(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append(len(graph.graph.nodes))
        return graph.forward

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, **{**kw, "backend": counting_backend}))
    torch._dynamo.reset()  # the compiler's caches are process-wide: each test counts its own graphs
    try:
        yield graphs
    finally:
        torch._dynamo.reset()


# ----------------------------------------------------------------------------- skip guard
# A skip hides a test; CI fails on any skip whose reason is not listed here (a broken dev dependency
# must fail the run, not turn a file into silent skips). Each entry: (reason pattern, why allowed).
ALLOWED_SKIPS: list[tuple[str, str]] = [
    (
        r"delete_all_documents(_async)? has no recreate_index or recreate_collection parameter",
        "Haystack's base suite: our stores have no index to recreate",
    ),
    (r"shared data not found at ", "the real data (../shared/data) is not on every machine"),
    (r"running as root: a file without read permission", "root reads any file: an unreadable file needs a user"),
    (r"cannot mount a .*tmpfs here", "a small disk is mounted only where the tests run as root"),
    (r"this CPU does not multiply bf16 in hardware", "the bf16 path on a CPU needs AMX, which not every machine has"),
]


SKIPPED: list[tuple[str, str]] = []  # (test id, reason) of every skip this process saw reported


def skip_reason(report) -> str:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason.removeprefix("Skipped: ")


def unexpected_skips(skipped: list[tuple[str, str]]) -> list[str]:
    import re

    return [
        f"{nodeid}: {reason}"
        for nodeid, reason in skipped
        if not any(re.search(pattern, reason) for pattern, _ in ALLOWED_SKIPS)
    ]


# (test id, what it counted) of the fault-injection suite's passed tests: the run's summary names its count of
# injected points (a test records it with ``record_property("fault_injection", ...)``).
FAULT_COUNTS: list[tuple[str, str]] = []


def pytest_runtest_logreport(report) -> None:
    # Under xdist the controller receives every worker's reports here too (user_properties travel with them).
    if report.skipped and not hasattr(report, "wasxfail"):
        SKIPPED.append((report.nodeid, skip_reason(report)))
    if report.when == "call" and report.passed:
        FAULT_COUNTS.extend((report.nodeid, str(v)) for k, v in report.user_properties if k == "fault_injection")


def pytest_terminal_summary(terminalreporter) -> None:
    if FAULT_COUNTS:
        terminalreporter.section("fault injection")
        for nodeid, counted in sorted(FAULT_COUNTS):
            terminalreporter.write_line(f"{nodeid.split('::')[-1]}: {counted}")


def pytest_collectreport(report) -> None:
    # A module-level skip (``pytest.importorskip`` at import time) skips the whole file at collection,
    # where no test report is ever written: without this the guard would not see it.
    if report.skipped:
        SKIPPED.append((report.nodeid, skip_reason(report)))


def pytest_sessionfinish(session, exitstatus) -> None:
    """With CARE_SKIP_GUARD=1 (set by .ci/run), a skip for a reason not on ALLOWED_SKIPS fails the run."""
    if os.environ.get("CARE_SKIP_GUARD") != "1" or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    bad = unexpected_skips(SKIPPED)
    if bad:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("")
            for line in bad:
                reporter.write_line(f"skip guard: not allowed to skip: {line}", red=True)
            reporter.write_line("skip guard: add the reason to ALLOWED_SKIPS in tests/conftest.py if the skip is meant")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    """Under ``-n 2`` xdist hands out ``XDIST_CHUNK`` tests at a time, unless the command sets ``--maxschedchunk``.

    Its default first hands each worker a quarter of its share as one run of consecutive tests: with the slow tests
    first, every one of them would go to the first worker while the second ran short ones and then waited.
    """
    if config.pluginmanager.hasplugin("xdist") and config.getoption("maxschedchunk", None) is None:
        config.option.maxschedchunk = XDIST_CHUNK


def pytest_collection_modifyitems(session, config, items) -> None:
    """Tests marked ``slow`` (end-to-end runs of tens of seconds: subprocesses, training, kills) run first, in
    their collected order, the rest after them. Under ``-n 2`` xdist hands out tests in this order, a few at a
    time (``pytest_configure``): the two workers then share the long ones at the start and end together on short ones,
    instead of one worker finishing a long test alone at the end while the other waits."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: the order within each group
