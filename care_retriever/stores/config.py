"""The typed settings of a store, each checked once when it is built: which store (:class:`StoreSpec`), a FAISS
index (:class:`FaissIndexConfig`) and a Qdrant collection (:class:`QdrantCollectionConfig`).

Each class is the one home of its options' defaults and checks: the ``index`` command's flags are generated from
its fields (their ``metadata`` carries the help text and the flag where it differs from the field's name,
:mod:`care_retriever.cli.dataclass_options`), the integrations convert the dicts their users pass through
``from_manifest``, and the stores read the fields. ``to_manifest`` is the dict a store's manifest keeps under
``"index"`` (the on-disk format: unchanged); ``from_manifest`` reads every such dict written before.

Torch- and faiss-free: the CLI reads these classes when it starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, TypeVar

from care_retriever.errors import InputError
from care_retriever.model.settings import COMMON_PANEL, STORE_INDEX_PANEL, Choice, choice, count, flag_of, meta, ratio


def _set(config: object, name: str, value: Any) -> None:
    object.__setattr__(config, name, value)  # a frozen dataclass normalising its own field in __post_init__


# ---------------------------------------------------------------------------------------------------- store spec
class StoreKind(Choice):
    FAISS = "faiss"
    QDRANT = "qdrant"


STORE_HELP = "faiss:DIR | qdrant:PATH | qdrant::memory: | qdrant:http://host:6333"


@dataclass(frozen=True)
class StoreSpec:
    """Which store: ``faiss:DIR``, ``qdrant:PATH``, ``qdrant::memory:`` or ``qdrant:http(s)://host:port``, and for
    Qdrant the collection (None: the store's default)."""

    kind: StoreKind
    location: str
    collection: str | None = field(default=None, metadata=meta("Qdrant collection name.", panel=COMMON_PANEL))

    def __post_init__(self) -> None:
        _set(self, "kind", choice(StoreKind, self.kind, "store kind"))
        if not self.location:
            raise InputError(f"invalid store {str(self)!r}: expected one of {STORE_HELP.replace(' |', ',')}")

    @classmethod
    def parse(cls, spec: str, collection: str | None = None) -> StoreSpec:
        scheme, sep, location = spec.partition(":")
        if not sep or scheme not in [k.value for k in StoreKind] or not location:
            raise InputError(f"invalid store {spec!r}: expected one of {STORE_HELP.replace(' |', ',')}")
        return cls(StoreKind(scheme), location, collection)

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.location}"


# ---------------------------------------------------------------------------------------------------- FAISS
class IndexType(Choice):
    FLAT = "flat"
    HNSW = "hnsw"
    IVF = "ivf"
    IVFPQ = "ivfpq"


class Quantize(Choice):
    NONE = "none"
    SQ8 = "sq8"
    BINARY = "binary"
    PQ = "pq"


# Candidates taken from the codes per result wanted, by quantization (measured: benchmarks/results); a store's own value
# is kept in its manifest (index option "oversample") and FaissStore(oversample=...) overrides it.
FAISS_DEFAULT_OVERSAMPLE = {Quantize.SQ8: 4.0, Quantize.BINARY: 100.0, Quantize.PQ: 50.0}
QUANTIZE_HELP = (
    "FAISS: none | sq8 | binary | pq: compressed codes in RAM, full vectors on disk, every search rescored "
    "(benchmarks/results); Qdrant: none | sq8 | binary (rescored on a server). Fixed when the store is created."
)
OVERSAMPLE_HELP = "Candidates from the codes per result wanted, rescored exactly (default by quantize)."
TRAIN_SIZE_HELP = "Vectors a new IVF or quantized index trains on, held until then (default: the first batch)."
_FAISS_KEYS = {"type": "index_type"}  # manifest key -> field, where they differ


@dataclass(frozen=True)
class FaissIndexConfig:
    """A FAISS store's index: its kind and build/search parameters, and its quantization. ``quantize`` None is
    "not asked": an existing store keeps its own, a new one has none (:attr:`quantization`); ``oversample`` None:
    the store's own, or the quantization's default (:attr:`effective_oversample`)."""

    cli_panel: ClassVar[str] = STORE_INDEX_PANEL

    index_type: IndexType = field(
        default=IndexType.FLAT,
        metadata=meta(
            "FAISS index: flat (exact) | hnsw | ivf | ivfpq (see benchmarks/results/scale.md).", flag="--index-type"
        ),
    )
    m: int = field(default=32, metadata=meta("HNSW neighbours per node.", flag="--hnsw-m"))
    ef_construction: int = field(default=200, metadata=meta("HNSW build-time candidate list."))
    ef_search: int = field(default=128, metadata=meta("HNSW search-time candidate list (kept in the manifest)."))
    nlist: int = field(default=1024, metadata=meta("IVF lists."))
    nprobe: int = field(default=32, metadata=meta("IVF lists visited per search (kept in the manifest)."))
    pq_m: int = field(default=96, metadata=meta("IVF-PQ bytes per vector; must divide the dimension."))
    pq_bits: int = field(default=8, metadata=meta("Bits per PQ code (ivfpq, quantize pq)."))
    quantize: Quantize | None = field(default=None, metadata=meta(QUANTIZE_HELP))
    oversample: float | None = field(default=None, metadata=meta(OVERSAMPLE_HELP))
    train_size: int | None = field(default=None, metadata=meta(TRAIN_SIZE_HELP))

    def __post_init__(self) -> None:
        _set(self, "index_type", choice(IndexType, self.index_type, "FAISS index type"))
        for f in dataclasses.fields(self):
            if f.type == "int" or (f.name == "train_size" and self.train_size is not None):
                count(getattr(self, f.name), f"FAISS index option {f.name} ({flag_of(f)})")
        if self.quantize is not None:
            _set(self, "quantize", choice(Quantize, self.quantize, "FAISS quantize"))
        if self.oversample is not None:
            _set(self, "oversample", ratio(self.oversample, "oversample"))
        if self.quantization is not Quantize.NONE:
            if self.index_type is IndexType.IVFPQ:
                raise InputError(
                    "index type ivfpq already stores PQ codes; use --index-type ivf --quantize pq to rescore"
                )
            if self.quantization is Quantize.BINARY and self.index_type is not IndexType.FLAT:
                raise InputError(f"quantize=binary works with index type flat only, not {self.index_type.value!r}")

    @property
    def quantization(self) -> Quantize:
        """The store's code kind: none (the index holds the vectors) or sq8 / binary / pq (codes + vectors.f32)."""
        return Quantize.NONE if self.quantize is None else self.quantize

    @property
    def effective_oversample(self) -> float:
        """Candidates per result a search rescores: the given value, else the quantization's default (1: none)."""
        if self.oversample is not None:
            return self.oversample
        return FAISS_DEFAULT_OVERSAMPLE.get(self.quantization, 1.0)

    @property
    def trains_on_first_vectors(self) -> bool:
        """Whether a new index with these settings is trained on the first vectors written (IVF lists, codes)."""
        return self.index_type in (IndexType.IVF, IndexType.IVFPQ) or self.quantization is not Quantize.NONE

    @property
    def supports_remove(self) -> bool:
        """HNSW cannot remove vectors: removed rows stay in it as tombstones that searches skip."""
        return self.index_type is not IndexType.HNSW

    def to_manifest(self) -> dict[str, Any]:
        """The manifest's ``"index"`` dict, as stores have always written it: no ``quantize`` key without
        quantization (format 2), ``oversample`` resolved for a quantized store."""
        out: dict[str, Any] = {
            "type": self.index_type.value,
            "m": self.m,
            "ef_construction": self.ef_construction,
            "ef_search": self.ef_search,
            "nlist": self.nlist,
            "nprobe": self.nprobe,
            "pq_m": self.pq_m,
        }
        if self.pq_bits != _FAISS_DEFAULTS["pq_bits"]:  # older manifests have no pq_bits: theirs is the default
            out["pq_bits"] = self.pq_bits
        if self.train_size is not None:  # nor train_size: they trained on their first batch
            out["train_size"] = self.train_size
        if self.quantization is not Quantize.NONE:
            out["quantize"] = self.quantization.value
            out["oversample"] = self.effective_oversample
        elif self.quantize is None and self.oversample is not None:  # asked for a store whose quantization is kept
            out["oversample"] = self.oversample
        return out

    @classmethod
    def from_manifest(cls, index: Mapping[str, Any] | None) -> FaissIndexConfig:
        """Any ``"index"`` dict written before (format 1 ``{"type": ...}``, no ``quantize`` key, ``"none"``) or
        given by a user; keys that are not options (the store's tombstone count) are not read."""
        index = index or {}
        names = {f.name for f in dataclasses.fields(cls)}
        given = {_FAISS_KEYS.get(k, k): v for k, v in index.items()}
        return cls(**{k: v for k, v in given.items() if k in names and v is not None})

    @staticmethod
    def manifest_keys() -> list[str]:
        """The option names a manifest dict may hold."""
        inverse = {v: k for k, v in _FAISS_KEYS.items()}
        return [inverse.get(f.name, f.name) for f in dataclasses.fields(FaissIndexConfig)]


def as_faiss_config(index: StoreConfig) -> FaissIndexConfig:
    """What a FAISS store is handed: its config as it is, None its defaults; anything else is one line (a user's
    dict is read once where it is handed in, :func:`store_config`; a manifest's by ``from_manifest``)."""
    return _of_kind(index, FaissIndexConfig, "FAISS")


_Config = TypeVar("_Config", "FaissIndexConfig", "QdrantCollectionConfig")


def _of_kind(index: object, kind: type[_Config], store: str) -> _Config:
    """``index`` if it is a ``kind``, ``kind()`` (its defaults) for None, else one line (:func:`_refused`)."""
    if index is None:
        return kind()
    if not isinstance(index, kind):
        raise _refused(store, kind, index)
    return index


def _refused(store: str, wanted: type, given: object) -> InputError:
    """One line for settings a store does not take: a config of the other kind, or a dict not read at the door."""
    if isinstance(given, Mapping):
        return InputError(
            f"a {store} store takes a {wanted.__name__} or None, not a dict of settings: read it once with "
            "care_retriever.stores.config.store_config"
        )
    return InputError(f"a {store} store takes a {wanted.__name__}, not a {type(given).__name__}")


# ---------------------------------------------------------------------------------------------------- Qdrant
class QdrantQuantize(Choice):
    NONE = "none"
    SQ8 = "sq8"
    BINARY = "binary"


# Oversampling when none is given: Qdrant's guidance for rescored int8 and binary codes (not measured here: this
# machine has no Qdrant server, and local mode searches exactly; see benchmarks/results/scale.md).
QDRANT_DEFAULT_OVERSAMPLE = {QdrantQuantize.SQ8: 2.0, QdrantQuantize.BINARY: 3.0}
# older names still accepted: ``quantization: "int8"`` is ``quantize: "sq8"``, ``shard_number`` is ``shards``,
# ``replication_factor`` is ``replicas``
QDRANT_ALIASES = {"quantization": "quantize", "shard_number": "shards", "replication_factor": "replicas"}


@dataclass(frozen=True)
class QdrantCollectionConfig:
    """A Qdrant collection's settings as given: None is "not given" (an existing collection's own, Qdrant's
    default for a new one); :meth:`resolved` fills in what a new collection records."""

    cli_panel: ClassVar[str] = STORE_INDEX_PANEL

    quantize: QdrantQuantize | None = field(default=None, metadata=meta(flag="--quantize"))
    oversample: float | None = field(default=None, metadata=meta(flag="--oversample"))
    on_disk: bool | None = field(
        default=None,
        metadata=meta("Qdrant: keep the original vectors on disk (memory-mapped).", flag="--on-disk-vectors"),
    )
    shards: int | None = field(default=None, metadata=meta("Qdrant: shards of a new collection (shard_number)."))
    replicas: int | None = field(default=None, metadata=meta("Qdrant: copies of each shard (replication_factor)."))
    # given through an integration's dict only (no flag of `index`)
    always_ram: bool | None = field(default=None, metadata=meta(cli=False))
    on_disk_payload: bool | None = field(default=None, metadata=meta(cli=False))
    # the HNSW graph: given by ``--hnsw-m`` / ``--ef-construction`` / ``--ef-search`` (FAISS's flags, read for a
    # Qdrant store by cli.index_settings) or an integration's dict
    m: int | None = field(default=None, metadata=meta(cli=False))
    ef_construct: int | None = field(default=None, metadata=meta(cli=False))
    ef_search: int | None = field(default=None, metadata=meta(cli=False))  # search time (hnsw_ef), kept in manifest
    # Qdrant Edge: a segment past this many KB of vectors gets its HNSW graph and quantized codes when the store
    # is finalized (optimize); below it the segment is searched exactly. None: Qdrant's default (10,000 KB).
    indexing_threshold: int | None = field(default=None, metadata=meta(cli=False))
    # Qdrant Edge: no segment past this many KB of vectors (768-d float32: 3 KB a vector). optimize() builds one
    # segment's HNSW graph at a time, and its memory peaks with the segment: 1M such vectors in Qdrant's default
    # segments peaked at 11-15 GiB (benchmarks/results); smaller segments peak lower, and each search visits them all.
    max_segment_size: int | None = field(
        default=None,
        metadata=meta(
            "Qdrant Edge: build the HNSW graphs a segment of at most this many KB of vectors at a time (a new "
            "collection; bounds the optimizer's memory).",
            flag="--max-segment-size",
        ),
    )

    def __post_init__(self) -> None:
        if self.quantize is not None:
            try:
                _set(self, "quantize", QdrantQuantize(self.quantize))
            except (ValueError, TypeError):
                raise InputError(
                    f"unknown Qdrant quantization {self.quantize!r}; valid: "
                    f"{', '.join(q.value for q in QdrantQuantize)} (int8 is sq8; Qdrant's product quantization is "
                    "not offered)"
                ) from None
        if self.oversample is not None:
            _set(self, "oversample", ratio(self.oversample, "Qdrant option oversample"))
        for name in ("on_disk", "on_disk_payload", "always_ram"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise InputError(f"Qdrant option {name} must be true or false, got {value!r}")
        for name in ("m", "ef_construct", "ef_search", "indexing_threshold", "max_segment_size", "shards", "replicas"):
            if getattr(self, name) is not None:
                count(getattr(self, name), f"Qdrant option {name}")

    def given(self) -> dict[str, Any]:
        """The settings given (not None), by name."""
        return {
            f.name: (v.value if isinstance(v, Enum) else v)
            for f in dataclasses.fields(self)
            if (v := getattr(self, f.name)) is not None
        }

    def to_manifest(self) -> dict[str, Any]:
        """The manifest's ``"index"`` dict: the collection is HNSW, and the settings given under their names."""
        return {"type": "hnsw", **self.given()}

    @classmethod
    def from_manifest(cls, index: Mapping[str, Any] | None) -> QdrantCollectionConfig:
        """A manifest's dict or a user's (older names accepted; one line for an unknown setting or two that
        disagree)."""
        index = dict(index or {})
        names = [f.name for f in dataclasses.fields(cls)]
        known = ["type", *names, *QDRANT_ALIASES]
        unknown = sorted(set(index) - set(known))
        if unknown:
            raise InputError(f"unknown Qdrant collection options {unknown}; known: {known}")
        if index.get("type", "hnsw") != "hnsw":
            raise InputError(f"Qdrant collections are HNSW; got index type {index['type']!r}")
        out: dict[str, Any] = {}
        for key, value in index.items():
            if key == "type" or value is None:
                continue
            name = QDRANT_ALIASES.get(key, key)
            if key == "quantization" and value == "int8":
                value = "sq8"
            if name in out and out[name] != value:
                raise InputError(f"Qdrant options {name} and {key} disagree ({out[name]!r} vs {value!r}); give one")
            out[name] = value
        return cls(**out)

    def resolved(self) -> QdrantCollectionConfig:
        """With the defaults a new collection gets (what its manifest records); one line for ``oversample`` or
        ``always_ram`` without quantization."""
        self.require_quantized(self.quantize)
        quantize = self.quantize or QdrantQuantize.NONE
        if quantize is QdrantQuantize.NONE:
            return dataclasses.replace(self, quantize=quantize)
        return dataclasses.replace(
            self,
            quantize=quantize,
            # the codes searched in RAM, the originals (maybe on disk) rescore
            always_ram=True if self.always_ram is None else self.always_ram,
            oversample=QDRANT_DEFAULT_OVERSAMPLE[quantize] if self.oversample is None else self.oversample,
        )

    def local_mode(self) -> QdrantCollectionConfig:
        """The settings an embedded engine keeps (Qdrant Edge, like local mode before it, has one shard and no
        replicas)."""
        return dataclasses.replace(self, shards=None, replicas=None)

    def require_quantized(self, quantize: QdrantQuantize | None) -> None:
        """``always_ram`` and ``oversample`` apply to a collection quantized as ``quantize``, or one line."""
        given = [k for k in ("always_ram", "oversample") if getattr(self, k) is not None]
        if quantize in (None, QdrantQuantize.NONE) and given:
            raise InputError(f"Qdrant options {given} apply to a quantized collection: add quantize sq8 or binary")


def as_qdrant_config(index: StoreConfig) -> QdrantCollectionConfig:
    """What a Qdrant store is handed: its config as it is, None nothing given; anything else is one line (a user's
    dict is read once where it is handed in, :func:`store_config`; a manifest's by ``from_manifest``)."""
    return _of_kind(index, QdrantCollectionConfig, "Qdrant")


# What a store's prepare/begin/transaction take: the config of its kind (the other kind's is refused in one line),
# or None (an existing store's own settings, a new one's defaults).
StoreConfig = FaissIndexConfig | QdrantCollectionConfig | None
# What a user may hand in where settings enter (the writer's keywords, the integrations): a config, or a dict of
# the store's settings read once by :func:`store_config`.
StoreOptions = FaissIndexConfig | QdrantCollectionConfig | Mapping[str, Any] | None


_FAISS_DEFAULTS = {f.name: f.default for f in dataclasses.fields(FaissIndexConfig)}


def store_config(kind: StoreKind | str, options: StoreOptions) -> FaissIndexConfig | QdrantCollectionConfig | None:
    """The settings of a store of ``kind``, read once where users hand them in (the writer, the integrations): a
    config of that kind as it is, a dict through its ``from_manifest``; None stays None (an existing store's own
    settings, a new one's defaults). A config of the other kind is one line."""
    if options is None:
        return None
    faiss = StoreKind(kind) is StoreKind.FAISS
    if isinstance(options, Mapping):
        return FaissIndexConfig.from_manifest(options) if faiss else QdrantCollectionConfig.from_manifest(options)
    return as_faiss_config(options) if faiss else as_qdrant_config(options)


def qdrant_only_fields() -> frozenset[str]:
    """The :class:`QdrantCollectionConfig` fields a FAISS index has none like (no :class:`FaissIndexConfig` field of
    that name or flag): the settings a FAISS store refuses as Qdrant's, from the command line or an integration."""
    faiss_fields = dataclasses.fields(FaissIndexConfig)
    faiss = {f.name for f in faiss_fields} | {flag_of(f) for f in faiss_fields}
    return frozenset(
        f.name for f in dataclasses.fields(QdrantCollectionConfig) if f.name not in faiss and flag_of(f) not in faiss
    )


def qdrant_only_keys() -> frozenset[str]:
    """The keys of an integration's dict that name a Qdrant-only setting: the fields and their older names."""
    only = qdrant_only_fields()
    return only | {old for old, name in QDRANT_ALIASES.items() if name in only}
