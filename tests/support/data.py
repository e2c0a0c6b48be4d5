"""Paths, texts and JSONL files the tests share: the shipped sample, the small medical corpus, training pairs."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLE_DIR = REPO / "care_retriever" / "data" / "sample"
SHARED_DATA = Path(os.environ.get("CARE_SHARED_DATA", REPO.parent / "shared" / "data"))

MEDICAL_TEXTS = [
    ("a", "高血压", "高血压患者应低盐饮食，规律服用降压药，定期监测血压。"),
    ("b", "感冒", "普通感冒多由病毒引起，多休息多喝水，一般一周左右可以自愈。"),
    ("c", "糖尿病", "糖尿病患者需要控制饮食、适量运动，并遵医嘱使用降糖药物。"),
    ("d", "腹泻", "拉肚子时注意补充水分和电解质，避免脱水，严重时及时就医。"),
    ("e", "失眠", "失眠可以通过规律作息、睡前避免咖啡和手机来改善。"),
    ("f", "儿童发烧", "宝宝发烧超过三十八度五或精神差时应及时就医。"),
]

# Texts of mixed lengths for the forward-pass tests (packed = padded, training's document side): one-character
# texts (a token or two with the appended end token), repeats of one sentence, a long one, Latin letters
MIXED_LENGTH_TEXTS = [
    "高血压患者应低盐饮食，规律服用降压药，定期监测血压。" * 3,
    "a",
    "感冒",
    "糖尿病患者需要控制饮食、适量运动，并遵医嘱使用降糖药物。",
    "咳",
    "失眠可以通过规律作息、睡前避免咖啡和手机来改善。",
    "宝宝发烧超过三十八度五或精神差时应及时就医。" * 2,
    "What should a patient with hypertension eat?",
    "b",
    "拉肚子时注意补充水分和电解质。",
]


def load_script(path: Path, name: str | None = None):
    """A script that is not a package module (examples/) imported from its file."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


# The training tests' pairs: query "<condition><question>", positive "<condition>：<answer>", in
# condition-major order (the first n rows are the same whatever the number of conditions taken).
CONDITIONS = ["高血压", "糖尿病", "感冒", "腹泻", "失眠", "发烧", "咳嗽", "胃痛", "头痛", "过敏", "贫血", "哮喘"]
ASPECTS = [
    ("怎么办", "出现{c}时先休息观察，症状加重要及时去医院就诊。"),
    ("吃什么药", "{c}的用药要听医生的，不要自己随便买药吃。"),
    ("有哪些症状", "{c}常见的表现各不相同，可以对照说明自查。"),
    ("饮食注意什么", "{c}患者饮食宜清淡，少吃油腻辛辣的食物。"),
]


def condition_pairs(conditions: int = len(CONDITIONS), aspects: int = len(ASPECTS)) -> list[dict[str, str]]:
    return [
        {"query": f"{c}{question}", "text": f"{c}：" + answer.format(c=c)}
        for c in CONDITIONS[:conditions]
        for question, answer in ASPECTS[:aspects]
    ]


def sample_queries() -> list[str]:
    return [row["text"] for row in read_jsonl(SAMPLE_DIR / "queries.jsonl")]


# The query backends' tests (ONNX, OpenVINO): queries of every shape, one of them past the max length.
BACKEND_QUERIES = [
    "高血压患者平时饮食需要注意什么？",
    "感冒",
    "宝宝发烧三十八度五，精神不好，要不要去医院",
    "失眠怎么办" * 150,  # 750 characters: truncated to the tower's max length on both paths
    "糖尿病人能吃水果吗 diabetes fruit",
]
