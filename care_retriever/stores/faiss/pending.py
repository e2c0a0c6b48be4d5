"""A FAISS store's pending bulk write: the staging folder beside the store belongs to the run that made it.

The run's tag (:class:`~care_retriever.stores.runs.RunTag`: command, corpus, model, options) is written into the
staging folder as ``run.json`` when the folder is made; a later :meth:`FaissStore.prepare` resumes the folder only
for the same tag. Any other write (another corpus, ``delete``, ``--sparse-only``, another program) is refused in
one line that says what is pending and how to finish it (the same command again) or discard it
(``care-retriever index --store DIR --discard-pending``, or ``care-retriever copy --to DIR --discard-pending`` for
a pending copy: either removes the staging folder of whichever run is pending, and nothing published).
"""

from __future__ import annotations

import json
from pathlib import Path

from care_retriever.errors import StoreError
from care_retriever.stores.faiss import files
from care_retriever.stores.faiss.files import MANIFEST
from care_retriever.stores.runs import RunTag

RUN = "run.json"  # in the staging folder: the tag of the run that made it


def write_tag(staging: Path, run: RunTag) -> None:
    files.write_atomic(staging / RUN, json.dumps(run.to_dict(), indent=2).encode())


def read_tag(staging: Path) -> RunTag | None:
    """The tag of the run that made ``staging``; None when it has none (an older release's, or unreadable)."""
    try:
        data = json.loads((staging / RUN).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return RunTag.from_dict(data) if isinstance(data, dict) else None


def staged_count(staging: Path) -> int | None:
    """Documents in the staging folder's last checkpoint (the published ones it started from included)."""
    try:
        count = json.loads((staging / MANIFEST).read_text("utf-8")).get("count")
    except (OSError, ValueError, AttributeError):
        return None
    return count if isinstance(count, int) else None


def describe(store: str, staging: Path) -> str:
    """What is pending, in words: the run, its staged documents, where."""
    tag = read_tag(staging)
    run = tag.describe() if tag is not None else "`index` run (of an unknown corpus)"
    count = staged_count(staging)
    held = f"{count} documents staged" if count is not None else "a staged copy"
    return f"{store}: an unfinished {run} is pending in {staging} ({held}, not published)"


def how_to_end(store: str, staging: Path, *, published: bool = True) -> str:
    """How to finish or discard the run pending in ``staging``, in the words of the command that made it;
    ``published``: whether the store has a published version (a first run's staged copy is all there is)."""
    tag = read_tag(staging)
    discard = (
        f"care-retriever copy --to {store} --discard-pending"
        if tag is not None and tag.command == "copy"
        else f"care-retriever index --store {store} --discard-pending"
    )
    kept = "the published store is kept" if published else "nothing is published yet"
    return f"finish it by running that command again, or discard it with `{discard}` ({kept})"


def line(store: str, staging: Path, *, why: str = "", published: bool = True) -> str:
    """What is pending, why this write is not it (``why``), and how to finish or discard it: one line."""
    reason = f"; {why}" if why else ""
    return f"{describe(store, staging)}{reason}; {how_to_end(store, staging, published=published)}"


def refusal(store: str, staging: Path, *, why: str = "", published: bool = True) -> StoreError:
    """The one line that refuses a write while another run's staged copy is pending."""
    return StoreError(line(store, staging, why=why, published=published))
