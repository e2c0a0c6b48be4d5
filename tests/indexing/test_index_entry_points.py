"""One indexing path: ``care-retriever index`` and ``torchrun -m care_retriever.index`` are one command.

Same options (help of both entry points), same validation (one-line errors, nothing written), and a
torchrun world of one process builds the store the CLI builds, FAISS build options included.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from care_retriever.cli.main import main as cli_main
from care_retriever.index import main as index_main

WORDS = ["高血压", "感冒", "糖尿病", "腹泻", "失眠", "发烧", "宝宝", "饮食", "运动", "就医", "降压药", "脱水"]


def _help_options(capsys: pytest.CaptureFixture[str], run) -> set[str]:
    assert run() == 0
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", capsys.readouterr().out))


def test_both_entry_points_take_the_same_options(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "240")  # rich wraps help to the terminal width
    cli = _help_options(capsys, lambda: cli_main(["index", "--help"]))
    torchrun = _help_options(capsys, lambda: index_main(["--help"]))
    assert cli == torchrun
    # what each path lacked before they were one: build options on the torchrun side, its options on the CLI's
    assert {
        "--pq-m",
        "--ef-construction",
        "--ef-search",
        "--nprobe",
        "--dist-backend",
        "--timeout-minutes",
        "--checkpoint-every",
        "--update",
        "--prune",
    } <= cli
    # the process group's backend has its own name: --backend is search's and serve's query backend
    assert "--backend" not in cli


def _corpus(path: Path, n: int = 40) -> Path:
    rng = np.random.default_rng(1)
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            text = "".join(rng.choice(WORDS, size=int(rng.integers(1, 10))))
            title = "" if i % 3 else str(rng.choice(WORDS))
            fh.write(
                json.dumps({"_id": f"d{i}", "title": title, "text": text, "metadata": {"i": i}}, ensure_ascii=False)
                + "\n"
            )
    return path


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--checkpoint-every", "0"], "--checkpoint-every must be an integer >= 1, got 0"),
        (["--pq-m", "0"], "FAISS index option pq_m (--pq-m) must be an integer >= 1, got 0"),
        (["--index-type", "lsh"], "Unknown FAISS index type 'lsh'. Available: ['flat', 'hnsw', 'ivf', 'ivfpq']"),
        (["--dist-backend", "mpi"], "Unknown --dist-backend 'mpi'. Available backends: ['auto', 'nccl', 'gloo']"),
    ],
)
def test_both_entry_points_reject_bad_options_alike(
    capsys, tiny_model_dir: Path, small_corpus_path: Path, tmp_path: Path, option: list[str], message: str
) -> None:
    errors = []
    for run in (lambda a: cli_main(["index", *a]), index_main):
        args = [
            "--model",
            str(tiny_model_dir),
            "--corpus",
            str(small_corpus_path),
            "--store",
            f"faiss:{tmp_path / 's'}",
            *option,
        ]
        code = run(args)
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and message in lines[0], err
        errors.append(lines[0])
    assert errors[0] == errors[1]
    assert not (tmp_path / "s").exists() and not (tmp_path / ".s.staging").exists()


def test_update_needs_an_existing_store(capsys, tiny_model_dir: Path, small_corpus_path: Path, tmp_path: Path) -> None:
    args = [
        "index",
        "--model",
        str(tiny_model_dir),
        "--corpus",
        str(small_corpus_path),
        "--store",
        f"faiss:{tmp_path / 's'}",
        "--no-progress",
        "--json",
    ]
    assert cli_main([*args, "--update"]) == 2
    assert "holds no index yet" in capsys.readouterr().err
    assert not (tmp_path / "s").exists() and not (tmp_path / ".s.staging").exists()
    assert cli_main(args) == 0
    assert json.loads(capsys.readouterr().out)["added"] == 6
    assert cli_main([*args, "--update"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["added"], report["unchanged"], report["count"]) == (0, 6, 6)


def _torchrun() -> list[str]:
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


def _state(folder: Path, queries: np.ndarray) -> tuple[dict, list, list]:
    from care_retriever.stores.faiss import FaissStore

    store = FaissStore(folder)
    manifest = store.require_manifest().to_dict()
    docs = [(d.id, d.title, d.text, d.metadata) for d in store.iter_documents()]
    hits = [[(h.id, round(h.score, 5)) for h in row] for row in store.search(queries, 10)]
    store.close()
    return manifest, docs, hits


@pytest.mark.slow
def test_torchrun_world_of_one_equals_the_cli(capsys, tiny_model_dir: Path, tmp_path: Path) -> None:
    from care_retriever.model.embedder import AsymmetricEmbedder

    corpus = _corpus(tmp_path / "corpus.jsonl")
    options = [
        "--model",
        str(tiny_model_dir),
        "--corpus",
        str(corpus),
        "--batch-size",
        "4",
        "--chunk-size",
        "16",
        "--checkpoint-every",
        "16",
        "--index-type",
        "hnsw",
        "--hnsw-m",
        "8",
        "--ef-construction",
        "40",
        "--ef-search",
        "24",
        "--no-progress",
        "--json",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [
            *_torchrun(),
            "--standalone",
            "--nproc-per-node",
            "1",
            "-m",
            "care_retriever.index",
            *options,
            "--store",
            f"faiss:{tmp_path / 'torchrun'}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sharded = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))

    assert cli_main(["index", *options, "--store", f"faiss:{tmp_path / 'cli'}"]) == 0
    single = json.loads(capsys.readouterr().out)

    skip = {"store", "seconds", "docs_per_second", "tokens_per_second"}
    assert {k: v for k, v in sharded.items() if k not in skip} == {k: v for k, v in single.items() if k not in skip}
    assert (single["world_size"], single["dist_backend"], single["added"]) == (1, "single-process", 40)

    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="query")
    queries = embedder.embed_queries(["高血压饮食", "宝宝发烧", "失眠怎么办"])
    a_manifest, a_docs, a_hits = _state(tmp_path / "torchrun", queries)
    b_manifest, b_docs, b_hits = _state(tmp_path / "cli", queries)
    assert a_manifest["index"] == b_manifest["index"]
    assert (a_manifest["index"]["type"], a_manifest["index"]["m"], a_manifest["index"]["ef_search"]) == ("hnsw", 8, 24)
    for key in ("dim", "space_fingerprint", "model_name", "count", "backend"):
        assert a_manifest[key] == b_manifest[key], key
    assert a_docs == b_docs and len(a_docs) == 40
    assert a_hits == b_hits
