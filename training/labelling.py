"""LLM relevance labelling: several judges grade (query, passage) pairs; only unanimous labels are kept.

CARE's benchmark and training data were labelled by LLMs on a five-grade rubric (paper, CMedTEB):

- S: subject and intent match, the passage fully answers the question;
- A: subject and intent match, the passage answers it;
- B: same subject, another intent;
- C: related subject, cannot answer;
- D: unrelated.

Each pair is graded by every judge; a pair becomes a *positive* when all judges grade it S or A and
a *negative* when all grade it B, C or D; partial agreement is discarded (the paper's unanimous
rule). Judges are models behind any OpenAI-compatible ``/chat/completions`` endpoint (vLLM, TGI,
llama.cpp, Ollama, a hosted API), called with the standard library's HTTP client; the API key is read
from an environment variable and never logged.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from care_retriever.errors import InputError

logger = logging.getLogger("care_retriever")

GRADES = ("S", "A", "B", "C", "D")
POSITIVE_GRADES = frozenset({"S", "A"})
NEGATIVE_GRADES = frozenset({"B", "C", "D"})
RUBRIC = """你是医学信息检索的相关性评审员。给定一个中文医疗问题和一段医学资料，按以下标准给出一个等级：
S：主题和意图都与问题一致，资料完整回答了问题；
A：主题和意图一致，资料回答了问题；
B：主题相同，但意图不同，不能回答这个问题；
C：主题相关，但不能回答问题；
D：与问题无关。
只输出一个字母（S、A、B、C 或 D），不要输出其他内容。"""
_GRADE_RE = re.compile(r"(?<![A-Za-z])([SABCD])(?![A-Za-z])")


@dataclass
class Judgement:
    query: str
    text: str
    grades: list[str | None]

    @property
    def label(self) -> str | None:
        """``positive`` / ``negative`` when the judges agree, else ``None`` (discarded)."""
        if any(g is None for g in self.grades):
            return None
        if all(g in POSITIVE_GRADES for g in self.grades):
            return "positive"
        if all(g in NEGATIVE_GRADES for g in self.grades):
            return "negative"
        return None


@dataclass
class LabelReport:
    pairs: int = 0
    positives: int = 0
    negatives: int = 0
    discarded: int = 0
    unparsable: int = 0
    per_judge: dict[str, dict[str, int]] = field(default_factory=dict)


def parse_grade(content: str) -> str | None:
    """The first stand-alone S/A/B/C/D in a judge's answer (``"等级：A"``, ``"A"``, ``"**B**"``)."""
    match = _GRADE_RE.search(content.strip().upper())
    return match.group(1) if match else None


class ChatJudge:
    """One judge model behind an OpenAI-compatible endpoint (plain HTTP, JSON in and out)."""

    def __init__(
        self, endpoint: str, model: str, *, api_key: str | None = None, timeout: float = 60.0, retries: int = 2
    ) -> None:
        if not endpoint.startswith(("http://", "https://")):
            raise InputError(f"--endpoint {endpoint!r}: expected an http(s) URL like http://127.0.0.1:8000/v1")
        self.url = endpoint.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.retries = retries

    def grade(self, query: str, text: str) -> str | None:
        body = {
            "model": self.model,
            "temperature": 0,
            "max_tokens": 8,
            "messages": [
                {"role": "system", "content": RUBRIC},
                {"role": "user", "content": f"问题：{query}\n\n资料：{text}\n\n等级："},
            ],
        }
        content = self._post(body)["choices"][0]["message"]["content"] or ""
        return parse_grade(content)

    def _post(self, body: dict) -> dict:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return json.loads(response.read().decode("utf-8"))
            except urllib.error.HTTPError as exc:
                retriable = exc.code == 429 or exc.code >= 500
                if not retriable or attempt == self.retries:
                    raise InputError(f"judge {self.model!r} at {self.url}: HTTP {exc.code} {exc.reason}") from exc
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                if attempt == self.retries:
                    reason = getattr(exc, "reason", exc)
                    raise InputError(f"judge {self.model!r}: cannot reach {self.url} ({reason})") from exc
            except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
                raise InputError(f"judge {self.model!r} at {self.url}: not a chat-completion response") from exc
            time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")


def label_pairs(
    pairs: Sequence[tuple[str, str]],
    judges: Sequence[ChatJudge],
    *,
    workers: int = 4,
    show_progress: bool = True,
) -> tuple[list[Judgement], LabelReport]:
    """Grade every (query, text) pair with every judge; the unanimous rule decides the label."""
    if not judges:
        raise InputError("labelling needs at least one --judge")
    report = LabelReport(pairs=len(pairs), per_judge={j.model: dict.fromkeys(GRADES, 0) for j in judges})

    def grade_all(pair: tuple[str, str]) -> Judgement:
        return Judgement(pair[0], pair[1], [judge.grade(*pair) for judge in judges])

    with (
        ThreadPoolExecutor(max_workers=max(1, workers)) as pool,
        tqdm(total=len(pairs), desc="Labelling", unit="pair", disable=not show_progress) as bar,
    ):
        judgements = []
        for judgement in pool.map(grade_all, pairs):
            judgements.append(judgement)
            bar.update(1)
    for judgement in judgements:
        for judge, grade in zip(judges, judgement.grades, strict=True):
            if grade is None:
                report.unparsable += 1
            else:
                report.per_judge[judge.model][grade] += 1
        label = judgement.label
        if label == "positive":
            report.positives += 1
        elif label == "negative":
            report.negatives += 1
        else:
            report.discarded += 1
    return judgements, report


def rows_from_judgements(judgements: Sequence[Judgement]) -> list[dict]:
    """``{query, positive[], negative[], grades}`` rows, one per query with at least one positive."""
    by_query: dict[str, dict] = {}
    for j in judgements:
        row = by_query.setdefault(j.query, {"query": j.query, "positive": [], "negative": [], "grades": {}})
        row["grades"][j.text] = j.grades
        if j.label == "positive":
            row["positive"].append(j.text)
        elif j.label == "negative":
            row["negative"].append(j.text)
    return [row for row in by_query.values() if row["positive"]]
