"""The one option set of ``care-retriever index`` and ``torchrun -m care_retriever.index``
(:class:`IndexSettings`): light to import, since the CLI reads its defaults when it starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from care_retriever.errors import InputError
from care_retriever.indexing.config import SPARSE, CorpusConfig, EncodeConfig
from care_retriever.model.settings import COMMON_PANEL, CORPUS_PANEL, meta
from care_retriever.model.towers.loading import TRUST_REMOTE_CODE_HELP
from care_retriever.stores.config import STORE_HELP, FaissIndexConfig, QdrantCollectionConfig, StoreKind, StoreSpec
from care_retriever.stores.profiles import ProfileConfig

DIST_BACKENDS = ("auto", "nccl", "gloo")  # torch.distributed's, not search's query backends


@dataclass(frozen=True)
class IndexSettings:
    """The one option set of ``care-retriever index`` and ``torchrun -m care_retriever.index``: the store, its index
    or collection settings, the encoding, and the run. Checked once, when it is built; the command's flags are
    generated from these fields and from the configs' (:func:`index_options_classes`), and read back into these
    settings by :func:`care_retriever.cli.index_settings.settings_from_options`."""

    store: StoreSpec = field(metadata=meta(STORE_HELP, panel=COMMON_PANEL))  # a spec string is parsed
    model: str | None = field(default=None, metadata=meta("CARE model folder or hub id.", panel=COMMON_PANEL))
    corpus: Path | None = field(
        default=None,
        metadata=meta(
            "Corpus: JSONL or a JSON array ({_id|id, text, title?, metadata?}), CSV/TSV with a header, Parquet, a "
            "saved Hugging Face dataset folder, a BEIR folder, or .txt (one document per line); see --format.",
            panel=COMMON_PANEL,
        ),
    )
    reader: CorpusConfig = field(default_factory=CorpusConfig)  # how the corpus is read (--format, --id-field ...)
    # the store's settings (None: the defaults of the store's kind); kept in its manifest
    index: FaissIndexConfig | QdrantCollectionConfig | None = field(default=None, metadata=meta(cli=False))
    profile: ProfileConfig = field(default_factory=ProfileConfig)  # a new store's settings by the corpus's size
    encode: EncodeConfig = field(default_factory=EncodeConfig)
    update: bool = field(
        default=False,
        metadata=meta(
            "Update an existing store: fail if STORE holds no index yet (a mistyped path). "
            "Unchanged documents are skipped with or without it.",
            panel=COMMON_PANEL,
        ),
    )
    prune: bool = field(default=False, metadata=meta("Also delete stored documents whose id is not in the corpus."))
    yes: bool = field(
        default=False,
        metadata=meta(
            "With --prune: delete even when more stored documents would go than the store keeps (without it such a "
            "run stops before writing anything).",
            flag="--yes",
        ),
    )
    skip_invalid: bool = field(
        default=False, metadata=meta("Skip invalid rows instead of stopping at the first.", panel=CORPUS_PANEL)
    )
    device: str | None = field(
        default=None,
        metadata=meta("cpu | cuda | cuda:N (default: auto; cuda:LOCAL_RANK under torchrun).", panel=COMMON_PANEL),
    )
    dist_backend: str = field(
        default="auto",
        metadata=meta("Process-group backend under torchrun: auto (nccl on GPUs, else gloo), nccl, gloo."),
    )
    timeout_minutes: float = field(
        default=120.0,
        metadata=meta("Collective timeout under torchrun (the others wait while rank 0 reads the corpus)."),
    )
    progress: bool = field(default=True, metadata=meta("Show a progress bar (rank 0)."))
    sparse: bool = field(
        default=SPARSE, metadata=meta("Also write the BM25 side for --mode sparse|hybrid searches (docs/hybrid.md).")
    )
    # a document tower whose model code ships with it (every rank loads it)
    trust_remote_code: bool = field(default=False, metadata=meta(TRUST_REMOTE_CODE_HELP, flag="--trust-remote-code"))

    def __post_init__(self) -> None:
        """Every check that needs neither the corpus nor the model: a bad option fails before any work."""
        if isinstance(self.store, str):
            object.__setattr__(self, "store", StoreSpec.parse(self.store))
        if self.model is None or self.corpus is None:
            raise InputError("index needs --model and --corpus (or --sparse-only to add the BM25 side of a store)")
        wanted = FaissIndexConfig if self.store.kind is StoreKind.FAISS else QdrantCollectionConfig
        if self.index is None:
            object.__setattr__(self, "index", wanted())
        elif not isinstance(self.index, wanted):
            raise InputError(f"{self.store} takes a {wanted.__name__}, got a {type(self.index).__name__}")
        if self.dist_backend not in DIST_BACKENDS:
            raise InputError(f"Unknown --dist-backend {self.dist_backend!r}. Available backends: {list(DIST_BACKENDS)}")
        if not self.timeout_minutes > 0:
            raise InputError(f"--timeout-minutes must be > 0, got {self.timeout_minutes}")


def index_options_classes() -> tuple[type, ...]:
    """The classes whose fields are the ``index`` command's options, in the order ``--help`` lists them."""
    stores = (FaissIndexConfig, QdrantCollectionConfig, ProfileConfig)
    return (IndexSettings, StoreSpec, CorpusConfig, EncodeConfig, *stores)
