"""The core's public API reads as Haystack's does: every public class and function has a one-line summary, one
``:param`` line per parameter, and a usage example that runs as written.

The examples run in a folder holding the tiny model as ``models/care``, its two towers saved alone as
sentence-transformers folders, the first rows of the shipped sample corpus as ``corpus.jsonl``, and a FAISS store
that ``care-retriever index`` built from them as ``stores/care``. An example that needs a hub id names the real
one; ``HUB_STAND_INS`` substitutes a tiny tower folder for it before the example runs (no network here).
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import care_retriever
from care_retriever.cli.main import main as cli
from care_retriever.indexing.config import EncodeConfig
from care_retriever.model.pairing import TowerPairing
from care_retriever.stores import VectorStore, capabilities, open_store

PUBLIC_NAMES = [name for name in care_retriever.__all__ if name != "__version__"]
DOCUMENTED: list[Any] = [
    *(getattr(care_retriever, name) for name in PUBLIC_NAMES),
    EncodeConfig,
    TowerPairing,
    VectorStore,
    capabilities.SparseSearch,
    capabilities.WriteRuns,
    capabilities.Verification,
    capabilities.StoredIteration,
    capabilities.IndexBuilding,
]
DOCUMENTED = list(dict.fromkeys([*DOCUMENTED, open_store]))
HUB_STAND_INS = {
    "alibaba-nlp-community/gte-multilingual-base": "models/query-tower",
    "Qwen/Qwen3-Embedding-4B": "models/document-tower",
}
SAMPLE_ROWS = 24  # the shipped sample's first rows: each example that writes a store encodes them again
CODE_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
PARAM = re.compile(r":param (\w+):")


def _members(obj: Any) -> list[tuple[str, Callable[..., Any]]]:
    """``obj`` itself (a class as its constructor) and, for a class, the public methods it defines."""
    if not inspect.isclass(obj):
        return [(obj.__name__, obj)]
    found: list[tuple[str, Callable[..., Any]]] = [(obj.__name__, obj)]
    for name, member in vars(obj).items():
        if name.startswith("_"):
            continue
        if isinstance(member, (classmethod, staticmethod)):
            member = member.__func__
        if inspect.isfunction(member):
            found.append((f"{obj.__name__}.{name}", member))
    return found


def _parameters(member: Callable[..., Any]) -> list[str]:
    if inspect.isclass(member):
        if "__init__" not in vars(member) and not hasattr(member, "__dataclass_fields__"):
            return []
        member = member.__init__  # type: ignore[misc]
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    names = [p.name for p in inspect.signature(member).parameters.values() if p.kind not in skip]
    return [name for name in names if name not in ("self", "cls")]


def _documented_params(member: Callable[..., Any]) -> set[str]:
    text = inspect.getdoc(member) or ""
    if inspect.isclass(member) and "__init__" in vars(member):
        text += "\n" + (inspect.getdoc(vars(member)["__init__"]) or "")
    return set(PARAM.findall(text))


@pytest.fixture(scope="module")
def example_folder(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sentence_transformers import SentenceTransformer

    from care_retriever.model.embedder import AsymmetricEmbedder

    root = tmp_path_factory.mktemp("core_examples")
    (root / "models").mkdir()
    (root / "models" / "care").symlink_to(tiny_model_dir, target_is_directory=True)
    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir, device="cpu", dtype="fp32")
    for side, folder in (("query", "query-tower"), ("document", "document-tower")):
        SentenceTransformer(modules=embedder.tower(side).modules, device="cpu").save(str(root / "models" / folder))
    sample = Path(care_retriever.__file__).parent / "data" / "sample" / "corpus.jsonl"
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(sample.read_text("utf-8").splitlines(keepends=True)[:SAMPLE_ROWS]), "utf-8")
    store = f"faiss:{root / 'stores' / 'care'}"
    index = ["index", "--model", str(tiny_model_dir), "--corpus", str(corpus), "--store", store]
    assert cli([*index, "--no-progress"]) == 0
    return root


@pytest.mark.parametrize("obj", DOCUMENTED, ids=lambda obj: obj.__name__)
def test_public_docstring_has_summary_params_and_example(obj: Any) -> None:
    """A one-line summary on each public member, a ``:param`` line for each parameter, and one usage example."""
    missing = []
    for name, member in _members(obj):
        doc = inspect.getdoc(member) or ""
        summary = doc.split("\n\n")[0]
        if not doc or "\n" in summary.strip():
            missing.append(f"{name}: no one-line summary")
        lacking = [p for p in _parameters(member) if p not in _documented_params(member)]
        if lacking:
            missing.append(f"{name}: no :param line for {', '.join(lacking)}")
    if not CODE_BLOCK.findall(inspect.getdoc(obj) or ""):
        missing.append(f"{obj.__name__}: no usage example")
    assert not missing, "\n".join(missing)


def _examples() -> list[tuple[str, str]]:
    found = []
    for obj in DOCUMENTED:
        for name, member in _members(obj):
            for i, block in enumerate(CODE_BLOCK.findall(inspect.getdoc(member) or "")):
                found.append((f"{name}#{i}" if i else name, block))
    return found


@pytest.mark.parametrize(("where", "example"), _examples(), ids=[where for where, _ in _examples()])
def test_docstring_example_runs(where: str, example: str, example_folder: Path, monkeypatch) -> None:
    for hub_id, folder in HUB_STAND_INS.items():
        example = example.replace(f'"{hub_id}"', repr(folder))
    monkeypatch.chdir(example_folder)
    exec(compile(textwrap.dedent(example), f"<{where} docstring>", "exec"), {})
