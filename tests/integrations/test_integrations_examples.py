"""examples/: the medical RAG through plain care-retriever, Haystack and LangChain, and the two short examples."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import ModuleType
from typing import ClassVar

import pytest

from tests.support.data import load_script

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # offline: no usage pings
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QUESTION = "血压高怎么办"


def load_example(name: str) -> ModuleType:
    return load_script(EXAMPLES / f"{name}.py", f"example_{name}")


@pytest.fixture(scope="module")
def rag() -> ModuleType:
    return load_example("medical_rag")


@pytest.fixture(scope="module")
def reference_hits(tiny_model_dir: Path, small_corpus_path: Path, tmp_path_factory: pytest.TempPathFactory) -> list:
    """CareRetriever over a store written by DocumentStoreWriter (what `care-retriever index/search` run)."""
    from care_retriever import AsymmetricEmbedder, CareRetriever, DocumentStoreWriter, read_corpus

    store = f"faiss:{tmp_path_factory.mktemp('ref') / 'store'}"
    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir)
    DocumentStoreWriter(embedder, store, show_progress=False).write(read_corpus(small_corpus_path))
    retriever = CareRetriever(store, AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="query"))
    return [(h.id, h.score) for h in retriever.search(QUESTION, top_k=4)]


@pytest.mark.parametrize("framework", ["care", "haystack", "langchain"])
def test_every_framework_returns_the_care_retriever_hits(
    framework: str, rag: ModuleType, tiny_model_dir: Path, small_corpus_path: Path, tmp_path: Path,
    reference_hits: list,
) -> None:  # fmt: skip
    passages = rag.index_and_retrieve(framework, str(tiny_model_dir), small_corpus_path, tmp_path / "s", QUESTION, 4)
    assert [p.id for p in passages] == [i for i, _ in reference_hits]
    assert [p.score for p in passages] == pytest.approx([s for _, s in reference_hits], abs=1e-5)
    assert all(p.title and p.text for p in passages)


def test_prompt_and_offline_answer_cite_numbered_passages(rag: ModuleType) -> None:
    passages = [
        rag.Passage("d1", "高血压饮食", "高血压患者应低盐饮食。每天食盐不超过5克。", 0.9),
        rag.Passage("d2", "", "规律服药，定期监测血压！不要自行停药。", 0.8),
    ]
    prompt = rag.build_prompt(QUESTION, passages)
    assert "[1] 高血压饮食：高血压患者应低盐饮食" in prompt and "[2] 规律服药" in prompt and QUESTION in prompt
    answer = rag.extractive_answer("高血压患者吃盐要注意什么", passages)
    assert "- 高血压患者应低盐饮食。 [1]" in answer and "[2]" in answer


class _ChatServer(BaseHTTPRequestHandler):
    """A minimal OpenAI-compatible endpoint: records the request, answers with a fixed completion."""

    requests: ClassVar[list] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, self.headers.get("Authorization"), body))
        reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": " 低盐饮食 [1] "}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


def test_generator_calls_an_openai_compatible_endpoint_over_http(
    rag: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = HTTPServer(("127.0.0.1", 0), _ChatServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{server.server_port}/v1")
        monkeypatch.setenv("CARE_LLM_MODEL", "local-model")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        passages = [rag.Passage("d1", "t", "高血压患者应低盐饮食。", 0.9)]
        assert rag.generate("PROMPT", QUESTION, passages) == "低盐饮食 [1]"
        path, auth, body = _ChatServer.requests[-1]
        assert path == "/v1/chat/completions" and auth == "Bearer sk-test"
        assert body["model"] == "local-model" and body["messages"][-1]["content"] == "PROMPT"
        monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens: falls back offline
        assert "[1]" in rag.generate("PROMPT", QUESTION, passages)
    finally:
        server.shutdown()


def test_main_runs_offline_and_explains_a_missing_model(
    rag: ModuleType, tiny_model_dir: Path, small_corpus_path: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)  # no care-quickstart/model here
    assert rag.main(["--corpus", str(small_corpus_path), QUESTION]) == 2
    assert "care-retriever quickstart" in capsys.readouterr().err
    assert rag.main(["--model", str(tiny_model_dir), "--corpus", str(small_corpus_path), QUESTION]) == 0
    out = capsys.readouterr().out
    assert "检索结果（care）" in out and "[1]" in out and "不构成医疗建议" in out
    assert rag.main(["--model", str(tmp_path / "missing"), "--corpus", str(small_corpus_path)]) == 2
    assert "model folder not found" in capsys.readouterr().err


def test_default_corpus_is_the_shipped_sample(
    rag: ModuleType, tiny_model_dir: Path, sample_corpus_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sample_corpus_path == rag.SAMPLE_CORPUS
    assert rag.main(["--model", str(tiny_model_dir), "--framework", "langchain", QUESTION]) == 0
    sample_ids = {json.loads(line)["_id"] for line in sample_corpus_path.read_text("utf-8").splitlines()}
    cited = [line.split()[2] for line in capsys.readouterr().out.splitlines() if line.strip().startswith("[")]
    assert len(cited) == 3 and set(cited) <= sample_ids


def test_short_examples_query_a_cli_built_index(
    tiny_model_dir: Path, small_corpus_path: Path, tmp_path: Path, reference_hits: list
) -> None:
    importlib.import_module("haystack")
    importlib.import_module("langchain_core")
    from care_retriever.cli.main import main as cli

    store = tmp_path / "store"
    assert cli(["index", "--model", str(tiny_model_dir), "--corpus", str(small_corpus_path),
                "--store", f"faiss:{store}", "--no-progress"]) == 0  # fmt: skip
    want = [i for i, _ in reference_hits]
    haystack_hits = load_example("haystack_pipeline").main(["--model", str(tiny_model_dir), "--store", str(store),
                                                             "--top-k", "4", QUESTION])  # fmt: skip
    assert [d.id for d in haystack_hits] == want
    langchain = load_example("langchain_retriever")
    assert [d.id for d in langchain.main(["--model", str(tiny_model_dir), "--store", f"faiss:{store}",
                                          "--k", "4", QUESTION])] == want  # fmt: skip
    fresh = langchain.main(["--model", str(tiny_model_dir), "--store", f"qdrant:{tmp_path / 'q'}",
                            "--corpus", str(small_corpus_path), "--k", "4", QUESTION])  # fmt: skip
    assert [d.id for d in fresh] == want
    haystack = load_example("haystack_pipeline")
    indexed = haystack.main(["--model", str(tiny_model_dir), "--store", str(tmp_path / "h"),
                             "--corpus", str(small_corpus_path), "--top-k", "4", QUESTION])  # fmt: skip
    assert [d.id for d in indexed] == want
    # the spec the CLI takes reads the same store (not an empty folder named "faiss:..."); nothing there: one line
    spec_hits = haystack.main(["--model", str(tiny_model_dir), "--store", f"faiss:{store}", "--top-k", "4", QUESTION])
    assert [d.id for d in spec_hits] == want
    for empty in (f"faiss:{tmp_path / 'nothing'}", f"qdrant:{tmp_path / 'q'}"):
        with pytest.raises(SystemExit) as stopped:
            haystack.main(["--model", str(tiny_model_dir), "--store", empty, QUESTION])
        assert stopped.value.code == 2
    assert not (tmp_path / "nothing").exists()
