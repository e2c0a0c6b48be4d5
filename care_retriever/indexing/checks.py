"""What the index writer checks of its input before anything is written: each document storable (one line for the
first that is not), the last of a repeated id kept (upsert), and a ``--prune`` that would delete more than it keeps
refused; and the corpus read in chunks."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice

from care_retriever.documents import Document, check_document_text, metadata_json
from care_retriever.errors import InputError
from care_retriever.model.text_checks import all_unicode, check_unicode
from care_retriever.stores import VectorStore
from care_retriever.stores.capabilities import StoredIteration

__all__ = ["check_prune", "check_storable", "chunks", "validated"]


def chunks(items: Iterable[Document], size: int) -> Iterator[list[Document]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def check_storable(doc: Document) -> None:
    """One line when ``doc`` cannot be stored: text that is not valid Unicode (a lone surrogate) would fail deep
    inside the tokenizer or SQLite. ``index`` checks the whole corpus with it before the first write."""
    if not isinstance(doc, Document):
        raise InputError(f"expected care_retriever.documents.Document, got {type(doc).__name__}")
    if not isinstance(doc.id, str) or not doc.id:
        raise InputError(f"document id must be a non-empty str, got {doc.id!r}")
    for name in ("id", "text", "title"):
        value = getattr(doc, name)
        if not isinstance(value, str):
            raise InputError(f"document {doc.id!r}: {name} must be a str, got {type(value).__name__}")
        check_unicode(value, f"document {doc.id!r} {name}")
    check_document_text(doc.id, doc.text, doc.title)  # as the CLI's corpus reader refuses it
    if doc.metadata:  # strict JSON (no NaN, no Infinity) in UTF-8; no metadata: nothing to check
        check_unicode(metadata_json(doc.id, doc.metadata), f"document {doc.id!r} metadata")


def validated(chunk: list[Document]) -> list[Document]:
    """Check each document is storable, and keep the last of repeated ids (upsert semantics).

    Two rows with one id in a chunk would otherwise both be inserted (FAISS docstore: UNIQUE violation).
    """
    if not _plainly_valid_in_bulk(chunk):  # some document is not: checked one by one, the first one's error raised
        for doc in chunk:
            check_storable(doc)
    latest: dict[str, Document] = {}
    for doc in chunk:
        latest.pop(doc.id, None)
        latest[doc.id] = doc
    return list(latest.values())


def _plainly_valid_in_bulk(chunk: list[Document]) -> bool:
    """Whether every document of ``chunk`` passes :func:`check_storable`, found in bulk (a Unicode check per 1,024
    strings instead of three a document: the check was about a twentieth of a CPU run of short titles). False: some
    document may not (the caller checks each, for the first one's message)."""
    try:
        if not all(isinstance(d, Document) and d.id and (d.text.strip() or d.title.strip()) for d in chunk):
            return False
        if not all_unicode([value for d in chunk for value in (d.id, d.text, d.title)]):
            return False
        for doc in chunk:  # strict JSON (no NaN, no Infinity) in UTF-8; no metadata: nothing to check
            if doc.metadata and not all_unicode([metadata_json(doc.id, doc.metadata)]):
                return False
    except (AttributeError, TypeError, ValueError, InputError):  # a field of another type than str, bad metadata
        return False
    return True


def check_prune(store: VectorStore, keep: set[str], *, confirmed: bool) -> int:
    """How many stored documents ``--prune`` deletes (those whose id is not in ``keep``, the corpus's ids). A prune
    that would delete more documents than the store keeps (an empty or wrong corpus deletes them all) is refused in
    one line before anything is written, unless ``confirmed`` (``index --prune --yes``)."""
    if store.manifest is None:
        return 0
    stored = StoredIteration.require(store, "index --prune")
    stale = sum(1 for d in stored.iter_documents() if d.id not in keep)
    if stale > len(keep) and not confirmed:
        raise InputError(
            f"--prune would delete {stale} of the {store.count()} documents in {store.describe()} and keep "
            f"{len(keep)}: nothing was written; add --yes to delete them"
        )
    return stale
