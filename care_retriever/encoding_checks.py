"""Input checks for texts to encode; torch-free, so the exported query backends share them."""

from __future__ import annotations

from collections.abc import Sequence

from care_retriever.errors import InputError


def check_texts(texts: Sequence[str], what: str) -> list[str]:
    """Validate a batch of texts: a list of str, no None, valid Unicode. Empty strings are allowed here.

    A lone surrogate (``"\\ud800"``, which JSON escapes can produce) is not Unicode text: the tokenizer
    would fail with an obscure TypeError and SQLite could not store it, so it is refused here by index.
    """
    if isinstance(texts, str):
        raise InputError(f"{what}: expected a list of texts, got a single str (wrap it in a list)")
    out = list(texts)
    for i, text in enumerate(out):
        if not isinstance(text, str):
            raise InputError(f"{what}[{i}]: expected str, got {type(text).__name__}")
        check_unicode(text, f"{what}[{i}]")
    return out


def check_unicode(text: str, where: str) -> None:
    """Raise :class:`InputError` if ``text`` cannot be encoded as UTF-8 (lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{where}: not valid Unicode (lone surrogate at character {exc.start})") from exc
