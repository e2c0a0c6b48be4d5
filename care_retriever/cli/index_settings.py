"""The ``index`` command's generated options, read back into
:class:`~care_retriever.indexing.settings.IndexSettings`.

The command line is the CLI's: the indexing room knows its settings as typed objects only, and this module turns
the options typer parsed (by option name) into them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from care_retriever.cli.dataclass_options import cli_fields, cli_options, values_for
from care_retriever.errors import InputError
from care_retriever.indexing.config import CorpusConfig, EncodeConfig
from care_retriever.indexing.settings import IndexSettings
from care_retriever.stores.config import (
    FaissIndexConfig,
    QdrantCollectionConfig,
    StoreKind,
    StoreSpec,
    qdrant_only_fields,
)
from care_retriever.stores.profiles import ProfileConfig

QDRANT_ONLY_FLAGS_HELP = "qdrant:PATH | qdrant:http://host:6333"
# FAISS's HNSW fields -> a Qdrant collection's
QDRANT_GRAPH = {"m": "m", "ef_construction": "ef_construct", "ef_search": "ef_search"}


def qdrant_graph(config: QdrantCollectionConfig, values: Mapping[str, Any]) -> QdrantCollectionConfig:
    """FAISS's HNSW flags acting on a Qdrant collection: ``--hnsw-m`` is its ``m``, ``--ef-construction`` its
    ``ef_construct``, ``--ef-search`` its search-time ``hnsw_ef``; a flag left at its default leaves Qdrant's own.
    ``--index-type`` flat or hnsw: a Qdrant collection is HNSW (exact below the indexing threshold); ivf and ivfpq
    are FAISS's only, one line."""
    graph: dict[str, Any] = {}
    for option in cli_options(FaissIndexConfig):
        (_, name), value = option.fields[0], values.get(option.name, option.default)
        if value == option.default:
            continue
        if name == "index_type" and str(getattr(value, "value", value)) not in ("flat", "hnsw"):
            raise InputError(
                f"{option.flag} {getattr(value, 'value', value)}: a Qdrant collection is HNSW (flat or hnsw)"
            )
        if name in QDRANT_GRAPH:
            graph[QDRANT_GRAPH[name]] = value
    return dataclasses.replace(config, **graph) if graph else config


def settings_from_options(values: Mapping[str, Any]) -> IndexSettings:
    """The settings from the ``index`` command's generated options (by option name): the store's kind picks
    its config (:func:`store_index_config`)."""
    spec = StoreSpec.parse(values["store"], values.get("collection"))
    own = {f.name for f in cli_fields(IndexSettings)} - {"store"}
    return IndexSettings(
        store=spec,
        index=store_index_config(spec, values),
        encode=values_for(EncodeConfig, values),
        reader=values_for(CorpusConfig, values),
        profile=values_for(ProfileConfig, values),
        **{k: v for k, v in values.items() if k in own},
    )


def store_index_config(spec: StoreSpec, values: Mapping[str, Any]) -> FaissIndexConfig | QdrantCollectionConfig:
    """The config of ``spec``'s kind from a command's generated store options (by option name; ``index`` and
    ``copy`` take them): an option of the other kind's only is refused (a FAISS option given to a Qdrant store
    is ignored: they share the HNSW/IVF vocabulary)."""
    if spec.kind is not StoreKind.FAISS:
        return qdrant_graph(values_for(QdrantCollectionConfig, values), values)
    only = qdrant_only_fields()
    qdrant_only = [
        o.flag
        for o in cli_options(FaissIndexConfig, QdrantCollectionConfig)
        if all(owner is QdrantCollectionConfig and name in only for owner, name in o.fields)
        and values.get(o.name, o.default) != o.default
    ]
    if qdrant_only:
        verb = "applies" if len(qdrant_only) == 1 else "apply"
        raise InputError(
            f"{', '.join(qdrant_only)} {verb} to Qdrant stores only ({QDRANT_ONLY_FLAGS_HELP}); got {spec}"
        )
    return values_for(FaissIndexConfig, values)


def store_options_given(values: Mapping[str, Any]) -> bool:
    """Whether any store option (:class:`FaissIndexConfig`, :class:`QdrantCollectionConfig`) differs from its
    default: asked for, rather than left to the store."""
    return any(
        values.get(o.name, o.default) != o.default for o in cli_options(FaissIndexConfig, QdrantCollectionConfig)
    )
