"""What text a document must have to be stored: the one rule every door applies (the CLI's corpus reader, the
Python writer, the Haystack and LangChain adapters), with one message.

A document with neither text nor title would be embedded as an empty string (or, by an adapter, stored with a
zero vector): it can never be found, and its vector says nothing. It is refused before anything is written.
"""

from __future__ import annotations

from care_retriever.errors import InputError

__all__ = ["check_document_text", "empty_text_message"]


def empty_text_message(doc_id: object) -> str:
    """The one line every door gives for a document without text."""
    return f"empty text for document {doc_id!r}"


def check_document_text(doc_id: object, text: str, title: str = "") -> None:
    """Refuse a document whose text and title are both empty or whitespace (one line, :class:`InputError`)."""
    if not (text.strip() or title.strip()):
        raise InputError(empty_text_message(doc_id))
