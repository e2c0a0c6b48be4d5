"""Every usage example in the Haystack components' and LangChain classes' docstrings runs as written, on the tiny
model (as ``models/care``) and a FAISS store ``care-retriever index`` built from the shipped sample (as
``stores/care``)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import haystack  # noqa: F401  (dev dependency: a broken install fails, never skips)
import pytest
from haystack_integrations.components.embedders.care_retriever import CareDocumentEmbedder, CareTextEmbedder
from haystack_integrations.components.retrievers.care_retriever import (
    CareFaissEmbeddingRetriever,
    CareStoreBM25Retriever,
    CareStoreRetriever,
)
from haystack_integrations.document_stores.care_retriever import CareFaissDocumentStore

import care_retriever
from care_retriever.cli.main import main as cli
from care_retriever.integrations.langchain import CareEmbeddings, CareVectorStore
from care_retriever.integrations.langchain.searching import CareVectorStoreRetriever

DOCUMENTED = [
    CareTextEmbedder,
    CareDocumentEmbedder,
    CareFaissDocumentStore,
    CareFaissEmbeddingRetriever,
    CareStoreRetriever,
    CareStoreBM25Retriever,
    CareEmbeddings,
    CareVectorStore,
    CareVectorStoreRetriever,
]
CODE_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


@pytest.fixture(scope="module")
def workdir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("examples")
    (root / "models").mkdir()
    (root / "models" / "care").symlink_to(tiny_model_dir, target_is_directory=True)
    corpus = Path(care_retriever.__file__).parent / "data" / "sample" / "corpus.jsonl"
    store = root / "stores" / "care"
    index = ["index", "--model", str(tiny_model_dir), "--corpus", str(corpus), "--store", f"faiss:{store}"]
    assert cli([*index, "--no-progress"]) == 0
    return root


@pytest.mark.parametrize("cls", DOCUMENTED, ids=lambda cls: cls.__name__)
def test_docstring_example_runs(cls: type, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    examples = CODE_BLOCK.findall(cls.__doc__ or "")
    assert len(examples) == 1, f"{cls.__name__}: one usage example in its docstring"
    monkeypatch.chdir(workdir)
    exec(compile(textwrap.dedent(examples[0]), f"<{cls.__name__} docstring>", "exec"), {})
