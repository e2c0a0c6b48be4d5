"""How the document tower encodes a corpus: :class:`EncodeConfig`, checked once when it is built.

The home of the ``index`` command's encoding flags (generated from the fields,
:mod:`care_retriever.cli.dataclass_options`); the batch defaults and the ``max_batch_tokens`` parser it checks with
live on the ground floor (:mod:`care_retriever.runtime.batch_limits`). Torch-free: the CLI reads it when it starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from care_retriever.errors import InputError
from care_retriever.model.settings import CORPUS_PANEL, ENCODING_PANEL, count, meta
from care_retriever.runtime.batch_limits import (
    AUTO,
    CUDA_DOCUMENT_BATCH_SIZE,
    DOCUMENT_BATCH_SIZE,
    parse_max_batch_tokens,
)
from care_retriever.runtime.choices import ATTN_IMPLEMENTATIONS, DTYPE_CHOICES, DTYPE_NAMES

# The document tower's forward pass (care_retriever.runtime.forward): how a pass is laid out, and whether the tower's
# layers are compiled. "fp8" is a document-side precision only (the Linear layers in float8, on GPUs that compute it).
FORWARD_PATHS = ("auto", "packed", "padded")
COMPILE_MODES = ("auto", "on", "off")
NORM_MODES = ("auto", "fused", "eager")
FP8 = "fp8"

# An indexing run also writes the BM25 side of the store (IndexSettings.sparse, DocumentStoreWriter's sparse).
SPARSE = True


@dataclass(frozen=True)
class EncodeConfig:
    """How the document tower encodes a corpus: the encoding options of an indexing run, checked when built.

    Usage example:
    ```python
    from care_retriever import AsymmetricEmbedder, DocumentStoreWriter, read_corpus
    from care_retriever.indexing.config import EncodeConfig

    embedder = AsymmetricEmbedder.from_pretrained("models/care", load="document")
    encode = EncodeConfig(batch_size=16, dtype="fp32", checkpoint_every=64)
    writer = DocumentStoreWriter(embedder, "faiss:stores/encoded", encode=encode, show_progress=False)
    writer.write(read_corpus("corpus.jsonl"))
    ```

    :param batch_size: documents per forward pass at most (None: 16 on a CPU, more on a GPU).
    :param max_batch_tokens: also at most this many padded tokens per pass: ``auto`` (sized from the GPU's free
        memory; none on a CPU), ``none`` or a number.
    :param sort_window: documents sorted by length together before batching.
    :param dtype: the document tower's precision: ``auto``, ``saved``, ``fp32``, ``bf16``, ``fp16`` or ``fp8``.
    :param forward: ``auto``, ``packed`` (texts end to end, no padding: a decoder tower on CUDA) or ``padded``.
    :param compile: ``auto``, ``on`` or ``off``: ``torch.compile`` of the tower's layers.
    :param norms: ``auto``, ``fused`` or ``eager``: the tower's RMSNorm layers through torch's fused kernel or not.
    :param attn_implementation: ``auto``, ``sdpa``, ``flash_attention_2`` or ``eager``.
    :param chunk_size: documents read per chunk (bounds memory).
    :param checkpoint_every: checkpoint the store every this many encoded documents.
    :raises InputError: a value out of range or not one of the choices, in one line.
    """

    cli_panel: ClassVar[str] = ENCODING_PANEL

    batch_size: int | None = field(
        default=None,
        metadata=meta(
            f"Documents per forward pass at most (per rank under torchrun). Default: {DOCUMENT_BATCH_SIZE} on CPU, "
            f"{CUDA_DOCUMENT_BATCH_SIZE} on a GPU."
        ),
    )
    # padded tokens per forward pass at most: "auto" sizes it from the GPU's free memory (none on CPU); None: no
    # budget, batch_size alone
    max_batch_tokens: int | str | None = field(
        default=AUTO,
        metadata=meta(
            "auto | none | N: also at most N padded tokens per forward pass (texts x the longest one's tokens): "
            "short documents go many to a batch, long ones few (an LLM tower's memory stays flat); a longer document "
            "goes alone. auto: sized from the GPU's free memory (none on CPU)."
        ),
    )
    sort_window: int = field(
        default=65536,
        metadata=meta("Documents sorted by length together before batching (streamed a window at a time)."),
    )
    dtype: str = field(
        default=AUTO,
        metadata=meta(
            "Document tower precision: auto (bf16 on GPUs with native bf16; on older GPUs fp16, or fp32 for a "
            "tower pretrained in bf16, which overflows fp16; on CPU fp32, or bf16 for an LLM tower pretrained in bf16 "
            "where the CPU multiplies bf16 in hardware, AMX) | saved (the tower's own) | fp32 | bf16 | fp16 | fp8 "
            "(opt-in: the Linear layers in float8, rowwise scaled, compiled; GPUs of compute capability >= 8.9 only; "
            "check its quality on your tower first: benchmarks/results/gpu.md)."
        ),
    )
    forward: str = field(
        default=AUTO,
        metadata=meta(
            "auto | packed | padded: packed lays the texts of a pass end to end (no padding, no mask; variable-length "
            "attention) for a decoder tower on CUDA; auto packs where that runs, else padded (SDPA)."
        ),
    )
    compile: str = field(
        default=AUTO,
        metadata=meta(
            "auto | on | off: torch.compile of the document tower's layers (falls back to eager in one line where "
            "compiling fails). auto: on for --dtype fp8, off elsewhere until measured faster there."
        ),
    )
    norms: str = field(
        default=AUTO,
        metadata=meta(
            "auto | fused | eager: the tower's RMSNorm layers through torch's fused kernel (one kernel a norm instead "
            "of six) or the model's own code. auto: fused where the layers run eager on CUDA (benchmarks/results)."
        ),
    )
    attn_implementation: str = field(
        default=AUTO,
        metadata=meta(
            "auto (flash_attention_2 where flash-attn is installed and the tower runs on CUDA in fp16/bf16, "
            "else sdpa) | sdpa | flash_attention_2 | eager."
        ),
    )
    chunk_size: int = field(
        default=1024, metadata=meta("Documents read per chunk (memory bound); under torchrun split over all ranks.")
    )
    checkpoint_every: int = field(default=8192, metadata=meta("Checkpoint the store every N encoded documents."))

    def __post_init__(self) -> None:
        if self.batch_size is not None:
            count(self.batch_size, "--batch-size")
        object.__setattr__(self, "max_batch_tokens", parse_max_batch_tokens(self.max_batch_tokens))
        count(self.sort_window, "--sort-window")
        count(self.chunk_size, "--chunk-size")
        count(self.checkpoint_every, "--checkpoint-every")
        if self.dtype not in (*DTYPE_NAMES, FP8):
            raise InputError(f"Unknown --dtype {self.dtype!r}. Available: {[*DTYPE_CHOICES, FP8]}")
        if self.forward not in FORWARD_PATHS:
            raise InputError(f"Unknown --forward {self.forward!r}. Available: {list(FORWARD_PATHS)}")
        if self.compile not in COMPILE_MODES:
            raise InputError(f"Unknown --compile {self.compile!r}. Available: {list(COMPILE_MODES)}")
        if self.norms not in NORM_MODES:
            raise InputError(f"Unknown --norms {self.norms!r}. Available: {list(NORM_MODES)}")
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise InputError(
                f"Unknown --attn-implementation {self.attn_implementation!r}. Available: {list(ATTN_IMPLEMENTATIONS)}"
            )


# How a corpus file is read (care_retriever.indexing.corpus): "auto" recognises it by its content and name.
CORPUS_FORMATS = ("auto", "jsonl", "json", "csv", "tsv", "parquet", "hf", "text", "beir")


@dataclass(frozen=True)
class CorpusConfig:
    """How the corpus is read: its format, and which columns of a table are the id, the text and the title.

    Example:
        ```python
        CorpusConfig(format="csv", id_field="pmid", text_field="abstract")
        ```

    :param format: auto | jsonl | json | csv | tsv | parquet | hf | text | beir.
    :param id_field: the column of a table that holds the document id (default: ``_id``, else ``id``).
    :param text_field: the column that holds the text (default: ``text``).
    :param title_field: the column that holds the title (default: ``title``; none is fine).
    """

    cli_panel: ClassVar[str] = CORPUS_PANEL

    format: str = field(
        default="auto",
        metadata=meta(
            "auto | jsonl | json | csv | tsv | parquet | hf | text | beir. auto: a folder with corpus.jsonl is BEIR, "
            "one with dataset_info.json a saved Hugging Face dataset; a file by its content (a JSON object per line, "
            "a JSON array) or its suffix (.csv, .tsv, .parquet); plain text (one document per line) only for .txt."
        ),
    )
    id_field: str | None = field(
        default=None, metadata=meta("Column (CSV/TSV/Parquet/HF) or JSON field of the document id (default: _id, id).")
    )
    text_field: str | None = field(default=None, metadata=meta("Column or JSON field of the text (default: text)."))
    title_field: str | None = field(default=None, metadata=meta("Column or JSON field of the title (default: title)."))

    def __post_init__(self) -> None:
        if self.format not in CORPUS_FORMATS:
            raise InputError(f"Unknown --format {self.format!r}. Available: {list(CORPUS_FORMATS)}")
        for flag, name in (("--id-field", self.id_field), ("--text-field", self.text_field)):
            if name is not None and not name.strip():
                raise InputError(f"{flag} must name a column, got an empty name")
