"""Corpus input: JSONL, BEIR folders and plain text read into documents, and bad rows named by file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from care_retriever import read_corpus
from care_retriever.errors import InputError


def _write(path: Path, text: str | bytes) -> Path:
    (path.write_bytes if isinstance(text, bytes) else lambda t: path.write_text(t, encoding="utf-8"))(text)
    return path


def test_reads_jsonl_beir_folder_and_plain_text(tmp_path: Path, small_corpus_path: Path) -> None:
    docs = list(read_corpus(small_corpus_path))
    assert [d.id for d in docs] == ["a", "b", "c", "d", "e", "f"] and docs[0].metadata == {"group": "even"}
    beir = tmp_path / "beir"
    beir.mkdir()
    (beir / "corpus.jsonl").write_text(small_corpus_path.read_text("utf-8"), encoding="utf-8")
    assert [d.id for d in read_corpus(beir)] == [d.id for d in docs]
    plain = _write(tmp_path / "docs.txt", "第一篇\n\n第二篇\n")
    assert [(d.id, d.text) for d in read_corpus(plain)] == [("1", "第一篇"), ("3", "第二篇")]
    ids = _write(tmp_path / "ids.jsonl", '{"id": 7, "text": "整数 id"}\n')
    assert next(read_corpus(ids)).id == "7"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"_id": "a", "text": "ok"}\n{"_id": "b", "text": "   "}\n', r"corpus.jsonl:2: empty text"),
        ('{"text": "no id"}\n', r"corpus.jsonl:1: missing document id"),
        ('{"_id": "a"}\n', r'corpus.jsonl:1: missing field "text"'),
        (
            '{"_id": "a", "text": "x"}\n{"_id": "a", "text": "y"}\n',
            r"corpus.jsonl:2: duplicate document id 'a'",
        ),
        ('{"_id": "a", "text": "x"\n', r"corpus.jsonl:1: invalid JSON"),
        (b'{"_id": "a", "text": "\xff"}\n', r"corpus.jsonl:1: not valid UTF-8"),
        ('{"_id": "a", "text": "x", "metadata": [1]}\n', r'corpus.jsonl:1: "metadata" must be an object'),
    ],
)
def test_bad_corpus_rows_name_file_and_line(tmp_path: Path, content: str | bytes, message: str) -> None:
    path = _write(tmp_path / "corpus.jsonl", content)
    with pytest.raises(InputError, match=message):
        list(read_corpus(path))


def test_skip_invalid_keeps_the_good_rows(tmp_path: Path) -> None:
    path = _write(tmp_path / "corpus.jsonl", '{"_id": "a", "text": ""}\n{"_id": "b", "text": "好"}\n')
    assert [d.id for d in read_corpus(path, skip_invalid=True)] == ["b"]
