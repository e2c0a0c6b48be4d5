"""Hostile and careless input at the corpus door, and outputs a strict parser reads.

The corpus's format is decided by its content where its name does not say (a UTF-8 byte-order mark included); the
encodings and bytes no text corpus holds (UTF-16, NUL, lone surrogates) and NaN / Infinity in metadata are one line
naming the file, the line and the field, before anything is written; every JSON a command prints parses with a
strict parser; ``--prune`` that would delete more documents than the store keeps asks for ``--yes``.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from care_retriever.documents import Document, iter_jsonl, metadata_json
from care_retriever.errors import InputError
from care_retriever.indexing.corpus import corpus_format, read_corpus
from care_retriever.strict_json import dumps
from tests.support.cli import run_cli

ROWS = [{"_id": f"d{i}", "text": f"高血压患者第{i}条：应低盐饮食", "metadata": {"n": i}} for i in range(5)]
JSONL = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in ROWS).encode()


def strict_loads(text: str) -> Any:
    """``json.loads`` as a strict parser reads: ``NaN``, ``Infinity`` and ``-Infinity`` are errors."""

    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def corpus(tmp_path: Path, name: str, content: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


def refusal(path: Path) -> str:
    with pytest.raises(InputError) as caught:
        list(read_corpus(path))
    return str(caught.value)


# ------------------------------------------------------------------------------------------------ the corpus door
@pytest.mark.parametrize("name", ["corpus.jsonl", "corpus.txt", "corpus", "corpus.JSONL"])
@pytest.mark.parametrize("bom", [b"", codecs.BOM_UTF8], ids=["plain", "bom"])
def test_jsonl_is_read_as_jsonl_whatever_its_name_and_with_a_bom(tmp_path: Path, name: str, bom: bytes) -> None:
    docs = list(read_corpus(corpus(tmp_path, name, bom + JSONL)))
    assert [d.id for d in docs] == [r["_id"] for r in ROWS]
    assert [d.text for d in docs] == [r["text"] for r in ROWS] and docs[0].metadata == {"n": 0}


def test_plain_text_is_one_document_per_line(tmp_path: Path) -> None:
    path = corpus(tmp_path, "notes.txt", codecs.BOM_UTF8 + "高血压应低盐饮食\n\n{感冒} 多休息\n".encode())
    assert corpus_format(path) == "text"
    assert [(d.id, d.text) for d in read_corpus(path)] == [("1", "高血压应低盐饮食"), ("3", "{感冒} 多休息")]


def test_plain_text_whose_first_line_starts_with_a_brace_is_refused_not_misread(tmp_path: Path) -> None:
    path = corpus(tmp_path, "notes.txt", "{注意} 高血压应低盐饮食\n感冒多休息\n".encode())
    assert corpus_format(path) == "jsonl"
    message = refusal(path)
    assert message.startswith(f"{path}:1: invalid JSON") and "read as JSONL: its first line starts with '{'" in message


def test_a_jsonl_file_named_so_says_nothing_about_its_content(tmp_path: Path) -> None:
    message = refusal(corpus(tmp_path, "c.jsonl", b'{"_id": "a", "text": "x"}\nnot json\n'))
    assert message.endswith(":2: invalid JSON (Expecting value)")


@pytest.mark.parametrize(
    ("encoding", "expected"),
    [("utf-16", "the file is UTF-16"), ("utf-32", "the file is UTF-32"), ("utf-16-le", "a UTF-16 or binary file")],
)
def test_wide_encodings_are_named_at_line_one(tmp_path: Path, encoding: str, expected: str) -> None:
    for name in ("c.jsonl", "c.txt"):
        path = corpus(tmp_path, name, JSONL.decode().encode(encoding))
        message = refusal(path)
        assert message.startswith(f"{path}:1: ") and expected in message, message


@pytest.mark.parametrize(("name", "second"), [("c.jsonl", b'{"_id": "b", "text": "y\x00z"}'), ("c.txt", b"y\x00z")])
def test_a_nul_byte_names_its_line(tmp_path: Path, name: str, second: bytes) -> None:
    path = corpus(tmp_path, name, b'{"_id": "a", "text": "x"}\n' + second + b"\n")
    where = second.index(b"\x00")
    assert refusal(path) == f"{path}:2: NUL byte at character {where} (a UTF-16 or binary file? save it as UTF-8)"


def test_an_escaped_nul_is_a_character_like_any_other(tmp_path: Path) -> None:
    (doc,) = read_corpus(corpus(tmp_path, "c.jsonl", b'{"_id": "a", "text": "x\\u0000y"}\n'))
    assert doc.text == "x\x00y"


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ('{"_id": "a", "text": "x\\ud800y"}', '"text"'),
        ('{"_id": "a", "text": "x", "title": "\\udfff"}', '"title"'),
        ('{"_id": "\\ud800", "text": "x"}', '"id"'),
        ('{"_id": "a", "text": "x", "metadata": {"k": ["\\udc00"]}}', '"metadata"'),
    ],
)
def test_lone_surrogates_are_refused_at_the_door_naming_line_and_field(tmp_path: Path, row: str, field: str) -> None:
    path = corpus(tmp_path, "c.jsonl", b'{"_id": "ok", "text": "x"}\n' + row.encode() + b"\n")
    message = refusal(path)
    assert message.startswith(f"{path}:2: {field}: not valid Unicode (lone surrogate"), message


def test_skip_invalid_skips_and_counts_a_lone_surrogate_like_any_invalid_row(
    tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    """``index --skip-invalid``: a row whose text holds a lone surrogate is skipped and counted with the other
    invalid rows (the summary names how many and the first); without the flag it is one line naming file:line."""
    rows = [
        b'{"_id": "a", "text": "\xe9\xab\x98\xe8\xa1\x80\xe5\x8e\x8b"}',
        b'{"_id": "s", "text": "x\\ud800y"}',  # a lone surrogate, spelled as a JSON escape
        b"not json",
        b'{"_id": "b", "text": "y", "title": "\\udfff"}',  # another, in the title
        b'{"_id": "c", "text": "\xe6\x84\x9f\xe5\x86\x92"}',
    ]
    path = corpus(tmp_path, "c.jsonl", b"\n".join(rows) + b"\n")
    spec = f"faiss:{tmp_path / 'store'}"
    base = ("index", "--model", tiny_model_dir, "--corpus", path, "--store", spec, "--no-progress")
    code, out, err = run_cli(capsys, *base)
    assert code == 2 and err.strip().endswith(f'{path}:2: "text": not valid Unicode (lone surrogate at character 1)')
    assert "\n" not in err.strip() and not (tmp_path / "store").exists()
    code, out, err = run_cli(capsys, *base, "--skip-invalid")
    assert code == 0, err
    assert out.strip().endswith(
        f'3 invalid row(s) skipped (first: {path}:2: "text": not valid Unicode (lone surrogate at character 1))'
    ), out
    code, out, err = run_cli(capsys, *base, "--skip-invalid", "--json")
    assert code == 0 and strict_loads(out)["skipped_invalid"] == 3, out
    code, out, _ = run_cli(capsys, "info", "--store", spec, "--json")
    assert strict_loads(out)["count"] == 2


@pytest.mark.parametrize(
    ("rows", "line", "duplicate"),
    [
        ('{"_id": "1", "text": "a"}\n{"id": 1, "text": "b"}\n', 2, "1"),  # a string and an integer id
        ('{"_id": "a", "text": "a"}\n{"_id": "b", "text": "b"}\n{"_id": "a", "text": "c"}\n', 3, "a"),
    ],
)
def test_id_collisions_name_the_second_line(tmp_path: Path, rows: str, line: int, duplicate: str) -> None:
    path = corpus(tmp_path, "c.jsonl", rows.encode())
    assert refusal(path) == f"{path}:{line}: duplicate document id {duplicate!r}"


@pytest.mark.parametrize(
    ("metadata", "where", "token"),
    [
        ("NaN", "metadata.v", "NaN"),
        ("Infinity", "metadata.v", "Infinity"),
        ("-Infinity", "metadata.v", "-Infinity"),
        ('{"w": [1, 1e999]}', "metadata.v.w[1]", "Infinity"),  # a number too large for a float is one too
    ],
)
def test_non_finite_metadata_is_refused_naming_file_line_and_field(
    tmp_path: Path, metadata: str, where: str, token: str
) -> None:
    path = corpus(
        tmp_path,
        "c.txt",
        b'{"_id": "ok", "text": "x"}\n' + f'{{"_id": "n", "text": "x", "metadata": {{"v": {metadata}}}}}\n'.encode(),
    )
    assert refusal(path) == (
        f"{path}:2: document 'n': {where} is {token}: JSON has no NaN or Infinity "
        "(write null, or the number as a string)"
    )


def test_task_and_training_files_skip_a_bom_too(tmp_path: Path) -> None:
    path = corpus(tmp_path, "queries.jsonl", codecs.BOM_UTF8 + b'{"_id": "q1", "text": "x"}\n')
    assert [row for _, row in iter_jsonl(path)] == [{"_id": "q1", "text": "x"}]


# ------------------------------------------------------------------------------------------------ the other doors
def test_python_writer_and_adapters_refuse_non_finite_metadata(tiny_model_dir: Path, tmp_path: Path) -> None:
    from care_retriever import AsymmetricEmbedder, DocumentStoreWriter
    from care_retriever.integrations.common import to_core_document

    message = "document 'n': metadata.scores[1] is NaN: JSON has no NaN or Infinity"
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        metadata_json("n", {"scores": [0.5, math.nan]})
    with pytest.raises(InputError, match=r"metadata.scores\[1\] is NaN"):
        to_core_document("n", "感冒", {"scores": [0.5, math.nan]})
    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="document")
    writer = DocumentStoreWriter(embedder, f"faiss:{tmp_path / 'store'}", show_progress=False)
    with pytest.raises(InputError, match=r"metadata.scores\[1\] is NaN"):
        writer.write([Document("ok", "感冒"), Document("n", "发烧", metadata={"scores": [0.5, math.nan]})])
    assert writer.store.manifest is None  # nothing was written
    writer.store.close()


def test_async_langchain_embeddings_refuse_empty_text_as_the_sync_ones(tiny_model_dir: Path) -> None:
    pytest.importorskip("langchain_core")
    from care_retriever.integrations.langchain import CareEmbeddings

    embeddings = CareEmbeddings(model=str(tiny_model_dir), device="cpu")
    for texts in (["感冒", ""], ["感冒", "  \n"]):
        with pytest.raises(InputError, match="empty text for document '#1'") as sync:
            embeddings.embed_documents(texts)
        with pytest.raises(InputError) as not_sync:
            asyncio.run(embeddings.aembed_documents(texts))
        assert str(not_sync.value) == str(sync.value)


# --------------------------------------------------------------------------------------------------------- outputs
def test_the_one_json_writer_is_strict() -> None:
    value = {"score": math.nan, "rows": [math.inf, -math.inf, 1.5], "text": "高血压"}
    assert strict_loads(dumps(value)) == {"score": None, "rows": [None, None, 1.5], "text": "高血压"}
    assert strict_loads(dumps(value, indent=2)) == strict_loads(dumps(value, compact=True))
    assert dumps({"a": 1}, compact=True) == '{"a":1}'


def test_every_json_a_command_prints_parses_strictly(capsys, tiny_model_dir: Path, tmp_path: Path) -> None:
    """A store written before the doors refused NaN holds one: ``search --json`` still prints strict JSON (null)."""
    from care_retriever import AsymmetricEmbedder
    from care_retriever.stores import open_store

    path = corpus(tmp_path, "c.txt", codecs.BOM_UTF8 + JSONL)
    spec = f"faiss:{tmp_path / 'store'}"
    code, out, err = run_cli(
        capsys, "index", "--model", tiny_model_dir, "--corpus", path, "--store", spec, "--no-progress", "--json"
    )
    assert code == 0, err
    assert strict_loads(out)["count"] == len(ROWS)
    # a document stored around the doors (the store's own API), as a store of an earlier release could hold it
    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="document")
    store = open_store(spec)
    store.prepare(embedder.dim, embedder.space_fingerprint, embedder.document_model_name, metric=embedder.similarity)
    legacy = Document("old", "高血压患者第9条：应低盐饮食", metadata={"v": math.nan, "w": [math.inf]})
    store.upsert([legacy], embedder.embed_documents([legacy.embedding_text()]))
    store.finalize()
    store.close()
    code, out, err = run_cli(
        capsys, "search", "--model", tiny_model_dir, "--store", spec, "--json", "--top-k", "6", "高血压", "低盐"
    )
    assert code == 0, err
    lines = [strict_loads(line) for line in out.splitlines()]
    assert [row["query"] for row in lines] == ["高血压", "低盐"]
    found = {h["id"]: h["metadata"] for h in lines[0]["hits"]}
    assert found["old"] == {"v": None, "w": [None]} and found["d0"] == {"n": 0}
    code, out, err = run_cli(capsys, "info", "--store", spec, "--json")
    assert code == 0, err
    assert strict_loads(out)["count"] == len(ROWS) + 1


# ----------------------------------------------------------------------------------------------------------- prune
def test_prune_that_deletes_more_than_it_keeps_asks_for_yes(capsys, tiny_model_dir: Path, tmp_path: Path) -> None:
    from care_retriever.stores import open_store

    spec = f"faiss:{tmp_path / 'store'}"
    full = corpus(tmp_path, "full.jsonl", JSONL)
    assert (
        run_cli(capsys, "index", "--model", tiny_model_dir, "--corpus", full, "--store", spec, "--no-progress")[0] == 0
    )

    def index(rows: list[dict], *flags: str) -> tuple[int, str, str]:
        part = corpus(tmp_path, "part.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())
        return run_cli(
            capsys,
            "index",
            "--model",
            tiny_model_dir,
            "--corpus",
            part,
            "--store",
            spec,
            "--no-progress",
            "--prune",
            *flags,
        )

    def held() -> list[str]:
        store = open_store(spec)
        ids = sorted(d.id for d in store.iter_documents())
        store.close()
        return ids

    for rows in ([], ROWS[:2]):  # an empty corpus would delete all 5; two documents would delete 3 and keep 2
        code, out, err = index(rows)
        assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
        assert f"--prune would delete {5 - len(rows)} of the 5 documents" in err and "add --yes" in err
        assert held() == [r["_id"] for r in ROWS]  # nothing deleted, nothing written
    code, out, err = index(ROWS[:3])  # deletes 2, keeps 3: no question asked, and the report says what went
    assert code == 0 and "2 deleted; 3 documents" in out, err
    code, out, err = index([], "--yes")
    assert code == 0 and "3 deleted; 0 documents" in out, err
    assert held() == []


def test_no_door_prints_json_but_through_the_strict_writer() -> None:
    """Every command and the service write JSON through ``strict_json.dumps``: a new ``json.dumps`` in a door (the
    ``copy`` command's report once had one) could print ``NaN`` again."""
    root = Path(__file__).resolve().parents[2] / "care_retriever"
    doors = [*sorted((root / "cli").glob("*.py")), root / "search" / "server.py", root / "search" / "service_schema.py"]
    printed = re.compile(r"(?:echo|write|write_text|Response)\((?:[^()]|\([^()]*\))*?(?<!strict_)json\.dumps\(")
    offenders = [str(p.relative_to(root)) for p in doors if printed.search(p.read_text(encoding="utf-8"))]
    assert offenders == []
