"""Whether a new store's index can be trained on what a write has: a FAISS index with IVF lists or compressed codes
trains on its first vectors, and a source or corpus holding fewer than it needs cannot fill that first batch
whatever its size. Said in one line before anything is written, with what the user can do in terms of what they
typed: the options they gave, or the ``--profile`` that chose the settings (``copy`` and ``index`` ask the same
question)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from care_retriever.errors import InputError
from care_retriever.stores.config import FaissIndexConfig, IndexType, Quantize
from care_retriever.stores.profiles import StoreProfile, chosen_profile

if TYPE_CHECKING:
    from care_retriever.stores.base import StoreConfig, VectorStore

FLAT_IS_FAST = "flat and hnsw indexes train on nothing; at this size exact search is fast"


def require_training_sample(
    store: VectorStore,
    dim: int,
    index: StoreConfig,
    held: int,
    source: str,
    profile: StoreProfile | str | None = None,
) -> None:
    """Refuse a write of ``held`` documents from ``source`` into ``store`` whose new index trains on more.

    Usage example:
    ```python
    from care_retriever.stores import open_store
    from care_retriever.stores.config import FaissIndexConfig

    store = open_store("faiss:stores/new")
    require_training_sample(store, 768, FaissIndexConfig(), 10, "corpus.jsonl")  # flat: trains on nothing, passes
    ```

    Args:
        store: the store written to (a new FAISS store's index may train on its first vectors).
        dim: the vectors' dimension.
        index: the settings the new store gets (the profile's, where one applied).
        held: documents the write holds.
        source: the corpus or store they come from, as the line names it.
        profile: the ``--profile`` given, where it set the new store's settings (None: none did).
    """
    from care_retriever.stores.capabilities import IndexBuilding

    needed = store.vectors_to_train(dim, index) if isinstance(store, IndexBuilding) else 0
    if held >= needed or held == 0:  # an empty write trains nothing (its store's first write will)
        return
    config = index if isinstance(index, FaissIndexConfig) else FaissIndexConfig()
    if profile is not None and chosen_profile(profile, held, dim) is StoreProfile.LARGE:
        what, remedy = _profile_remedy(store, dim, config, held, StoreProfile(profile))
    elif config.quantization is not Quantize.NONE:
        what = f"--quantize {config.quantization.value}"
        remedy = f"leave out --quantize ({FLAT_IS_FAST})"
    else:
        what = f"--index-type {config.index_type.value} (--nlist {config.nlist})"
        remedy = f"use --index-type flat or hnsw ({FLAT_IS_FAST})"
        if config.index_type is IndexType.IVF:
            remedy = f"lower --nlist to at most {held}, or {remedy}"
    raise InputError(
        f"{store.describe()}: {what} trains on the first {needed} vectors written and {source} holds {held} "
        f"documents; {remedy}; nothing was written"
    )


def _profile_remedy(
    store: VectorStore, dim: int, config: FaissIndexConfig, held: int, profile: StoreProfile
) -> tuple[str, str]:
    """What the large profile chose, as the options that would choose it, and what the user can type instead: the
    small profile, or (where the IVF lists alone need more than the write holds) fewer lists."""
    from care_retriever.stores.capabilities import IndexBuilding

    chose = f"--index-type {config.index_type.value}"
    if config.index_type in (IndexType.IVF, IndexType.IVFPQ):
        chose += f" --nlist {config.nlist}"
    if config.quantization is not Quantize.NONE:
        chose += f" --quantize {config.quantization.value}"
    what = f"--profile {profile.value} (choosing {chose})"
    remedy = "use --profile small"
    if profile is StoreProfile.LARGE:  # auto, what leaving it out gives, keeps a corpus this size small
        remedy += " or leave out --profile"
    remedy += " (the store's defaults: a flat index, which trains on nothing; at this size exact search is fast)"
    fewer_lists = dataclasses.replace(config, nlist=held)
    if isinstance(store, IndexBuilding) and store.vectors_to_train(dim, fewer_lists) <= held:
        remedy += f", or keep the profile with --nlist {held} or fewer"
    return what, remedy
