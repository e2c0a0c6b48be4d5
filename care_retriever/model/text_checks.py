"""Input checks for texts to encode: a list of str, valid Unicode. Torch-free, so the exported query backends and
the corpus reader share them."""

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
    if all_unicode(out):  # the usual case, checked in bulk; otherwise each text, for the first one's message
        return out
    for i, text in enumerate(out):
        if not isinstance(text, str):
            raise InputError(f"{what}[{i}]: expected str, got {type(text).__name__}")
        check_unicode(text, f"{what}[{i}]")
    return out


# Strings checked by all_unicode at once: joined in pieces of this many, so that the joined copy stays small beside
# the texts themselves.
UNICODE_PIECE = 1024


def all_unicode(strings: Sequence[object]) -> bool:
    """Whether every item is a str that encodes as UTF-8, found without a Python call per string (a join and one
    encode per piece: about a tenth of the time of one ``check_unicode`` each on short texts). False: some item is
    not, and the caller checks each to say which. Joining cannot hide a lone surrogate: Python's UTF-8 codec refuses
    every surrogate code point, paired or not."""
    try:
        for start in range(0, len(strings), UNICODE_PIECE):
            "".join(strings[start : start + UNICODE_PIECE]).encode("utf-8")  # type: ignore[arg-type]
    except (TypeError, UnicodeEncodeError):
        return False
    return True


def check_unicode(text: str, where: str) -> None:
    """Raise :class:`InputError` if ``text`` cannot be encoded as UTF-8 (lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{where}: not valid Unicode (lone surrogate at character {exc.start})") from exc
