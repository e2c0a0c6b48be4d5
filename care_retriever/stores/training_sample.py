"""Whether a new store's index can be trained on what a write has: a FAISS index with IVF lists or compressed codes
trains on its first vectors, and a source or corpus holding fewer than it needs cannot fill that first batch
whatever its size. Said in one line before anything is written, with what the user can do (``copy`` and
``index`` ask the same question)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from care_retriever.errors import InputError
from care_retriever.stores.config import FaissIndexConfig, IndexType, Quantize

if TYPE_CHECKING:
    from care_retriever.stores.base import StoreConfig, VectorStore


def require_training_sample(store: VectorStore, dim: int, index: StoreConfig, held: int, source: str) -> None:
    """Refuse a write of ``held`` documents from ``source`` into ``store`` whose new index trains on more."""
    from care_retriever.stores.capabilities import IndexBuilding

    needed = store.vectors_to_train(dim, index) if isinstance(store, IndexBuilding) else 0
    if held >= needed or held == 0:  # an empty write trains nothing (its store's first write will)
        return
    config = index if isinstance(index, FaissIndexConfig) else FaissIndexConfig()
    if config.quantization is not Quantize.NONE:
        what = f"--quantize {config.quantization.value}"
        remedy = "leave out --quantize"
    else:
        what = f"--index-type {config.index_type.value} (--nlist {config.nlist})"
        remedy = "use --index-type flat or hnsw"
        if config.index_type is IndexType.IVF:
            remedy = f"lower --nlist to at most {held}, or {remedy}"
    remedy += " (flat and hnsw indexes train on nothing; at this size exact search is fast)"
    raise InputError(
        f"{store.describe()}: {what} trains on the first {needed} vectors written and {source} holds {held} "
        f"documents; {remedy}; nothing was written"
    )
