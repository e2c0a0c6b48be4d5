"""Shared fixtures: tiny models the tests build themselves, the shipped sample, the shared data."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

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

REPO = Path(__file__).resolve().parents[1]
SAMPLE_DIR = REPO / "care_retriever" / "data" / "sample"
SHARED_DATA = Path(os.environ.get("CARE_SHARED_DATA", REPO.parent / "shared" / "data"))

MEDICAL_TEXTS = [
    ("a", "高血压", "高血压患者应低盐饮食，规律服用降压药，定期监测血压。"),
    ("b", "感冒", "普通感冒多由病毒引起，多休息多喝水，一般一周左右可以自愈。"),
    ("c", "糖尿病", "糖尿病患者需要控制饮食、适量运动，并遵医嘱使用降糖药物。"),
    ("d", "腹泻", "拉肚子时注意补充水分和电解质，避免脱水，严重时及时就医。"),
    ("e", "失眠", "失眠可以通过规律作息、睡前避免咖啡和手机来改善。"),
    ("f", "儿童发烧", "宝宝发烧超过三十八度五或精神差时应及时就医。"),
]

# What the shared tiny model must do before any test trusts it (see ``discrimination``). With the
# initialisation transformers gives a 2-layer BERT / decoder (std 0.02) every query gets nearly the
# same vector (pairwise cosine ~0.99999, one nearest passage for all), so a test comparing results
# could not tell one query's answer from another's. Seconds of in-batch contrastive training do not
# fix that (the loss first falls by collapsing every text onto one point); a wider initialisation of
# the weight matrices does, at no cost: attention then depends on the tokens.
MAX_MEAN_QUERY_COSINE = 0.9
DISCRIMINATIVE_INIT_STD = 0.3


# Texts of mixed lengths for the forward-pass tests (packed = padded, training's document side): one-character
# texts (a token or two with the appended end token), repeats of one sentence, a long one, Latin letters
MIXED_LENGTH_TEXTS = [
    "高血压患者应低盐饮食，规律服用降压药，定期监测血压。" * 3,
    "a",
    "感冒",
    "糖尿病患者需要控制饮食、适量运动，并遵医嘱使用降糖药物。",
    "咳",
    "失眠可以通过规律作息、睡前避免咖啡和手机来改善。",
    "宝宝发烧超过三十八度五或精神差时应及时就医。" * 2,
    "What should a patient with hypertension eat?",
    "b",
    "拉肚子时注意补充水分和电解质。",
]


def load_script(path: Path, name: str | None = None):
    """A script that is not a package module (examples/) imported from its file."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


# The training tests' pairs: query "<condition><question>", positive "<condition>：<answer>", in
# condition-major order (the first n rows are the same whatever the number of conditions taken).
CONDITIONS = ["高血压", "糖尿病", "感冒", "腹泻", "失眠", "发烧", "咳嗽", "胃痛", "头痛", "过敏", "贫血", "哮喘"]
ASPECTS = [
    ("怎么办", "出现{c}时先休息观察，症状加重要及时去医院就诊。"),
    ("吃什么药", "{c}的用药要听医生的，不要自己随便买药吃。"),
    ("有哪些症状", "{c}常见的表现各不相同，可以对照说明自查。"),
    ("饮食注意什么", "{c}患者饮食宜清淡，少吃油腻辛辣的食物。"),
]


def condition_pairs(conditions: int = len(CONDITIONS), aspects: int = len(ASPECTS)) -> list[dict[str, str]]:
    return [
        {"query": f"{c}{question}", "text": f"{c}：" + answer.format(c=c)}
        for c in CONDITIONS[:conditions]
        for question, answer in ASPECTS[:aspects]
    ]


def sample_queries() -> list[str]:
    return [row["text"] for row in read_jsonl(SAMPLE_DIR / "queries.jsonl")]


def discriminative_init(embedder, std: float = DISCRIMINATIVE_INIT_STD, seed: int = 0) -> None:
    """Redraw every weight matrix (embeddings, projections) of both towers from N(0, std)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for modules in (embedder.query_modules, embedder.document_modules):
            for param in modules[0].auto_model.parameters():
                if param.dim() == 2:
                    param.copy_(torch.randn(param.shape, generator=generator) * std)


# The query backends' tests (ONNX, OpenVINO): queries of every shape, one of them past the max length.
BACKEND_QUERIES = [
    "高血压患者平时饮食需要注意什么？",
    "感冒",
    "宝宝发烧三十八度五，精神不好，要不要去医院",
    "失眠怎么办" * 150,  # 750 characters: truncated to the tower's max length on both paths
    "糖尿病人能吃水果吗 diabetes fruit",
]
# Weights drawn wider than a trained model's (so that queries get clearly different vectors) but not
# as wide as the shared fixture's 0.3, whose activations are far outside what int8 dynamic quantisation
# is made for (measured: int8 cosine 0.94 at 0.3, 0.9996 at 0.2; query pairs at most 0.96 alike at 0.2).
EXPORT_INIT_STD = 0.2


def exported_tiny_model(folder: Path, corpus: Path, backend: str) -> Path:
    """A tiny model saved in ``folder/tiny`` with an fp32 + int8 ``backend`` export of its query tower."""
    from care_retriever.cli.main import main
    from care_retriever.model.scratch import init_from_scratch

    model = folder / "tiny"
    embedder = init_from_scratch("tiny", [corpus, SAMPLE_DIR / "corpus.jsonl"], seed=0)
    discriminative_init(embedder, std=EXPORT_INIT_STD)
    embedder.save_pretrained(model)
    assert main(["export", "--model", str(model), "--backend", backend, "--quantize", "int8"]) == 0
    return model


def indexed_store(folder: Path, model: Path, corpus: Path) -> str:
    """``care-retriever index`` of ``corpus`` with ``model`` into a FAISS store in ``folder``; its spec."""
    from care_retriever.cli.main import main

    spec = f"faiss:{folder / 'store'}"
    assert main(["index", "--model", str(model), "--corpus", str(corpus), "--store", spec, "--no-progress"]) == 0
    return spec


def run_cli(capsys, *args: object) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one ``care-retriever`` call."""
    from care_retriever.cli.main import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def discrimination(embedder) -> tuple[float, int]:
    """(mean pairwise cosine of the sample queries, number of distinct nearest sample passages)."""
    import numpy as np

    queries = sample_queries()
    corpus = read_jsonl(SAMPLE_DIR / "corpus.jsonl")
    q = embedder.embed_queries(queries)
    d = embedder.embed_documents([f"{r['title']}\n{r['text']}" if r.get("title") else r["text"] for r in corpus])
    cos = q @ q.T
    n = len(queries)
    mean = float((cos.sum() - np.trace(cos)) / (n * (n - 1)))
    return mean, len(set((q @ d.T).argmax(axis=1).tolist()))


def build_tiny_model(out: Path, small_corpus: Path) -> Path:
    from care_retriever.model.scratch import init_from_scratch

    vocab = [small_corpus]
    if (SAMPLE_DIR / "corpus.jsonl").is_file():
        vocab.append(SAMPLE_DIR / "corpus.jsonl")
    embedder = init_from_scratch("tiny", vocab, seed=0)
    discriminative_init(embedder)
    if (SAMPLE_DIR / "corpus.jsonl").is_file():
        mean, nearest = discrimination(embedder)
        assert mean < MAX_MEAN_QUERY_COSINE, f"tiny fixture model: mean query cosine {mean:.3f}"
        assert nearest > 1, "tiny fixture model: every sample query has the same nearest passage"
    embedder.save_pretrained(out)
    return out


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


def pytest_collection_modifyitems(session, config, items) -> None:
    """Tests marked ``slow`` (end-to-end runs of tens of seconds: subprocesses, training, kills) run first, in
    their collected order, the rest after them. Under ``-n 2`` xdist hands out tests in this order: the two workers
    then share the long ones at the start and end together on short ones, instead of one worker finishing a long
    test alone at the end while the other waits."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: the order within each group
