"""Corpora in the formats users have: JSONL, JSON arrays, CSV/TSV with a header, Parquet, saved Hugging Face
datasets and plain text, each read streaming into the same documents, and a file that looks like one format and is
not refused in one line naming file:line."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from care_retriever.errors import InputError
from care_retriever.indexing import corpus_readers
from care_retriever.indexing.config import CorpusConfig
from care_retriever.indexing.corpus import corpus_format, read_corpus

ROWS = [
    {"_id": f"d{i}", "title": "指南" if i % 2 else "", "text": f'高血压第{i}篇, "低盐"\t饮食', "source": f"s{i % 3}"}
    for i in range(7)
]


def write_corpus(folder: Path, fmt: str) -> Path:
    """``ROWS`` saved in ``fmt``, as a user would have them."""
    if fmt == "jsonl":
        path = folder / "corpus.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in _jsonl_rows()), "utf-8")
    elif fmt == "json":
        path = folder / "corpus.json"
        path.write_text(json.dumps(_jsonl_rows(), ensure_ascii=False, indent=2), "utf-8")
    elif fmt == "csv":
        path = folder / "corpus.csv"
        with path.open("w", encoding="utf-8", newline="") as fh:
            writer = csv.DictWriter(fh, list(ROWS[0]))
            writer.writeheader()
            writer.writerows(ROWS)
    elif fmt == "tsv":  # tab-separated values as the IANA type has them: no quoting, no tab in a field
        path = folder / "corpus.tsv"
        lines = ["\t".join(ROWS[0])] + ["\t".join(v.replace("\t", " ") for v in r.values()) for r in ROWS]
        path.write_text("\n".join(lines) + "\n", "utf-8")
    elif fmt == "parquet":
        pa = pytest.importorskip("pyarrow")
        pq = pytest.importorskip("pyarrow.parquet")
        path = folder / "corpus.parquet"
        pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=3)  # three row groups
    elif fmt == "hf":
        datasets = pytest.importorskip("datasets")
        path = folder / "dataset"
        datasets.Dataset.from_list(ROWS).save_to_disk(str(path))
    else:
        raise AssertionError(fmt)
    return path


def _jsonl_rows() -> list[dict]:
    return [{**{k: r[k] for k in ("_id", "title", "text")}, "metadata": {"source": r["source"]}} for r in ROWS]


def _expected_text(fmt: str) -> list[str]:
    return [r["text"].replace("\t", " ") if fmt == "tsv" else r["text"] for r in ROWS]


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "tsv", "parquet", "hf"])
def test_each_format_reads_the_same_documents(tmp_path: Path, fmt: str) -> None:
    path = write_corpus(tmp_path, fmt)
    assert corpus_format(path) == fmt
    docs = list(read_corpus(path))
    assert [d.id for d in docs] == [r["_id"] for r in ROWS]
    assert [d.text for d in docs] == _expected_text(fmt)
    assert [d.title for d in docs] == [r["title"] for r in ROWS]
    assert [d.metadata for d in docs] == [{"source": r["source"]} for r in ROWS]


def test_a_json_array_is_recognised_by_content_whatever_the_name(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text(json.dumps(_jsonl_rows(), ensure_ascii=False), "utf-8")  # one line, no newline at all
    assert corpus_format(path) == "json"
    assert [d.id for d in read_corpus(path)] == [r["_id"] for r in ROWS]


def test_a_json_array_streams_across_chunk_boundaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_corpus(tmp_path, "json")
    monkeypatch.setattr(corpus_readers, "CHUNK_CHARS", 5)  # every element split over several reads
    docs = list(read_corpus(path))
    assert [d.text for d in docs] == _expected_text("json") and docs[-1].metadata == {"source": ROWS[-1]["source"]}
    bad = tmp_path / "bad.json"
    bad.write_text('[\n  {"_id": "a", "text": "x"},\n  {"_id": "b", "text": "y"}\n  {"_id": "c", "text": "z"}\n]')
    with pytest.raises(InputError, match=r"bad\.json:4: invalid JSON \(expected ',' or ']' after an element\)"):
        list(read_corpus(bad))


def test_columns_are_mapped_with_the_field_flags(tmp_path: Path) -> None:
    path = tmp_path / "pubmed.csv"
    path.write_text("pmid,headline,abstract,year\n11,高血压,低盐饮食,2020\n12,,多休息,\n", "utf-8")
    with pytest.raises(InputError) as caught:
        list(read_corpus(path))
    assert str(caught.value) == (
        f'{path}:1: no id column "_id" or "id" (columns: pmid, headline, abstract, year); name it with --id-field'
    )
    config = CorpusConfig(id_field="pmid", text_field="abstract", title_field="headline")
    docs = list(read_corpus(path, config))
    assert [(d.id, d.title, d.text, d.metadata) for d in docs] == [
        ("11", "高血压", "低盐饮食", {"year": "2020"}),
        ("12", "", "多休息", {}),
    ]


def test_plain_text_only_for_txt_or_when_asked(tmp_path: Path) -> None:
    table = tmp_path / "table.csv"
    table.write_text("id,text\n1,高血压\n", "utf-8")
    assert [(d.id, d.text) for d in read_corpus(table)] == [("1", "高血压")]  # the header is no document
    lines = [(d.id, d.text) for d in read_corpus(table, CorpusConfig(format="text"))]
    assert lines == [("1", "id,text"), ("2", "1,高血压")]
    unnamed = tmp_path / "corpus"
    unnamed.write_text("高血压\n感冒\n", "utf-8")
    with pytest.raises(InputError, match=r"cannot tell the corpus format .* give --format"):
        list(read_corpus(unnamed))
    assert len(list(read_corpus(unnamed, CorpusConfig(format="text")))) == 2
    with pytest.raises(InputError, match=r"Unknown --format 'xml'"):
        CorpusConfig(format="xml")


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "a.csv",
            "id,body\n1,x\n",
            r'a\.csv:1: no text column "text" \(columns: id, body\); name it with --text-field',
        ),
        ("a.csv", "id,text\n1,x\n2,y,z\n", r"a\.csv:3: 3 fields, the header has 2"),
        ("a.csv", 'id,text\n1,"x\n2,y\n', r"a\.csv:\d+: not valid CSV"),
        ("a.csv", "id,text\n1,x\n1,y\n", r"a\.csv:3: duplicate document id '1'"),
        ("a.tsv", "id\ttext\n1\t \n", r"a\.tsv:2: empty text for document '1'"),
        ("a.json", '[{"_id": "a", "text": "x"},\n 7]', r"a\.json:2: expected a JSON object, got int"),
        ("a.json", '[{"_id": "a", "text": "x"}] trailing', r"a\.json:1: text after the JSON array's closing"),
        ("a.json", '[{"_id": "a", "text": "x"},\n{"_id": "b", "text": ', r"a\.json:2: invalid JSON"),
        ("a.parquet", "id,text\n1,x\n", r"a\.parquet: not a Parquet file"),
    ],
)
def test_a_file_that_is_not_what_it_looks_like_is_one_line(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(content, "utf-8")
    with pytest.raises(InputError, match=message) as caught:
        list(read_corpus(path))
    assert "\n" not in str(caught.value)


def test_skip_invalid_skips_a_bad_table_row(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("id,text\n1,x\n2,y,z\n3,w\n", "utf-8")
    assert [d.id for d in read_corpus(path, skip_invalid=True)] == ["1", "3"]


@pytest.mark.parametrize(
    ("fmt", "module", "extra"), [("parquet", "pyarrow", "pyarrow"), ("hf", "datasets", "datasets")]
)
def test_a_missing_optional_reader_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, module: str, extra: str
) -> None:
    path = write_corpus(tmp_path, fmt)
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed
    with pytest.raises(InputError) as caught:
        list(read_corpus(path))
    assert str(caught.value).endswith(f"needs {extra}: pip install 'care-retriever[corpus]'")


def test_a_dataset_with_several_splits_asks_for_one(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "dd"
    part = datasets.Dataset.from_list(ROWS)
    datasets.DatasetDict({"train": part, "test": part}).save_to_disk(str(folder))
    with pytest.raises(InputError, match=r"the dataset has splits train, test; give one's folder"):
        list(read_corpus(folder))
    assert len(list(read_corpus(folder / "train"))) == len(ROWS)


def _cli(capsys, *args: object) -> tuple[int, str, str]:
    from care_retriever.cli.main import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "tsv", "parquet", "hf", "mapped", "text"])
def test_index_reads_each_format_end_to_end(capsys, tmp_path: Path, tiny_model_dir: Path, fmt: str) -> None:
    flags: list[str] = []
    if fmt == "mapped":  # a table whose columns are named otherwise, mapped with the flags
        path = tmp_path / "pubmed.csv"
        with path.open("w", encoding="utf-8", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["pmid", "abstract", "headline", "source"])
            writer.writerows([r["_id"], r["text"], r["title"], r["source"]] for r in ROWS)
        flags = ["--id-field", "pmid", "--text-field", "abstract", "--title-field", "headline"]
    elif fmt == "text":
        path = tmp_path / "notes.csv"  # named like a table, read as lines because asked
        path.write_text("".join(r["text"].replace("\t", " ") + "\n" for r in ROWS), "utf-8")
        flags = ["--format", "text"]
    else:
        path = write_corpus(tmp_path, fmt)
    store = f"faiss:{tmp_path / 'store'}"
    code, out, err = _cli(
        capsys,
        "index",
        "--model",
        tiny_model_dir,
        "--corpus",
        path,
        "--store",
        store,
        "--no-progress",
        "--json",
        *flags,
    )
    assert code == 0, err
    assert json.loads(out)["count"] == len(ROWS)
    code, out, err = _cli(
        capsys, "search", "高血压", "--model", tiny_model_dir, "--store", store, "--json", "--top-k", 7
    )
    assert code == 0, err
    hits = {h["id"]: h for h in json.loads(out)["hits"]}
    if fmt == "text":
        assert sorted(hits) == sorted(str(n) for n in range(1, len(ROWS) + 1))
        return
    assert sorted(hits) == sorted(r["_id"] for r in ROWS)
    assert hits["d5"]["title"] == "指南" and hits["d5"]["metadata"] == {"source": "s2"}


def test_index_of_a_malformed_table_is_one_line_and_writes_nothing(
    capsys, tmp_path: Path, tiny_model_dir: Path
) -> None:
    path = tmp_path / "corpus.csv"
    path.write_text("id,text\n1,高血压\n2,感冒,多休息\n", "utf-8")
    store = tmp_path / "store"
    code, _, err = _cli(capsys, "index", "--model", tiny_model_dir, "--corpus", path, "--store", f"faiss:{store}")
    assert code != 0 and err.strip() == f"error: {path}:3: 3 fields, the header has 2"
    assert not store.exists()
