"""``python -m benchmarks.gpu_index`` on the CPU with the tiny tower, on a small slice: both sides measured on the
same texts, the figures present and sane, the doc's section written between its markers (others kept), and a
missing corpus skipped with a message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import gpu_index, gpu_index_measure, gpu_index_sides


def test_the_benchmark_runs_both_sides_and_writes_its_section(
    capsys, tmp_path: Path, small_corpus_path: Path, sample_corpus_path: Path
) -> None:
    doc = tmp_path / "gpu.md"
    doc.write_text(
        "# Indexing on GPUs\n\nprose kept\n\n<!-- gpu_index:cuda:begin -->\nH100 rows\n<!-- gpu_index:cuda:end -->\n"
    )
    args = ["--corpus", str(sample_corpus_path), "--corpus", str(tmp_path / "absent.jsonl"), "--limit", "60"]
    code = gpu_index.main([*args, "--batch-size", "16", "--rounds", "1", "--docs", str(doc), "--json"])
    assert code == 0
    out, err = capsys.readouterr()
    assert "skipping absent.jsonl" in err and "not found" in err
    result = json.loads(out)
    assert result["device_kind"] == "cpu" and result["tower"].startswith("tiny")
    (row,) = result["rows"]
    assert row["docs"] == 60 and row["batch_size"] == 16
    for side in ("index", "encode_document"):
        figures = row[side]
        assert figures["docs_per_second"] > 0 and figures["tokens_per_second"] > 0
        assert 1.0 <= figures["padding_ratio"] < 3 and 0 < figures["mfu"] < 1
    assert row["ratio"] == pytest.approx(
        row["index"]["docs_per_second"] / row["encode_document"]["docs_per_second"], rel=1e-2
    )
    text = doc.read_text()
    assert "prose kept" in text and "H100 rows" in text  # another device's section is left as it was
    assert text.count("<!-- gpu_index:cpu:begin -->") == 1 and "`encode_document`" in text
    assert "absent.jsonl: skipped" in text


def test_the_sides_take_turns_from_a_collected_heap(
    capsys, monkeypatch: pytest.MonkeyPatch, sample_corpus_path: Path
) -> None:
    """Each timed side starts from a full garbage collection (one falling inside a side cost it about 0.25 s on the
    CPU), the side going first alternates, and the median of the rounds' ratios is the rounds' own."""
    calls: list[str] = []
    seconds: dict[str, list[float]] = {"st": [], "index": []}

    def recorded(name: str, run: Any) -> Any:
        def wrapper(*args: Any) -> dict[str, Any]:
            figures = run(*args)
            calls.append(name)
            if len(args[1]) == 30:  # a timed run (the warm-up takes one batch)
                seconds[name].append(figures["seconds"])
            return figures

        return wrapper

    monkeypatch.setattr(gpu_index_sides, "run_st", recorded("st", gpu_index_sides.run_st))
    monkeypatch.setattr(gpu_index_sides, "run_index", recorded("index", gpu_index_sides.run_index))
    monkeypatch.setattr(gpu_index_measure.gc, "collect", lambda *a: calls.append("gc"))
    args = ["--corpus", str(sample_corpus_path), "--limit", "30", "--batch-size", "8", "--rounds", "3"]
    assert gpu_index.main([*args, "--no-write", "--json"]) == 0
    assert calls[:3] == ["gc", "index", "st"]  # the fp32 reference let go, then each side's warm-up
    timed = calls[3:]
    assert timed == ["gc", "index", "gc", "st", "gc", "st", "gc", "index", "gc", "index", "gc", "st"]
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    ratios = sorted(st / ix for st, ix in zip(seconds["st"], seconds["index"], strict=True))
    assert row["ratio_median_of_rounds"] == pytest.approx(ratios[1], abs=1e-3)


def test_no_corpus_is_a_message_not_an_error(capsys, tmp_path: Path) -> None:
    assert gpu_index.main(["--corpus", str(tmp_path / "none"), "--no-write"]) == 0
    assert "no corpus found" in capsys.readouterr().err


def test_flops_per_token_of_a_qwen3_4b_shape() -> None:
    from types import SimpleNamespace

    config = SimpleNamespace(**gpu_index.QWEN3_4B)
    # 36 layers of q/k/v/o and a 3-matrix MLP: about 3.6B multiplied weights, 2 FLOPs each
    assert gpu_index.flops_per_token(config, 0) == pytest.approx(2 * 3.62e9, rel=0.02)


def test_the_index_side_measures_encoding_with_no_bm25_side(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The writer builds a BM25 side by default; the benchmark's `index` side must not (it needs jieba, which a GPU
    machine may lack, and it is not encoding)."""
    from care_retriever.indexing.corpus import read_corpus
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.stores import open_store

    docs = list(read_corpus(Path(__file__).parents[2] / "care_retriever" / "data" / "sample" / "corpus.jsonl"))[:20]
    figures = gpu_index.run_index(
        AsymmetricEmbedder.from_pretrained(tiny_model_dir), docs, 8, "cpu", tmp_path / "store"
    )
    assert figures["tokens"] > 0
    store = open_store(f"faiss:{tmp_path / 'store'}")
    assert store.count() == 20 and not store.manifest.sparse


def test_training_walltime_flags_a_stage_below_half(tmp_path: Path) -> None:
    from benchmarks import training_walltime

    run = {
        "recipe": "paper",
        "init_seconds": 2.0,
        "reports": [
            {
                "name": "stage0-query",
                "type": "stage0_query",
                "steps": 10,
                "examples": 40,
                "seconds": 8.0,
                "wall_seconds": 10.0,
            },
            {
                "name": "stage1",
                "type": "stage1_align",
                "steps": 10,
                "examples": 40,
                "seconds": 3.0,
                "wall_seconds": 7.0,
                "teacher_cache_seconds": 0.5,
                "teacher_texts": 80,
                "teacher_forward": {"forward": "packed", "attention": "varlen_attn", "compile": "off"},
            },
        ],
    }
    (tmp_path / "run.json").write_text(json.dumps(run))
    doc = tmp_path / "gpu.md"
    doc.write_text("# Indexing on GPUs\n\nprose kept\n")
    assert training_walltime.main([str(tmp_path), "--device", "test box", "--docs", str(doc)]) == 0
    text = doc.read_text()
    assert "prose kept" in text and "| stage0-query | stage0_query | 10 | 40 | 8.00 | 10.00 | 80% |" in text
    assert "below one half: stage1" in text and "teacher cache 0.50 s for 80 texts" in text
    assert "teacher packed (varlen_attn) |" in text  # the forward the stage's teacher ran


def test_the_forward_sides_run_or_say_why_not(capsys, tmp_path: Path, sample_corpus_path: Path) -> None:
    """The CPU runs the padded and packed sides of the index and sentence-transformers at its defaults; the fp8 side
    says in its row why it did not run."""
    sides = "index padded,index packed,index fp8,encode_document,encode_document defaults"
    args = ["--corpus", str(sample_corpus_path), "--limit", "40", "--batch-size", "16", "--rounds", "1"]
    assert gpu_index.main([*args, "--sides", sides, "--no-write", "--json"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])["rows"][0]
    by_side = row["sides"]
    assert by_side["index packed"]["forward"] == "packed" and by_side["index packed"]["padding_ratio"] == 1.0
    assert by_side["index padded"]["forward"] == "padded" and by_side["index padded"]["padding_ratio"] >= 1.0
    assert by_side["encode_document defaults"]["batch"] == gpu_index.ST_DEFAULT_BATCH
    assert "docs_per_second" not in by_side["index fp8"]
    assert by_side["index fp8"]["not_run"].startswith("--dtype fp8 runs on CUDA GPUs")
    for label in ("index padded", "index packed", "encode_document defaults"):
        assert by_side[label]["docs_per_second"] > 0 and by_side[label]["vs_encode_document"] > 0


def test_each_side_is_read_against_the_towers_fp32_vectors(sample_corpus_path: Path) -> None:
    """The fidelity column: the same function gives cosine 1 to the fp32 reference, FP8's rounding less (and a
    side whose tower computes something else would show it)."""
    from care_retriever.indexing.corpus import read_corpus
    from care_retriever.model.fp8 import emulate_fp8
    from care_retriever.model.towers.scratch import init_from_scratch

    embedder = init_from_scratch("tiny", [sample_corpus_path])
    texts = [d.embedding_text() for d in read_corpus(sample_corpus_path)][:40]
    reference = gpu_index_measure.fidelity_reference(embedder, texts, "cpu")
    assert len(reference["texts"]) == 40
    same = gpu_index_measure.fidelity(gpu_index_sides.tower_copy(embedder), reference, "index packed")
    assert same["cosine_min"] >= 0.99999
    st_side = gpu_index_measure.fidelity(embedder, reference, "encode_document")
    assert st_side["cosine_min"] >= 0.99999
    rounded = gpu_index_sides.tower_copy(embedder)
    assert emulate_fp8(rounded.document_model) > 0
    fp8 = gpu_index_measure.fidelity(rounded, reference, "index fp8")
    assert 0.9 < fp8["cosine_min"] < 0.99999 and fp8["cosine_min"] <= fp8["cosine_mean"]


def test_only_measures_the_named_corpus_into_a_section_of_its_own(
    capsys, tmp_path: Path, sample_corpus_path: Path, small_corpus_path: Path
) -> None:
    doc = tmp_path / "gpu.md"
    sample, small = tmp_path / "sample.jsonl", tmp_path / "small.jsonl"
    sample.write_bytes(sample_corpus_path.read_bytes())
    small.write_bytes(small_corpus_path.read_bytes())
    args = ["--corpus", str(sample), "--corpus", str(small), "--limit", "20"]
    only = ["--only", "small.jsonl", "--sides", "index,encode_document", "--rounds", "1"]
    assert gpu_index.main([*args, *only, "--batch-size", "8", "--docs", str(doc), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [row["corpus"] for row in result["rows"]] == ["small.jsonl"]
    assert "<!-- gpu_index:cpu-small-jsonl:begin -->" in doc.read_text()
    with pytest.raises(SystemExit):
        gpu_index.main([*args, "--only", "absent", "--no-write"])


def test_sentence_transformers_sides_alone_make_a_report(capsys, sample_corpus_path: Path) -> None:
    """The report's line against the defaults needs an index side; without one the report still prints."""
    args = ["--corpus", str(sample_corpus_path), "--limit", "20", "--batch-size", "8", "--rounds", "1"]
    assert gpu_index.main([*args, "--sides", "encode_document,encode_document defaults", "--no-write"]) == 0
    assert "`encode_document defaults`" in capsys.readouterr().out


def test_fp8_fidelity_of_a_random_tower_reads_three_passes_and_resumes(
    capsys, tmp_path: Path, sample_corpus_path: Path
) -> None:
    """``fp8_fidelity --tower``: fp32, bf16 and FP8-rounded vectors of one random tower, their cosines by corpus,
    its section written; a second run reads the kept vectors and builds no tower."""
    import argparse
    import shutil

    from benchmarks.fp8_fidelity_tower import real_size

    folder = tmp_path / "sample"
    folder.mkdir()
    shutil.copy(sample_corpus_path, folder / "corpus.jsonl")
    doc = tmp_path / "gpu.md"
    args = argparse.Namespace(
        tower="tiny", layers=None, texts=24, batch_size=8, cache=tmp_path / "cache", docs=doc, no_write=False
    )
    assert real_size(args, {"sample": folder}, []) == 0
    first = capsys.readouterr()
    assert "tower built" in first.err
    result = json.loads(next(line for line in first.out.splitlines() if line.startswith("{")))
    cosine = {pair: figures["sample"] for pair, figures in result["cosine"].items()}
    assert result["texts"] == {"sample": 24} and result["linear_layers_rounded"] == 2 * 7
    assert 0.999 < cosine["bf16 vs fp32"]["min"] < 1  # bf16 rounds a little
    assert 0.9 < cosine["fp8 vs fp32"]["min"] < cosine["bf16 vs fp32"]["min"]  # FP8 more
    assert "<!-- gpu_index:fp8-real-size:begin -->" in doc.read_text("utf-8")
    assert real_size(args, {"sample": folder}, []) == 0
    again = capsys.readouterr()
    assert "tower built" not in again.err
    assert (
        json.loads(next(line for line in again.out.splitlines() if line.startswith("{")))["cosine"] == result["cosine"]
    )
