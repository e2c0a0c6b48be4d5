"""The one tokenizer of the sparse side: jieba search-mode tokens, normalised.

Used by the ``bm25`` eval baseline (:mod:`care_retriever.sparse.bm25`), by the FAISS store's
inverted index and by the Qdrant store's sparse vectors, so evaluation and search agree. A store
records :func:`tokenizer_spec` in its manifest; a store built with another spec is refused
(:func:`check_spec`) instead of being scored with mismatched tokens.

Normalisation (version 1): ``jieba.lcut_for_search`` (a long word also yields its in-vocabulary
parts, so 高血压 matches 血压), NFKC (full-width Latin and digits fold to ASCII), lower case, and
tokens made only of punctuation, symbols or spaces dropped, as are the :data:`STOPWORDS` (Chinese
function words and question particles that every patient question carries). A query left with no
token has no sparse side: hybrid search then returns the dense results.
"""

from __future__ import annotations

import functools
import logging
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from care_retriever.errors import StoreError

NAME = "jieba-search"
VERSION = 1
OPTIONS: dict[str, Any] = {
    "mode": "search",
    "nfkc": True,
    "lowercase": True,
    "drop_punctuation": True,
    "stopwords": "zh-function-v1",
}
# Function words and particles: frequent in questions, never what a question is about.
_STOPWORD_TEXT = (
    "的 了 吗 呢 吧 啊 呀 么 嘛 哦 是 在 和 与 及 或 就 都 也 还 又 有 没 没有 我 你 他 她 它 我们 你们 他们 这 那 "
    "这个 那个 什么 怎么 怎么办 怎样 如何 为什么 哪些 哪个 请问 一下 一个 可以 能 会 要 想 应该 需要 问 谢谢 "
    "医生 您好 你好 把 被 给 对 从 到 让 得 地 着 过 之 其 而 但 但是 如果 因为 所以 吃 用"
)
STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_PUNCT = re.compile(r"^[\W_]+$")


def tokenizer_spec() -> dict[str, Any]:
    """What a store's manifest records about its sparse tokens."""
    return {"name": NAME, "version": VERSION, "options": dict(OPTIONS)}


def check_spec(recorded: dict[str, Any] | None, where: str) -> None:
    """Refuse a sparse side built with another tokenizer: its term statistics would not match our tokens."""
    current = tokenizer_spec()
    if recorded is None:
        return
    if {k: recorded.get(k) for k in current} != current:
        raise StoreError(
            f"{where}: the sparse side was built with tokenizer {recorded.get('name')} v{recorded.get('version')} "
            f"{recorded.get('options')}; this care-retriever tokenizes with {NAME} v{VERSION} {OPTIONS}. Rebuild it "
            "with `care-retriever index --sparse-only --store ...`"
        )


@functools.cache  # once per process: setLogLevel is slow (logging clears its caches)
def _jieba():
    import warnings

    # jieba 0.42 compiles with invalid escape sequences (SyntaxWarning; DeprecationWarning before Python
    # 3.12) on the first import after installation, and imports pkg_resources (a deprecation warning):
    # noise on every BM25 use, silenced for this import only.
    with warnings.catch_warnings():
        for category in (SyntaxWarning, DeprecationWarning):
            warnings.filterwarnings("ignore", message=r"invalid escape sequence", category=category)
        warnings.filterwarnings("ignore", message=r".*pkg_resources")
        import jieba

    jieba.setLogLevel(logging.WARNING)
    jieba.initialize()
    return jieba


def normalise(tokens: Sequence[str]) -> list[str]:
    out = []
    for token in tokens:
        token = unicodedata.normalize("NFKC", token).lower().strip()
        if token and not _PUNCT.match(token) and token not in STOPWORDS:
            out.append(token)
    return out


def tokenize_one(text: str) -> list[str]:
    return normalise(_jieba().lcut_for_search(text))


def tokenize(texts: Sequence[str], *, show_progress: bool = False, desc: str = "Tokenizing") -> list[list[str]]:
    """Normalised jieba search-mode tokens of each text (an empty text gives no tokens)."""
    jieba = _jieba()
    return [normalise(jieba.lcut_for_search(t)) for t in tqdm(texts, desc=desc, unit="text", disable=not show_progress)]
