"""Reading a FAISS store: dense search (rescored where the index holds codes), BM25 and hybrid search, filters,
documents and vectors by id, counts and listing.

A mixin of :class:`~care_retriever.stores.faiss.store.FaissStore`: its methods read the version the store has
open (:class:`~care_retriever.stores.faiss.opening.OpenedVersion`) under the store's lock.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import faiss
import numpy as np

from care_retriever.documents import Document
from care_retriever.errors import InputError
from care_retriever.sparse.fusion import FUSIONS, FusionConfig
from care_retriever.stores.base import Hit, Manifest
from care_retriever.stores.faiss import docstore, rescoring, sparse
from care_retriever.stores.faiss.field_index import FieldIndexes
from care_retriever.stores.faiss.filter_plan import Plan, Selection, first_matches, widening_candidates
from care_retriever.stores.faiss.index_factory import (
    exact_scan_rows,
    inner_index,
    manifest_config,
    quantization,
    reconstruct,
    search_params,
    search_with,
    stored_among,
    takes_search_params,
)
from care_retriever.stores.faiss.opening import OpenedVersion
from care_retriever.stores.faiss.session import InPlaceWrite
from care_retriever.stores.filters import Constant, FilterNode, Filters, parse_filters


class Reading(OpenedVersion):
    """The read side of a FaissStore. Safe for concurrent searches from many threads."""

    def content_hashes(self, ids: Sequence[str]) -> dict[str, str]:
        db = self._require_db()
        with self._lock:
            return docstore.content_hashes(db, ids)

    def search_sparse(
        self, queries: Sequence[str], top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        """BM25 top-``k`` hits for each query text (an empty list for a query with no indexed token)."""
        from care_retriever.sparse import require_sparse

        sparse.check_search(self.describe(), self._session is not None, top_k)
        self._follow_writes()
        require_sparse(self)
        ranked = self._sparse_ranked(queries, top_k, self._filtered_row_ids(filters))
        docs = self._rows({r for row in ranked for r, _ in row}, payload=payload)
        return [docstore.hits(row, docs, top_k) for row in ranked]

    hybrid_fusions = FUSIONS  # every fusion runs in this process, on row ids

    def search_hybrid(
        self,
        vectors: np.ndarray,
        queries: Sequence[str],
        top_k: int,
        filters: Filters | None = None,
        *,
        fusion: FusionConfig | None = None,
        payload: bool = True,
    ) -> list[list[Hit]]:
        """Dense and BM25 rankings fused on row ids (care_retriever.sparse.fusion): only the fused top-``k``
        documents are read from the docstore, not each side's candidates (which cost as much as the BM25
        scoring). A query with no indexed token gets its dense hits."""
        from care_retriever.sparse import require_sparse

        sparse.check_search(self.describe(), self._session is not None, top_k)
        self._follow_writes()
        require_sparse(self)
        fusion = fusion or FusionConfig()
        allowed = self._filtered_row_ids(filters)  # one filter query for both sides
        depth = max(fusion.candidates, top_k)
        dense = self._dense_ranked(vectors, depth, None if allowed is None else Selection.of_rows(allowed))
        if self._current_tombstones():  # removed rows still in the index (HNSW): dropped before they are fused
            live = self._rows({r for row in dense for r, _ in row}, payload=False)
            dense = [[(r, s) for r, s in row if r in live][:depth] for row in dense]
        cuts = sparse.fused_cuts(dense, self._sparse_ranked(queries, depth, allowed), fusion, top_k)
        docs = self._rows({r for row in cuts for r, _ in row}, payload=payload)
        return sparse.hybrid_hits(cuts, docs, top_k)

    def _sparse_ranked(
        self, queries: Sequence[str], top_k: int, allowed: np.ndarray | None
    ) -> list[list[tuple[int, float]]]:
        """Each query's BM25 top-``k`` (row id, score), best first, ties by row id."""
        db = self._require_db()
        tokens = sparse.query_tokens(queries)
        with self._lock:
            return self._bm25.ranked(db, tokens, top_k, allowed)

    def count(self, filters: Filters | None = None) -> int:
        if self._db is None:
            return 0
        self._follow_writes()
        allowed = self._filtered_row_ids(filters)
        if allowed is not None:
            return len(allowed)
        session = self._session
        if session is None:
            return self._count
        if isinstance(session, InPlaceWrite):
            return session.count
        with self._lock:
            return docstore.count(session.db)

    def vectors(self, ids: Sequence[str]) -> list[np.ndarray | None]:
        """Stored vector of each id (None where the id is missing)."""
        if self._db is None or self._index is None:
            return [None] * len(ids)
        self._follow_writes()
        ids = list(ids)
        with self._lock:
            rows = docstore.row_ids(self._db, ids)
            manifest = self._current_manifest()
            if quantization(manifest_config(manifest.index)) != "none":  # the exact vectors, not decoded codes
                found = np.asarray([rows[i] for i in ids if i in rows], dtype=np.int64)
                full = iter(self._full_vectors(found))
                return [next(full).copy() if i in rows else None for i in ids]
            wanted = np.asarray([rows.get(i, -1) for i in ids], dtype=np.int64)
            vectors, self._id_order = reconstruct(self._index, wanted, self._id_order)
            return vectors

    def _searchable(self) -> faiss.Index:
        if self._search_index is None:
            assert self._index is not None
            index = self._index
            if self.use_gpu is not False and hasattr(faiss, "index_cpu_to_all_gpus") and faiss.get_num_gpus() > 0:
                index = faiss.index_cpu_to_all_gpus(index)
            self._search_index = index
        return self._search_index

    def search(
        self, vectors: np.ndarray, top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        self._follow_writes()
        ranked = self._dense_ranked(vectors, top_k, self._selection(filters))
        docs = self._rows({r for row in ranked for r, _ in row}, payload=payload)
        return [docstore.hits(row, docs, top_k) for row in ranked]

    def filter_plan(self, filters: Filters | None, top_k: int = 10) -> Plan | None:
        """How a search for ``top_k`` hits under ``filters`` runs (None: unfiltered); a widened search may still
        fall back to the id selector for a query left with too few matching candidates.

        Usage example:
        ```python
        store.filter_plan({"field": "meta.year", "operator": ">=", "value": 2000}, top_k=10)
        ```

        :param filters: the filter, as :meth:`search` takes it.
        :param top_k: the hits a query asks for.
        """
        self._follow_writes()
        selection = self._selection(filters)
        if selection is None or self._index is None:
            return None
        return self._plan(selection, self._wanted(top_k))[0]

    def _wanted(self, top_k: int) -> int:
        """The results a filtered search takes from the index: the candidates it rescores on quantized codes."""
        assert self._index is not None
        manifest = self._current_manifest()
        if quantization(manifest_config(manifest.index)) == "none":
            return min(top_k + self._current_tombstones(), self._index.ntotal)
        oversample = float(self.oversample if self.oversample is not None else manifest.index.get("oversample", 1.0))
        return rescoring.candidates_wanted(top_k, self._current_tombstones(), oversample, self._index.ntotal)

    def _plan(self, selection: Selection, wanted: int) -> tuple[Plan, int]:
        """The plan for ``selection`` (:mod:`.filter_plan`), and the candidates a widened search takes."""
        assert self._index is not None
        config = manifest_config(self._current_manifest().index)
        inner, scan_rows = inner_index(self._index), exact_scan_rows(self._index, config)
        exact_only = quantization(config) != "none" and not takes_search_params(inner)
        if not exact_only:  # codes that take no id selector are scanned exactly, as they always were
            graph = isinstance(inner, faiss.IndexHNSW)
            candidates = widening_candidates(
                selection.fraction, wanted, self._index.ntotal, graph=graph, scan_rows=scan_rows
            )
            if candidates is not None:
                return Plan.WIDENING, candidates
        if exact_only or len(selection.rows()) <= scan_rows:
            return Plan.EXACT_SCAN, 0
        return Plan.SELECTOR, 0

    def _dense_ranked(
        self, vectors: np.ndarray, top_k: int, selection: Selection | None
    ) -> list[list[tuple[int, float]]]:
        """Each vector's nearest (row id, score), best first, among the rows ``selection`` lets through (None:
        all): ``top_k`` plus as many as the index holds tombstones (removed rows an HNSW index still returns; the
        caller drops them)."""
        if self._index is None:
            self.require_manifest()
        assert self._index is not None
        if top_k < 1:
            raise InputError(f"top_k must be >= 1, got {top_k}")
        vectors = np.ascontiguousarray(np.atleast_2d(vectors), dtype=np.float32)
        manifest = self._current_manifest()
        if vectors.shape[1] != manifest.dim:
            raise InputError(f"query vectors have {vectors.shape[1]} dims; the store holds {manifest.dim}")
        if len(vectors) == 0 or self._index.ntotal == 0:
            return [[] for _ in range(len(vectors))]
        if quantization(manifest_config(manifest.index)) != "none":
            return self._rescored(vectors, top_k, manifest, selection)
        k = min(top_k + self._current_tombstones(), self._index.ntotal)
        if selection is None:
            return self._searched(vectors, k, None)
        plan, candidates = self._plan(selection, k)
        if plan is Plan.EXACT_SCAN:
            return self._exact_among(vectors, k, selection.rows())
        if plan is Plan.SELECTOR:
            return self._selected(vectors, k, selection.rows())
        found = self._searched(vectors, candidates, None, wide=True)
        ids = np.asarray([[r for r, _ in row] + [-1] * (candidates - len(row)) for row in found], dtype=np.int64)
        kept = first_matches(ids.reshape(len(found), -1), selection.keep, k)
        short = [i for i, positions in enumerate(kept) if positions is None]
        redone = iter(self._dense_ranked(vectors[short], top_k, Selection.of_rows(selection.rows())) if short else [])
        return [next(redone) if at is None else [found[i][j] for j in at] for i, at in enumerate(kept)]

    def _selected(self, vectors: np.ndarray, k: int, allowed: np.ndarray) -> list[list[tuple[int, float]]]:
        """The index's search under an id selector of ``allowed``; a query it leaves short (a graph search whose
        candidate list filled with refused rows, IVF lists holding few allowed rows) gets an exact scan of them."""
        found = self._searched(vectors, k, allowed)
        short = [i for i, row in enumerate(found) if len(row) < min(k, len(allowed))]
        scanned = iter(self._exact_among(vectors[short], k, allowed) if short else [])
        return [next(scanned) if len(row) < min(k, len(allowed)) else row for row in found]

    def _searched(
        self, vectors: np.ndarray, k: int, allowed: np.ndarray | None, *, wide: bool = False
    ) -> list[list[tuple[int, float]]]:
        """Each vector's ``k`` nearest (row id, score) from the index, among ``allowed`` rows (None: all); ``wide``:
        an HNSW search's candidate list is at least ``k`` long."""
        assert self._index is not None
        params = search_params(self._index, manifest_config(self._current_manifest().index), allowed, k if wide else 0)
        if params is False:
            return [[] for _ in range(len(vectors))]
        scores, ids = search_with(self._searchable() if params is None else self._index, vectors, k, params)
        return [
            [(int(r), float(s)) for r, s in zip(row_ids, row_scores, strict=True) if r >= 0]
            for row_scores, row_ids in zip(scores, ids, strict=True)
        ]

    def _exact_among(self, vectors: np.ndarray, k: int, allowed: np.ndarray) -> list[list[tuple[int, float]]]:
        """Each vector's ``k`` best among the ``allowed`` rows, scored exactly from the vectors the index stores:
        a graph search restricted to a few rows loses their neighbours, and a flat search tests every row of the
        store against the selection; a scan of the few rows does neither."""
        assert self._index is not None
        with self._lock:
            rows, matrix, self._id_order = stored_among(self._index, allowed, self._id_order)
        if not len(rows):
            return [[] for _ in range(len(vectors))]
        scores = vectors @ matrix.T
        best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return [[(int(rows[j]), float(row[j])) for j in order] for row, order in zip(scores, best, strict=True)]

    def _rescored(
        self, vectors: np.ndarray, top_k: int, manifest: Manifest, selection: Selection | None
    ) -> list[list[tuple[int, float]]]:
        """Quantized stores: ``top_k x oversample`` candidates from the codes, re-scored with exact inner products
        from vectors.f32, best ``top_k`` (plus tombstones) returned. The scores are exact cosines."""
        assert self._index is not None
        want = top_k + self._current_tombstones()
        k = self._wanted(top_k)
        plan, widened = self._plan(selection, k) if selection is not None else (None, 0)
        if plan is Plan.EXACT_SCAN:
            # A selective filter's rows, and any filter's on codes that take no id selector (sign bits, flat PQ),
            # are scored exactly instead (cost grows with the number of matches, not with the store).
            assert selection is not None
            candidates = [selection.rows()] * len(vectors)
        elif plan is Plan.WIDENING:  # the first k matching candidates: the ones the selector's search returns
            assert selection is not None
            params = search_params(self._index, manifest_config(manifest.index), None, widened)
            _, ids = search_with(self._index, vectors, widened, params)
            kept = first_matches(ids, selection.keep, k)
            short = [i for i, at in enumerate(kept) if at is None]
            redone = self._selected_candidates(vectors[short], k, selection.rows()) if short else []
            fallback = iter(redone)
            candidates = [next(fallback) if at is None else row[at] for row, at in zip(ids, kept, strict=True)]
        else:
            candidates = self._selected_candidates(vectors, k, None if selection is None else selection.rows())
        return rescoring.rescore(vectors, candidates, self._full_vectors, want)

    def _selected_candidates(self, vectors: np.ndarray, k: int, allowed: np.ndarray | None) -> list[np.ndarray]:
        """Each vector's ``k`` best row ids by the codes, among ``allowed`` rows (None: all; a query the search
        leaves short: every allowed row, rescored)."""
        assert self._index is not None
        params = search_params(self._index, manifest_config(self._current_manifest().index), allowed)
        if params is False:
            return [np.zeros(0, dtype=np.int64) for _ in range(len(vectors))]
        _, ids = search_with(self._index, vectors, k, params)
        wanted = k if allowed is None else min(k, len(allowed))  # a query left short rescores every allowed row
        return [row[row >= 0] if (row >= 0).sum() >= wanted or allowed is None else allowed for row in ids]

    def _selection(self, filters: Filters | None, *, estimate: bool = True) -> Selection | None:
        """What ``filters`` lets through (None: no filter), its share of the store estimated now (``estimate``;
        else never widened) and its rows read when a plan needs them."""
        node: FilterNode | None = parse_filters(filters)
        if node is None or node == Constant(True):
            return None
        if isinstance(node, Constant):
            return Selection.of_rows(np.empty(0, dtype=np.int64))
        fraction = None
        if estimate:
            with self._lock:
                fraction = self._current_field_indexes().fraction(node)

        def read_rows() -> np.ndarray:
            with self._lock:
                return self._current_field_indexes().select(node)

        def keep(rows: np.ndarray) -> np.ndarray:
            with self._lock:
                return self._current_field_indexes().matching(node, rows)

        return Selection(node, fraction, read_rows, keep)

    def _current_field_indexes(self) -> FieldIndexes:
        """The field indexes of the docstore connection open now (call under the lock)."""
        db = self._require_db()
        if self._field_indexes is None or self._field_indexes.db is not db:
            self._field_indexes = FieldIndexes(db)  # a new connection: a new version opened
        return self._field_indexes

    def _filtered_row_ids(self, filters: Filters | None) -> np.ndarray | None:
        """Row ids of the documents ``filters`` lets through (read by :func:`parse_filters`); None: no filter."""
        selection = self._selection(filters, estimate=False)
        return None if selection is None else selection.rows()

    def _rows(self, row_ids: set[int], payload: bool = True) -> dict[int, Document]:
        """Stored documents by row id; without ``payload``, their ids alone (no text, no metadata parsing)."""
        db = self._require_db()
        with self._lock:
            return docstore.documents_by_row(db, row_ids, payload)

    def get(self, ids: Sequence[str]) -> list[Document | None]:
        db = self._require_db()
        ids = list(ids)
        with self._lock:
            found = docstore.documents_by_id(db, ids)
        return [found.get(i) for i in ids]

    def iter_documents(self, batch: int = 1000) -> Iterator[Document]:
        """All live documents in row order (adapters use this to list a store)."""
        db = self._require_db()
        last = -1
        while True:
            with self._lock:
                rows = docstore.page(db, last, batch)
            if not rows:
                return
            for _rid, doc in rows:
                yield doc
            last = rows[-1][0]
