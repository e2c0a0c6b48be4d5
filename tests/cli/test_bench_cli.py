"""`care-retriever bench` on a tiny model: JSON, Markdown and the plot, with real stores and processes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from care_retriever.cli.main import main
from care_retriever.evaluation import speed


def test_bench_writes_json_table_and_plot(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    accuracy = tmp_path / "eval.jsonl"
    name = tiny_model_dir.name
    accuracy.write_text(
        "".join(
            json.dumps({"task": "t", "type": "retrieval", "model": m, "main_score": s}) + "\n"
            for m, s in ((name, 0.5), (f"{name}#query", 0.4), (f"{name}#document", 0.55))
        )
    )
    out = tmp_path / "bench"
    code = main(
        [
            "bench",
            "--model",
            str(tiny_model_dir),
            "--out",
            str(out),
            "--n-queries",
            "32",
            "--index-docs",
            "16",
            "--search-sizes",
            "300",
            "600",
            "--search-queries",
            "10",
            "--no-memory",  # three extra model-loading processes; the probe itself is tested below
            "--accuracy-from",
            str(accuracy),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads((out / "bench.json").read_text())
    roles = [m["role"] for m in data["models"]]
    assert roles[0] == "asymmetric" and roles[1].startswith("small symmetric") and roles[2].startswith("symmetric LLM")
    for m in data["models"]:
        assert m["query"]["batch_1"]["calls"] == 32 and m["query"]["batch_32"]["calls"] == 1
        assert m["query"]["batch_1"]["per_second"] > 0 and m["indexing_docs_per_s"] > 0
    # each row carries its own model's score from --accuracy-from (matched by name, not by position)
    assert [m["accuracy"] for m in data["models"]] == [0.5, 0.4, 0.55]
    # The asymmetric model and the symmetric LLM path index with the same document tower: timed once.
    assert data["models"][0]["indexing_docs_per_s"] == data["models"][2]["indexing_docs_per_s"]
    backends = {(s["backend"], s["n"]) for s in data["search"]}
    assert backends == {(b, n) for b in ("faiss-flat", "faiss-hnsw", "qdrant-edge") for n in (300, 600)}
    hnsw = [s for s in data["search"] if s["backend"] == "faiss-hnsw"]
    # Clustered corpus, queries near corpus points: HNSW finds (nearly) what exact search finds.
    assert all(0.9 <= s["recall@10_vs_exact"] <= 1.0 for s in hnsw)
    assert data["memory"] == {}
    table = (out / "bench.md").read_text()
    assert "| asymmetric |" in table and "faiss-hnsw" in table
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_a_non_care_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--model", str(tmp_path), "--out", str(tmp_path / "b")]) == 2
    assert "not a CARE model" in capsys.readouterr().err


def test_peak_rss_of_a_child_process() -> None:
    """The memory probe sees what a child allocates (300 MiB, touched), and not the memory of the
    process that starts it (Linux counts a forked child's inherited image in its ru_maxrss)."""
    parent_ballast = bytearray(400 * 1024 * 1024)
    parent_ballast[::4096] = b"x" * len(parent_ballast[::4096])
    small = speed.peak_rss_mb([sys.executable, "-c", "pass"])
    assert small < 200
    touch = "b = bytearray(300 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096])"
    big = speed.peak_rss_mb([sys.executable, "-c", touch])
    assert 250 < big - small < 400
    with pytest.raises(RuntimeError, match="exited 3"):
        speed.peak_rss_mb([sys.executable, "-c", "import sys; sys.exit(3)"])
    del parent_ballast


def test_recall_at_k() -> None:
    assert speed.recall_at_k([["a", "b"], ["c", "x"]], [["a", "b"], ["c", "d"]], k=2) == 0.75
