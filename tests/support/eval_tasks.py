"""Small task folders of each kind `care-retriever eval` reads: retrieval (BEIR), rerank and STS."""

from __future__ import annotations

import json
from pathlib import Path

DOCS = [
    ("t0", ""),  # an empty document, as in the real kuake-qtr corpus
    ("t1", "高血压患者应低盐饮食，规律服用降压药"),
    ("t2", "普通感冒多休息多喝水，一周左右可以自愈"),
    ("t3", "糖尿病患者需要控制饮食、适量运动"),
    ("t4", "拉肚子时注意补充水分和电解质"),
    ("t5", "失眠可以通过规律作息来改善"),
]
QUERIES = [
    ("q1", "高血压吃什么", {"t1": 2}),
    ("q2", "感冒怎么办", {"t2": 1, "t0": 0}),
    ("q3", "失眠", {"t5": 1}),
]


def write_tasks(root: Path) -> dict[str, Path]:
    ret = root / "toy-retrieval"
    (ret / "qrels").mkdir(parents=True)
    (ret / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": i, "title": "", "text": t}, ensure_ascii=False) + "\n" for i, t in DOCS)
    )
    (ret / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": t}, ensure_ascii=False) + "\n" for q, t, _ in QUERIES)
    )
    (ret / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, _, j in QUERIES for d, s in j.items())
    )
    rr = root / "toy-rerank"
    rr.mkdir()
    rows = [
        {"query": "高血压吃什么", "positive": [DOCS[1][1]], "negative": [DOCS[2][1], DOCS[3][1]]},
        {"query": "失眠怎么办", "positive": [DOCS[5][1], "睡前不要看手机"], "negative": [DOCS[4][1]]},
    ]
    (rr / "test.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    sts = root / "toy-sts"
    sts.mkdir()
    pairs = [
        ("高血压吃什么", "高血压饮食", 1),
        ("感冒", "糖尿病", 0),
        ("失眠怎么办", "睡不着怎么办", 1),
        ("腹泻", "头痛", 0),
    ]
    (sts / "test.jsonl").write_text(
        "".join(
            json.dumps({"sentence1": a, "sentence2": b, "score": s}, ensure_ascii=False) + "\n" for a, b, s in pairs
        )
    )
    return {"retrieval": ret, "rerank": rr, "sts": sts}
