"""Data builders: diversification filter, hard-negative mining, alignment data, LLM labelling.

The labelling tests talk HTTP to a real local server (a fake judge on 127.0.0.1 speaking the
OpenAI chat-completions protocol); the filter and the miner run on FAISS with vectors whose
similarities are known, and end to end through the CLI with a tiny CARE model.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import numpy as np
import pytest

from tests.support.cli import run_cli
from tests.support.data import write_jsonl


def unit(rows: list[list[float]]) -> np.ndarray:
    vectors = np.asarray(rows, dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


# ----------------------------------------------------------------------------- diversify
def test_diversify_drops_candidates_with_too_many_close_neighbours() -> None:
    from care_retriever.training.diversify import diversify

    base = {"a": [1, 0, 0], "a'": [1, 0.05, 0], "a''": [1, 0, 0.05], "b": [0, 1, 0], "c": [0, 0, 1], "ab": [1, 1, 0]}
    texts = ["a", "b", "a'", "a''", "c", "ab"]
    table = dict(zip(base, unit(list(base.values())), strict=True))

    def embed(batch: list[str]) -> np.ndarray:
        return np.stack([table[t] for t in batch])

    # n = 0: one neighbour above t is enough to drop a candidate
    kept, report = diversify(texts, embed, top_k=5, threshold=0.9, max_neighbours=0, seed_size=1, show_progress=False)
    assert [texts[i] for i in kept] == ["a", "b", "c", "ab"]
    assert (report.total, report.kept, report.dropped) == (6, 4, 2)
    # n = 1 (paper default): a' joins (only "a" is close), a'' then has two close neighbours and goes
    kept, _ = diversify(texts, embed, top_k=5, threshold=0.9, max_neighbours=1, seed_size=1, show_progress=False)
    assert [texts[i] for i in kept] == ["a", "b", "a'", "c", "ab"]
    # seeded texts are never filtered
    kept, _ = diversify(texts, embed, top_k=5, threshold=0.9, max_neighbours=0, seed_size=6, show_progress=False)
    assert len(kept) == 6


# ----------------------------------------------------------------------------- mining
def test_mining_uses_the_rank_window_and_skips_positives_and_their_near_duplicates() -> None:
    from care_retriever.training.hard_negatives import mine_negative_indices

    query = unit([[1, 0, 0, 0]])
    docs = unit(
        [
            [1, 0.0, 0, 0],  # 0 positive, rank 1
            [1, 0.02, 0, 0],  # 1 near-duplicate of the positive
            [1, 0.3, 0, 0],  # 2
            [1, 0.5, 0.1, 0],  # 3
            [1, 0.8, 0.3, 0],  # 4
            [0.2, 1, 0, 0],  # 5
            [0, 0, 0, 1],  # 6 far
        ]
    )
    mined = mine_negative_indices(query, docs, [{0}], num=2, range_min=0, range_max=10, duplicate_threshold=0.99)
    assert mined == [[2, 3]]
    # range_min skips the best-ranked non-positive candidates (likely unlabelled positives)
    mined = mine_negative_indices(query, docs, [{0}], num=2, range_min=3, range_max=10, duplicate_threshold=0.99)
    assert mined == [[4, 5]]
    # range_max bounds the window
    mined = mine_negative_indices(query, docs, [{0}], num=5, range_min=0, range_max=3, duplicate_threshold=0.99)
    assert mined == [[2, 3]]


PAIRS = [
    {"query": "高血压吃什么药", "text": "高血压的常用药物有五大类，需遵医嘱。"},
    {"query": "高血压饮食", "text": "高血压患者应低盐饮食。"},
    {"query": "糖尿病症状", "text": "糖尿病典型症状是多饮多尿多食和体重下降。"},
    {"query": "感冒发烧怎么办", "text": "感冒发烧要多休息多喝水。"},
    {"query": "失眠怎么调理", "text": "失眠可以规律作息，睡前少看手机。"},
    {"query": "腹泻吃什么", "text": "腹泻时注意补液，吃清淡易消化的食物。"},
]


def test_cli_mine_negatives_and_diversify_with_a_tiny_model(tmp_path, tiny_model_dir, capsys) -> None:
    pairs = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    out = tmp_path / "mined.jsonl"
    code, stdout, err = run_cli(
        capsys,
        "data",
        "mine-negatives",
        str(pairs),
        "--out",
        str(out),
        "--model",
        str(tiny_model_dir),
        "--num",
        "2",
        "--range-min",
        "0",
        "--range-max",
        "5",
    )
    assert code == 0, err
    rows = [json.loads(line) for line in out.read_text("utf-8").splitlines()]
    assert [r["query"] for r in rows] == [p["query"] for p in PAIRS]
    texts = {p["text"] for p in PAIRS}
    for row, pair in zip(rows, PAIRS, strict=True):
        assert row["positive"] == [pair["text"]]
        assert len(row["negative"]) == 2 and pair["text"] not in row["negative"]
        assert set(row["negative"]) <= texts
    assert "6 queries, 12 mined negatives" in stdout
    # OUT is never overwritten without --force
    code, _, err = run_cli(
        capsys, "data", "mine-negatives", str(pairs), "--out", str(out), "--model", str(tiny_model_dir)
    )
    assert code == 2 and "exists" in err

    # exact duplicates have cosine 1 and are dropped; the random document tower keeps distinct texts
    # below 0.99 (its random query tower does not: a random [CLS] is nearly the same for every text)
    dup = write_jsonl(tmp_path / "dup.jsonl", [*PAIRS, PAIRS[0], PAIRS[2]])
    kept_file = tmp_path / "kept.jsonl"
    code, stdout, err = run_cli(
        capsys,
        "data",
        "diversify",
        str(dup),
        "--out",
        str(kept_file),
        "--model",
        str(tiny_model_dir),
        "--side",
        "document",
        "--threshold",
        "0.99",
        "--max-neighbours",
        "0",
        "--seed-size",
        "0",
    )
    assert code == 0, err
    kept = [json.loads(line) for line in kept_file.read_text("utf-8").splitlines()]
    assert [r["text"] for r in kept] == [p["text"] for p in PAIRS]
    assert "kept 6 of 8 rows" in stdout


def test_cli_alignment_pairs_every_query_and_document_once(tmp_path, capsys) -> None:
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [*PAIRS, PAIRS[0]])
    sts = write_jsonl(
        tmp_path / "sts.jsonl",
        [
            {"sentence1": "血压高", "sentence2": "高血压", "score": 1},
            {"sentence1": "头疼", "sentence2": "胃痛", "score": 0},
        ],
    )
    out = tmp_path / "align.jsonl"
    code, _, err = run_cli(capsys, "data", "alignment", str(pairs), "--out", str(out))
    assert code == 0, err
    rows = [json.loads(line) for line in out.read_text("utf-8").splitlines()]
    assert [r["text"] for r in rows if r["side"] == "query"] == [p["query"] for p in PAIRS]
    assert [r["text"] for r in rows if r["side"] == "document"] == [p["text"] for p in PAIRS]
    out2 = tmp_path / "align-sts.jsonl"
    code, _, err = run_cli(capsys, "data", "alignment", str(sts), "--format", "sts", "--out", str(out2))
    assert code == 0, err
    rows = [json.loads(line) for line in out2.read_text("utf-8").splitlines()]
    assert rows == [{"text": "血压高", "side": "query"}, {"text": "高血压", "side": "query"}]


# ----------------------------------------------------------------------------- labelling
class FakeJudge(BaseHTTPRequestHandler):
    """OpenAI-compatible /v1/chat/completions: each judge model grades by its own keyword rule."""

    calls: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeJudge.calls.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        user = body["messages"][-1]["content"]
        model = body["model"]
        if "高血压" in user and "降压" in user:
            grade = "A" if model != "judge-3" else "等级：S"
        elif "失眠" in user:
            grade = "B" if model == "judge-1" else "A"  # the judges disagree
        elif model == "judge-2" and "乱码" in user:
            grade = "我不确定"  # unparsable
        else:
            grade = "D"
        payload = {"choices": [{"index": 0, "message": {"role": "assistant", "content": grade}}]}
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        return None


@pytest.fixture
def judge_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeJudge)
    server.timeout = 5
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    FakeJudge.calls = []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_cli_label_keeps_only_unanimous_grades(tmp_path, judge_server, capsys, monkeypatch) -> None:
    monkeypatch.setenv("JUDGE_KEY", "sk-test")
    candidates = write_jsonl(
        tmp_path / "candidates.jsonl",
        [
            {"query": "高血压吃什么药", "candidates": ["降压药有五大类", "感冒多喝水", "乱码文本"]},
            {"query": "失眠怎么办", "candidates": ["失眠要规律作息"]},
        ],
    )
    out = tmp_path / "labelled.jsonl"
    code, stdout, err = run_cli(
        capsys,
        "data",
        "label",
        str(candidates),
        "--out",
        str(out),
        "--endpoint",
        judge_server,
        "--judge",
        "judge-1",
        "--judge",
        "judge-2",
        "--judge",
        "judge-3",
        "--api-key-env",
        "JUDGE_KEY",
        "--workers",
        "2",
        "--timeout",
        "5",
    )
    assert code == 0, err
    rows = [json.loads(line) for line in out.read_text("utf-8").splitlines()]
    # only the first query has a unanimous positive; the insomnia pair is split (B/A/A) and dropped
    assert len(rows) == 1
    row = rows[0]
    assert row["query"] == "高血压吃什么药"
    assert row["positive"] == ["降压药有五大类"]
    assert row["negative"] == ["感冒多喝水"]  # D/D/D; the unparsable grade discards 乱码文本
    assert row["grades"]["降压药有五大类"] == ["A", "A", "S"]
    assert row["grades"]["乱码文本"] == ["D", None, "D"]
    assert "4 pairs x 3 judges: 1 positive, 1 negative, 2 discarded" in stdout
    assert "1 unparsable" in stdout
    assert len(FakeJudge.calls) == 12
    assert {c["auth"] for c in FakeJudge.calls} == {"Bearer sk-test"}
    assert {c["body"]["model"] for c in FakeJudge.calls} == {"judge-1", "judge-2", "judge-3"}
    assert "S：" in FakeJudge.calls[0]["body"]["messages"][0]["content"]  # the rubric is sent


def test_label_errors_are_one_line(tmp_path, judge_server, capsys) -> None:
    candidates = write_jsonl(tmp_path / "c.jsonl", [{"query": "头痛", "text": "头痛的原因"}])
    # wrong path on a live server: HTTP 404, not retried
    code, _, err = run_cli(
        capsys,
        "data",
        "label",
        str(candidates),
        "--out",
        str(tmp_path / "o.jsonl"),
        "--endpoint",
        judge_server.replace("/v1", "/nope"),
        "--judge",
        "j",
        "--timeout",
        "5",
    )
    assert code == 2 and "HTTP 404" in one_error(err)
    # nothing listening: connection refused after the retries
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, _, err = run_cli(
        capsys,
        "data",
        "label",
        str(candidates),
        "--out",
        str(tmp_path / "o.jsonl"),
        "--endpoint",
        f"http://127.0.0.1:{port}/v1",
        "--judge",
        "j",
        "--timeout",
        "2",
    )
    assert code == 2 and "cannot reach" in one_error(err)
    assert not (tmp_path / "o.jsonl").exists()
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"query": "头痛"}])
    code, _, err = run_cli(
        capsys,
        "data",
        "label",
        str(bad),
        "--out",
        str(tmp_path / "o.jsonl"),
        "--endpoint",
        judge_server,
        "--judge",
        "j",
    )
    assert code == 2 and "no candidates" in one_error(err)


def one_error(err: str) -> str:
    """The single ``error:`` line of a failed command (progress bars may precede it; no traceback)."""
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]
