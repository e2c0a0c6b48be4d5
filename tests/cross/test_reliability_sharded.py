"""``torchrun --nproc-per-node 2 -m care_retriever.index`` (gloo, CPU) builds the index one process builds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from care_retriever import AsymmetricEmbedder, CareRetriever, DocumentStoreWriter, read_corpus
from care_retriever.indexing.config import EncodeConfig
from care_retriever.stores.faiss import FaissStore

pytestmark = pytest.mark.slow
WORDS = ["高血压", "感冒", "糖尿病", "腹泻", "失眠", "发烧", "宝宝", "饮食", "运动", "就医", "降压药", "脱水"]


def _torchrun() -> list[str]:
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


# The entry torchrun starts (``-m care_retriever.index``), then a check: the process group's threads (gloo's) ended
# with it. Left alive, they outlived destroy_process_group into the interpreter's exit, where rank 0 aborted now and
# then in C++ ("terminate called without an active exception", 1 run of the whole suite in 4 under load).
ENTRY = """
import os, sys
from care_retriever.index import main
code = main()
tasks = (open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
left = sorted(name for name in tasks if "gloo" in name)
if left:
    print(f"rank {os.environ.get('RANK')}: the process group's threads outlived it: {left}", file=sys.stderr)
    sys.exit(3)
sys.exit(code)
"""


def _rows(folder: Path) -> tuple[dict[str, int], dict[str, np.ndarray]]:
    store = FaissStore(folder)
    ids = [d.id for d in store.iter_documents()]  # row order: the order they were written
    rows = {i: n for n, i in enumerate(ids)}
    vectors = dict(zip(ids, store.vectors(ids), strict=True))
    store.close()
    return rows, vectors


def test_two_gloo_processes_equal_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    corpus = tmp_path / "corpus.jsonl"
    with corpus.open("w", encoding="utf-8") as fh:
        for i in range(257):  # 4 chunks of 64, then 1 document: uneven slices, and an empty one for rank 1
            text = "".join(rng.choice(WORDS, size=int(rng.integers(1, 12))))
            fh.write(json.dumps({"_id": f"d{i}", "text": text}, ensure_ascii=False) + "\n")
    sharded = tmp_path / "sharded"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    entry = tmp_path / "entry.py"
    entry.write_text(ENTRY, encoding="utf-8")
    cmd = [
        *_torchrun(),
        "--standalone",
        "--nproc-per-node",
        "2",
        str(entry),
        "--model",
        str(tiny_model_dir),
        "--corpus",
        str(corpus),
        "--store",
        f"faiss:{sharded}",
        "--batch-size",
        "8",
        "--chunk-size",
        "64",
        "--checkpoint-every",
        "64",
        "--no-progress",
        "--json",
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    # the report on stdout says whether the run had finished; stderr names threads left alive (ENTRY)
    assert done.returncode == 0, f"stdout: {done.stdout[-800:]!r}\nstderr: {done.stderr[-3000:]}"
    report = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    assert (report["world_size"], report["dist_backend"], report["added"], report["count"]) == (2, "gloo", 257, 257)

    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir)
    single = tmp_path / "single"
    DocumentStoreWriter(
        embedder,
        f"faiss:{single}",
        show_progress=False,
        encode=EncodeConfig(batch_size=8, chunk_size=64, checkpoint_every=64),
    ).write(read_corpus(corpus))
    rows_a, vec_a = _rows(sharded)
    rows_b, vec_b = _rows(single)
    assert rows_a == rows_b  # same ids in the same order: rank 0 wrote what one process writes
    np.testing.assert_allclose(np.stack([vec_a[i] for i in rows_b]), np.stack([vec_b[i] for i in rows_b]), atol=1e-5)
    queries = ["高血压饮食", "宝宝发烧", "失眠"]
    a, b = CareRetriever(f"faiss:{sharded}", embedder), CareRetriever(f"faiss:{single}", embedder)
    assert [[h.id for h in hits] for hits in a.search(queries, top_k=10)] == [
        [h.id for h in hits] for hits in b.search(queries, top_k=10)
    ]


def test_single_process_without_torchrun(tiny_model_dir: Path, small_corpus_path: Path, tmp_path: Path, capsys) -> None:
    from care_retriever.index import main

    code = main(
        [
            "--model",
            str(tiny_model_dir),
            "--corpus",
            str(small_corpus_path),
            "--store",
            f"faiss:{tmp_path / 's'}",
            "--no-progress",
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and (report["world_size"], report["added"]) == (1, 6)
    code = main(
        ["--model", str(tmp_path / "missing"), "--corpus", str(small_corpus_path), "--store", f"faiss:{tmp_path / 's'}"]
    )
    assert code == 2 and capsys.readouterr().err.startswith("error: model folder not found")
