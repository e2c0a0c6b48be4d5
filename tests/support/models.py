"""Tiny CARE models the tests build offline: one that tells the sample's texts apart, one exported for a query
backend, and a store indexed with it."""

from __future__ import annotations

from pathlib import Path

from tests.support.data import SAMPLE_DIR, read_jsonl, sample_queries

# What the shared tiny model must do before any test trusts it (see ``discrimination``). With the
# initialisation transformers gives a 2-layer BERT / decoder (std 0.02) every query gets nearly the
# same vector (pairwise cosine ~0.99999, one nearest passage for all), so a test comparing results
# could not tell one query's answer from another's. Seconds of in-batch contrastive training do not
# fix that (the loss first falls by collapsing every text onto one point); a wider initialisation of
# the weight matrices does, at no cost: attention then depends on the tokens.
MAX_MEAN_QUERY_COSINE = 0.9
DISCRIMINATIVE_INIT_STD = 0.3


def discriminative_init(embedder, std: float = DISCRIMINATIVE_INIT_STD, seed: int = 0) -> None:
    """Redraw every weight matrix (embeddings, projections) of both towers from N(0, std)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for modules in (embedder.query_modules, embedder.document_modules):
            for param in modules[0].auto_model.parameters():
                if param.dim() == 2:
                    param.copy_(torch.randn(param.shape, generator=generator) * std)


# Weights drawn wider than a trained model's (so that queries get clearly different vectors) but not
# as wide as the shared fixture's 0.3, whose activations are far outside what int8 dynamic quantisation
# is made for (measured: int8 cosine 0.94 at 0.3, 0.9996 at 0.2; query pairs at most 0.96 alike at 0.2).
EXPORT_INIT_STD = 0.2


def exported_tiny_model(folder: Path, corpus: Path, backend: str) -> Path:
    """A tiny model saved in ``folder/tiny`` with an fp32 + int8 ``backend`` export of its query tower."""
    from care_retriever.cli.main import main
    from care_retriever.model.towers.scratch import init_from_scratch

    model = folder / "tiny"
    embedder = init_from_scratch("tiny", [corpus, SAMPLE_DIR / "corpus.jsonl"], seed=0)
    discriminative_init(embedder, std=EXPORT_INIT_STD)
    embedder.save_pretrained(model)
    assert main(["export", "--model", str(model), "--backend", backend, "--quantize", "int8"]) == 0
    return model


def indexed_store(folder: Path, model: Path, corpus: Path) -> str:
    """``care-retriever index`` of ``corpus`` with ``model`` into a FAISS store in ``folder``; its spec."""
    from care_retriever.cli.main import main

    spec = f"faiss:{folder / 'store'}"
    assert main(["index", "--model", str(model), "--corpus", str(corpus), "--store", spec, "--no-progress"]) == 0
    return spec


def discrimination(embedder) -> tuple[float, int]:
    """(mean pairwise cosine of the sample queries, number of distinct nearest sample passages)."""
    import numpy as np

    queries = sample_queries()
    corpus = read_jsonl(SAMPLE_DIR / "corpus.jsonl")
    q = embedder.embed_queries(queries)
    d = embedder.embed_documents([f"{r['title']}\n{r['text']}" if r.get("title") else r["text"] for r in corpus])
    cos = q @ q.T
    n = len(queries)
    mean = float((cos.sum() - np.trace(cos)) / (n * (n - 1)))
    return mean, len(set((q @ d.T).argmax(axis=1).tolist()))


def build_tiny_model(out: Path, small_corpus: Path) -> Path:
    from care_retriever.model.towers.scratch import init_from_scratch

    vocab = [small_corpus]
    if (SAMPLE_DIR / "corpus.jsonl").is_file():
        vocab.append(SAMPLE_DIR / "corpus.jsonl")
    embedder = init_from_scratch("tiny", vocab, seed=0)
    discriminative_init(embedder)
    if (SAMPLE_DIR / "corpus.jsonl").is_file():
        mean, nearest = discrimination(embedder)
        assert mean < MAX_MEAN_QUERY_COSINE, f"tiny fixture model: mean query cosine {mean:.3f}"
        assert nearest > 1, "tiny fixture model: every sample query has the same nearest passage"
    embedder.save_pretrained(out)
    return out
