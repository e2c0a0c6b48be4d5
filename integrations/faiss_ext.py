"""The core FAISS store plus the two operations the framework adapters need and the core lacks.

* :meth:`ExtendedFaissStore.vectors` reads stored vectors back (Haystack's ``return_embedding``,
  LangChain's maximal-marginal-relevance search).
* :meth:`ExtendedFaissStore.transaction` makes one framework call (``write_documents``,
  ``add_texts``, ``delete``) all-or-nothing: prepare, write, finalize; on any error the staging
  folder is discarded, so a failed call leaves the published store exactly as it was.

Storage, layout and crash safety stay those of :class:`care_retriever.stores.faiss_store.FaissStore`;
this subclass only reads its index and docstore (candidates for the core API, see docs/integrations.md).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import faiss
import numpy as np

from care_retriever.errors import StoreError
from care_retriever.sql import in_chunks
from care_retriever.stores.faiss_store import MANIFEST, FaissStore


class ExtendedFaissStore(FaissStore):
    """A :class:`FaissStore` whose vectors can be read back and whose writes are all-or-nothing."""

    def vectors(self, ids: Sequence[str]) -> list[np.ndarray | None]:
        """Stored vector of each id (None where the id is missing)."""
        if self._db is None or self._index is None:
            return [None] * len(ids)
        rows: dict[str, int] = {}
        with self._lock:
            for marks, chunk in in_chunks(ids):
                rows.update(self._db.execute(f"SELECT id, row_id FROM documents WHERE id IN ({marks})", chunk))
            index = self._index
            if not hasattr(index, "id_map"):  # IVF keeps ids itself; reconstructing by id needs its direct map
                ivf = faiss.extract_index_ivf(index)
                if ivf.direct_map.type == faiss.DirectMap.NoMap:
                    ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
            return [None if i not in rows else index.reconstruct(int(rows[i])) for i in ids]

    @property
    def pending_write(self) -> bool:
        """True while an interrupted writer's checkpoint (a staging folder) waits to be resumed."""
        return (self.staging / MANIFEST).exists() and not self._writing

    @contextmanager
    def transaction(
        self, dim: int, space_fingerprint: str, model_name: str, index: dict[str, Any] | None = None
    ) -> Iterator[ExtendedFaissStore]:
        """Prepare, let the caller upsert/delete, then publish; discard everything on error."""
        self._acquire_writer_lock()  # fails fast, with the core's message, while another writer is running
        if self.pending_write:
            self._release_writer_lock()
            raise StoreError(
                f"{self.describe()}: an interrupted `care-retriever index` run is pending in {self.staging}; "
                "finish it by running the same command again, or remove that folder"
            )
        self.prepare(dim, space_fingerprint, model_name, index)
        try:
            yield self
            self.finalize()
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Drop the staged writes and reopen the published store (or nothing, for a store never published)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            shutil.rmtree(self.staging, ignore_errors=True)
            self._writing = False
            self._release_writer_lock()
            self._index = None
            self._search_index = None
            self.manifest = None
            if (self.path / MANIFEST).exists():
                self._open(self.path)
