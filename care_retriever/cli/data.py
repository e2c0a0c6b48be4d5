"""``care-retriever data ...``: build training data (diversify, mine-negatives, alignment, label)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from care_retriever import strict_json
from care_retriever.cli.options import TrustRemoteCode
from care_retriever.cli.panels import COMMON
from care_retriever.errors import InputError

if TYPE_CHECKING:
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.model.reading import Load

data_app = typer.Typer(
    help="Build CARE training data: diversify, mine-negatives, alignment, label.", no_args_is_help=True
)


def _read_rows(path: Path) -> list[dict]:
    from care_retriever.training.pairs import iter_jsonl

    return [row for _, row in iter_jsonl(path)]


def _load(model: str, load: Load, trust_remote_code: bool) -> AsymmetricEmbedder:
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.model.loading import quiet_transformers

    quiet_transformers()
    return AsymmetricEmbedder.from_pretrained(model, load=load, trust_remote_code=trust_remote_code)


def _write(rows: list[dict], out: Path, force: bool) -> None:
    from care_retriever.training.alignment import write_rows

    write_rows(rows, out, force=force)


@data_app.command()
def diversify(
    input: Annotated[Path, typer.Argument(help="JSONL rows to filter.")],
    out: Annotated[Path, typer.Option(help="Where to write the kept rows (JSONL).", rich_help_panel=COMMON)],
    model: Annotated[
        str,
        typer.Option(
            help="CARE model (query tower for queries, document tower for documents).", rich_help_panel=COMMON
        ),
    ],
    side: Annotated[
        str, typer.Option(help="query | document: the tower that embeds, the defaults.", rich_help_panel=COMMON)
    ] = "query",
    field: Annotated[str | None, typer.Option(help="Row field to compare (default: query / text).")] = None,
    top_k: Annotated[int | None, typer.Option(help="Neighbours retrieved per candidate (default 5).")] = None,
    threshold: Annotated[float | None, typer.Option(help="Similarity t (default 0.85 query, 0.78 document).")] = None,
    max_neighbours: Annotated[int | None, typer.Option(help="Drop if > n neighbours exceed t (default 1).")] = None,
    seed_size: Annotated[int, typer.Option(help="First rows that seed the index unfiltered.")] = 5000,
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.", rich_help_panel=COMMON)] = False,
    trust_remote_code: TrustRemoteCode = False,
) -> None:
    """Drop near-duplicate rows with the paper's diversification filter over a FAISS index."""
    from care_retriever.training.diversify import PAPER_DEFAULTS
    from care_retriever.training.diversify import diversify as run

    if side not in PAPER_DEFAULTS:
        raise InputError(f"--side must be 'query' or 'document', got {side!r}")
    if out.exists() and not force:
        raise InputError(f"{out}: exists (use --force to replace it)")
    k, t, n = PAPER_DEFAULTS[side]
    key = field or ("query" if side == "query" else "text")
    rows = _read_rows(input)
    texts = []
    for i, row in enumerate(rows, 1):
        value = row.get(key)
        if not isinstance(value, str) or not value.strip():
            raise InputError(f"{input}: row {i}: missing or empty {key!r}")
        texts.append(value)
    embedder = _load(model, "query" if side == "query" else "document", trust_remote_code)
    embed = embedder.embed_queries if side == "query" else embedder.embed_documents
    kept, report = run(
        texts,
        lambda batch: embed(batch),
        top_k=top_k or k,
        threshold=t if threshold is None else threshold,
        max_neighbours=n if max_neighbours is None else max_neighbours,
        seed_size=seed_size,
    )
    _write([rows[i] for i in kept], out, force)
    typer.echo(f"kept {report.kept} of {report.total} rows ({report.dropped} near-duplicates dropped) -> {out}")


@data_app.command("mine-negatives")
def mine_negatives(
    input: Annotated[Path, typer.Argument(help="JSONL pairs {query, text | positive[], negative[]?, label?}.")],
    out: Annotated[
        Path, typer.Option(help="Where to write {query, positive[], negative[]} rows.", rich_help_panel=COMMON)
    ],
    model: Annotated[
        str,
        typer.Option(help="CARE model (query tower for queries, document tower for the pool).", rich_help_panel=COMMON),
    ],
    corpus: Annotated[
        Path | None,
        typer.Option(
            help="Candidate pool: a corpus (JSONL/BEIR); default: the input's own documents.", rich_help_panel=COMMON
        ),
    ] = None,
    num: Annotated[int, typer.Option(help="Negatives per query.", rich_help_panel=COMMON)] = 3,
    range_min: Annotated[int, typer.Option(help="Skip the top ranks (likely unlabelled positives).")] = 10,
    range_max: Annotated[int, typer.Option(help="Take negatives from ranks below this.")] = 100,
    duplicate_threshold: Annotated[
        float, typer.Option(help="Drop candidates this similar to a positive (near-duplicates).")
    ] = 0.95,
    min_label: Annotated[float | None, typer.Option(help="With labels: positives have label >= this.")] = None,
    miner: Annotated[
        str, typer.Option(help="Tower embedding the queries: query (as search will) | document (LLM both sides).")
    ] = "query",
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.", rich_help_panel=COMMON)] = False,
    trust_remote_code: TrustRemoteCode = False,
) -> None:
    """Mine hard negatives from a FAISS index, excluding positives and their near-duplicates."""
    from care_retriever.training.hard_negatives import mine_for_queries
    from care_retriever.training.pairs import read_pairs, unique

    if out.exists() and not force:
        raise InputError(f"{out}: exists (use --force to replace it)")
    examples = read_pairs(input, min_label=min_label)
    positives: dict[str, set[str]] = {}
    given: dict[str, list[str]] = {}
    for e in examples:
        positives.setdefault(e.query, set()).add(e.positive)
        given.setdefault(e.query, []).extend(e.negatives)
    if corpus is not None:
        from care_retriever.indexing.corpus import read_corpus

        pool = unique([d.embedding_text() for d in read_corpus(corpus)])
    else:
        pool = unique([t for e in examples for t in (e.positive, *e.negatives)])
    embedder = _load(model, "both", trust_remote_code)
    mined = mine_for_queries(
        embedder,
        positives,
        pool,
        num=num,
        range_min=range_min,
        range_max=range_max,
        duplicate_threshold=duplicate_threshold,
        miner=miner,
    )
    rows = [{"query": q, "positive": sorted(positives[q]), "negative": unique(given[q] + mined[q])} for q in positives]
    _write(rows, out, force)
    found = sum(len(mined[q]) for q in positives)
    typer.echo(f"{len(rows)} queries, {found} mined negatives -> {out}")


@data_app.command()
def alignment(
    inputs: Annotated[list[Path], typer.Argument(help="Pair files (any training format).")],
    out: Annotated[Path, typer.Option(help="Where to write {text, side} rows.")],
    format: Annotated[str, typer.Option(help="Format of the inputs: pairs | qtr | sts | qa.")] = "pairs",
    corpus: Annotated[list[Path] | None, typer.Option(help="Corpora whose passages join the document side.")] = None,
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
) -> None:
    """Stage I alignment data: every query and every document (each later paired with itself)."""
    from care_retriever.training.alignment import alignment_rows
    from care_retriever.training.pairs import load_pairset
    from care_retriever.training.recipe_spec import DATA_FORMATS, DatasetSpec

    if format not in DATA_FORMATS or format in ("alignment", "text"):
        raise InputError(f"--format must be one of pairs, qtr, sts, qa; got {format!r}")
    if out.exists() and not force:
        raise InputError(f"{out}: exists (use --force to replace it)")
    pairsets = [load_pairset(DatasetSpec(name=p.stem, path=str(p.resolve()), format=format), Path(".")) for p in inputs]
    texts: list[str] = []
    if corpus:
        from care_retriever.indexing.corpus import read_corpus

        for path in corpus:
            texts.extend(d.embedding_text() for d in read_corpus(path))
    rows = alignment_rows(pairsets, texts)
    _write(rows, out, force)
    sides = {"query": 0, "document": 0}
    for row in rows:
        sides[row["side"]] += 1
    typer.echo(f"{sides['query']} query-side and {sides['document']} document-side texts -> {out}")


@data_app.command()
def label(
    input: Annotated[Path, typer.Argument(help="JSONL {query, candidates[] | text | positive[] / negative[]}.")],
    out: Annotated[Path, typer.Option(help="Where to write {query, positive[], negative[], grades} rows.")],
    endpoint: Annotated[str, typer.Option(help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")],
    judge: Annotated[list[str], typer.Option(help="Judge model name (repeat: every judge must agree).")],
    api_key_env: Annotated[str, typer.Option(help="Environment variable holding the API key (optional).")] = (
        "OPENAI_API_KEY"
    ),
    workers: Annotated[int, typer.Option(help="Concurrent requests.")] = 4,
    timeout: Annotated[float, typer.Option(help="Seconds per request.")] = 60.0,
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
) -> None:
    """Grade candidates with LLM judges (S/A/B/C/D rubric); keep only unanimous labels."""
    from care_retriever.training.labelling import ChatJudge, label_pairs, rows_from_judgements

    if out.exists() and not force:
        raise InputError(f"{out}: exists (use --force to replace it)")
    pairs: list[tuple[str, str]] = []
    for i, row in enumerate(_read_rows(input), 1):
        query = row.get("query")
        if not isinstance(query, str) or not query.strip():
            raise InputError(f"{input}: row {i}: missing or empty 'query'")
        candidates: list = []
        for key in ("candidates", "positive", "negative", "text"):
            value = row.get(key)
            candidates.extend([value] if isinstance(value, str) else value or [])
        if not candidates:
            raise InputError(f"{input}: row {i}: no candidates ('candidates', 'text', 'positive' or 'negative')")
        for text in candidates:
            if not isinstance(text, str) or not text.strip():
                raise InputError(f"{input}: row {i}: empty or non-string candidate")
            pairs.append((query, text))
    api_key = os.environ.get(api_key_env) or None
    judges = [ChatJudge(endpoint, name, api_key=api_key, timeout=timeout) for name in judge]
    judgements, report = label_pairs(pairs, judges, workers=workers)
    rows = rows_from_judgements(judgements)
    _write(rows, out, force)
    typer.echo(
        f"{report.pairs} pairs x {len(judges)} judges: {report.positives} positive, {report.negatives} negative, "
        f"{report.discarded} discarded (no unanimity), {report.unparsable} unparsable grades; "
        f"{len(rows)} queries -> {out}"
    )
    typer.echo(strict_json.dumps(report.per_judge))


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
