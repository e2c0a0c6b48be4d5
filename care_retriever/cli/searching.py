"""The ``search`` command: a store searched with the query tower alone, its BM25 side, or both."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from care_retriever import strict_json
from care_retriever.cli.filter_args import cli_filters
from care_retriever.cli.options import TrustRemoteCode
from care_retriever.cli.panels import COMMON, HYBRID
from care_retriever.errors import InputError
from care_retriever.model.towers.loading import quiet_transformers
from care_retriever.sparse.fusion import DEFAULT_DENSE_WEIGHT, DEFAULT_FUSION, DEFAULT_RRF_K

if TYPE_CHECKING:
    from care_retriever.model.protocols import QueryEncoder


def _load_query_side(model: str, device: str | None, backend: str, trust_remote_code: bool) -> QueryEncoder:
    from care_retriever.search.backends import load_query_embedder, resolve_backend

    if resolve_backend(model, backend) == "torch":
        quiet_transformers()
    return load_query_embedder(model, backend, device=device, trust_remote_code=trust_remote_code)


def search(
    queries: Annotated[list[str], typer.Argument(help="One or more queries.")],
    model: Annotated[
        str,
        typer.Option(help="CARE model folder or hub id (only its query tower is loaded).", rich_help_panel=COMMON),
    ],
    store: Annotated[
        str, typer.Option(help="faiss:DIR | qdrant:PATH | qdrant:http://host:6333", rich_help_panel=COMMON)
    ],
    collection: Annotated[str | None, typer.Option(help="Qdrant collection name.", rich_help_panel=COMMON)] = None,
    top_k: Annotated[int, typer.Option(help="Hits per query.", rich_help_panel=COMMON)] = 10,
    filter_: Annotated[
        list[str] | None,
        typer.Option(
            "--filter",
            help="Metadata filter FIELD OP VALUE, OP one of = != > >= < <= (year>=2020, dept=心内科, dept=A,B for any "
            "of; 3 is a number, '3' a string; a.b a nested field). Repeatable: every flag is AND-ed.",
        ),
    ] = None,
    filter_json: Annotated[
        str | None,
        typer.Option(
            "--filter-json",
            help="A whole filter as JSON (Haystack syntax: field/operator/value, AND/OR/NOT) or @file.json; "
            "AND-ed with --filter. See docs/filters.md.",
        ),
    ] = None,
    instruction: Annotated[
        str | None, typer.Option(help="Override the query instruction (instruction-tuned query towers).")
    ] = None,
    device: Annotated[str | None, typer.Option(help="cpu | cuda (default: auto).")] = None,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help="One JSON object per query per line, with the query backend that answered.",
            rich_help_panel=COMMON,
        ),
    ] = False,
    mode: Annotated[
        str,
        typer.Option(help="dense (query tower) | sparse (BM25) | hybrid (both, fused).", rich_help_panel=COMMON),
    ] = "dense",
    fusion: Annotated[
        str, typer.Option(help="Hybrid fusion: rrf | dbsf | wsum (docs/hybrid.md).", rich_help_panel=HYBRID)
    ] = DEFAULT_FUSION,
    rrf_k: Annotated[int, typer.Option(help="RRF constant k: 1 / (k + rank).", rich_help_panel=HYBRID)] = DEFAULT_RRF_K,
    dense_weight: Annotated[
        float, typer.Option(help="wsum: weight of the dense side (BM25 gets the rest).", rich_help_panel=HYBRID)
    ] = DEFAULT_DENSE_WEIGHT,
    backend: Annotated[
        str,
        typer.Option(
            help="auto | torch | onnx | openvino (auto: the model's export if it has one, int8 when exported so; see "
            "`export`). Which one answered is said on stderr (and in --json) when it is not torch.",
            rich_help_panel=COMMON,
        ),
    ] = "auto",
    trust_remote_code: TrustRemoteCode = False,
) -> None:
    """Search a store with the query tower, its BM25 side, or both (--mode hybrid)."""
    from care_retriever.search.backends import query_backend
    from care_retriever.search.hybrid import sparse_store
    from care_retriever.search.retriever import CareRetriever
    from care_retriever.sparse import FusionConfig, check_mode
    from care_retriever.stores import open_store

    if top_k < 1:
        raise InputError(f"--top-k must be >= 1, got {top_k}")
    check_mode(mode)
    fusion_config = FusionConfig(fusion, k=rrf_k, dense_weight=dense_weight)
    filters = cli_filters(filter_, filter_json)
    target = open_store(store, collection=collection, create=False)
    target.require_manifest()
    if mode != "dense":
        sparse_store(target)  # before loading the model
    embedder = _load_query_side(model, device, backend, trust_remote_code)
    answering = query_backend(embedder) if mode != "sparse" else None  # BM25 alone encodes no query
    if answering not in (None, "torch"):  # an export scores slightly otherwise than the torch tower: said
        typer.echo(
            f"search: queries encoded by the {answering} export of the query tower (--backend torch for the "
            "torch tower)",
            err=True,
        )
    retriever = CareRetriever(target, embedder, instruction=instruction)
    results = retriever.search(queries, top_k=top_k, filters=filters, mode=mode, fusion=fusion_config)
    for query, hits in zip(queries, results, strict=True):
        if json_out:
            row = {
                "query": query,
                "query_backend": answering,
                "hits": [
                    {
                        "id": h.id,
                        "score": round(h.score, 6),
                        "text": h.text,
                        "title": h.title,
                        "metadata": h.metadata,
                    }
                    for h in hits
                ],
            }
            sys.stdout.write(strict_json.dumps(row) + "\n")
        else:
            typer.echo(f"\n{query}")
            for rank, h in enumerate(hits, 1):
                text = (h.title + " | " if h.title else "") + h.text.replace("\n", " ")
                typer.echo(f"  {rank:>2}. {h.score:.4f}  [{h.id}]  {text[:80]}")
    retriever.close()
