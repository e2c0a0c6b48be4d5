"""The scoring side of ``experiments.training_miniature_report``: the tasks and the models of a miniature run (the
paper's tables, the hybrid and short-document rows each model is scored as), every model of a run and BM25 through
the evaluation harness with the scores kept in the run folder, and a run's seed and stage times.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
from pathlib import Path

KUAKE_RETRIEVAL, IMQA, RERANK, STS = "kuake-qtr-retrieval", "im-qa-retrieval", "kuake-qtr-rerank", "chip-sts"
TASKS = (KUAKE_RETRIEVAL, IMQA, RERANK, STS)
SCORES_FILE = "miniature_scores.json"
TABLE4 = ("small-symmetric", "large-symmetric", "asymmetric-two-stage")
TABLE5 = (
    "asymmetric-two-stage",
    "without-stage-ii",
    "without-stage-i",
    "stage1-without-mse",
    "stage1-without-contrastive",
    "stage1-on-finetuning-data",
)
TABLE7 = ("small-symmetric", "score-distillation", "asymmetric-two-stage")
# Dense models also scored in hybrid mode (`eval --mode hybrid`: + BM25, the product's default fusion). Rerank
# has no sparse side, so a hybrid row's rerank (and Avg) is its dense model's.
HYBRID = ("small-symmetric", "asymmetric-two-stage")


def hybrid_name(model: str) -> str:
    from care_retriever.evaluation.hybrid import mode_label
    from care_retriever.sparse.fusion import FusionConfig

    return mode_label(model, "hybrid", FusionConfig())


# The target "its im-qa score rises with the longer documents". The same model, its document tower cut to
# the old recipes' 64 tokens at inference (im-qa only: kuake-qtr titles are shorter than that), against
# its whole-answer (256-token) score: what the longer documents are worth to the trained model.
SHORT_DOCUMENTS = {"asymmetric-two-stage": 64}


def short_name(model: str) -> str:
    return f"{model} (documents cut to {SHORT_DOCUMENTS[model]} tokens)"


def rows_of(name: str) -> list[str]:
    """The rows a model is scored as: dense, hybrid (+ BM25) and, where listed, with short documents."""
    return (
        [name]
        + ([hybrid_name(name)] if name in HYBRID else [])
        + ([short_name(name)] if name in SHORT_DOCUMENTS else [])
    )


ORDER = (*TABLE4, *TABLE5[1:], "score-distillation")


def miniature_stages() -> list[str]:
    """The stages `miniature.yaml` runs (the ablation recipe adds branches to them)."""
    from care_retriever.training.recipe import load_recipe

    return [stage.name for stage in load_recipe("miniature").stages]


def wall_seconds(run: Path, run_state: dict) -> dict[str, float]:
    """Wall time per stage: the run's own ``wall_seconds``, else (runs from before it was kept) the
    time between consecutive stage folders being saved, which also counts the earlier stage's exports."""
    reports = run_state.get("reports", [])
    if all("wall_seconds" in r for r in reports):  # (none yet: no stage times)
        return {r["name"]: float(r["wall_seconds"]) for r in reports}
    order = ["init", *run_state.get("done", [])[1:]]
    saved = {name: (run / "stages" / name / "care_config.json").stat().st_mtime for name in order}
    return {name: saved[name] - saved[before] for before, name in itertools.pairwise(order)}


def models_of(run: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    models = run / "models"
    if models.is_dir():
        for name in ORDER:
            if (models / name).is_dir():
                found[name] = models / name
        for path in sorted(models.iterdir()):
            if path.is_dir() and path.name not in found:
                found[path.name] = path
    if "asymmetric-two-stage" not in found and (run / "final").is_dir():
        found["asymmetric-two-stage"] = run / "final"
    return found


def parameters(modules) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


def query_speed(embedder, queries: list[str], n: int = 200) -> float:
    """Queries per second, one query per call (the online search setting)."""
    sample = queries[:n]
    embedder.embed_queries(sample[:5])  # warm-up
    start = time.perf_counter()
    for q in sample:
        embedder.embed_queries([q])
    return len(sample) / (time.perf_counter() - start)


class SharedDocumentEmbeddings:
    """An embedder whose document embeddings are shared with every model of the same document space.

    Most models of an ablation run keep the document tower of ``stage0-document`` (Stage I freezes it):
    large-symmetric, without-stage-ii and Table 5's three Stage I variants. Their corpora are the same
    vectors, so each space (``space_fingerprint``: the document tower's weights, dim and text rule) encodes
    each corpus once per run instead of once per model.
    """

    def __init__(self, embedder, store: dict) -> None:
        self.embedder = embedder
        self.store = store

    def __getattr__(self, name: str):
        return getattr(self.embedder, name)

    def embed_documents(self, texts, **kwargs):
        digest = hashlib.sha256("\x00".join(texts).encode("utf-8")).hexdigest()
        key = (self.embedder.space_fingerprint, digest)
        if key not in self.store:
            self.store[key] = self.embedder.embed_documents(texts, **kwargs)
        return self.store[key]


def score_run(run: Path, data_dir: Path, rescore: bool = False) -> tuple[dict, bool]:
    """A run's seed entry (scores of BM25 and every model), kept in the run folder, and whether this call
    scored anything: a later call scores only the rows the run has gained since (a resumed run's new
    exports); ``rescore`` scores them all again."""
    cached = run / SCORES_FILE
    state = json.loads((run / "run.json").read_text("utf-8"))
    entry: dict = {"models": {}, "info": {}}
    if cached.is_file() and not rescore:
        entry = json.loads(cached.read_text("utf-8"))
    # The seed is the run's, never the cache's: scores cached before run.json kept the seed carry the
    # recipe file's (0 for every --seeds run), which labelled seed-1's scores as a second seed 0.
    entry["seed"] = seed_of(state, run)
    models = models_of(run)
    if not models and not entry["models"]:
        raise SystemExit(f"{run}: no final model and no exports")

    # a model scored before hybrid rows existed still gains them: missing rows, not missing models
    missing = [name for name in ("bm25", *models) if any(r not in entry["models"] for r in rows_of(name))]
    if not missing:
        return entry, False
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from care_retriever.evaluation.hybrid import HybridModel
    from care_retriever.evaluation.runner import evaluate
    from care_retriever.evaluation.tasks import load_task
    from care_retriever.model.baselines import load_embedder

    tasks = {name: load_task(data_dir / "tasks" / name) for name in TASKS}
    speed_queries = [tasks[KUAKE_RETRIEVAL].queries[q] for q in tasks[KUAKE_RETRIEVAL].query_ids][:200]
    shared: dict = {}
    for name in missing:
        embedder = load_embedder("bm25" if name == "bm25" else str(models[name]))
        if name != "bm25":
            embedder = SharedDocumentEmbeddings(embedder, shared)
        for row in rows_of(name):
            if row in entry["models"]:
                continue
            row_tasks = list(tasks)
            if row == name:
                model = embedder
            elif row == hybrid_name(name):
                model = HybridModel(embedder)
            else:  # a load of its own: its document vectors must not be shared with the whole-answer model's
                model = load_embedder(str(models[name]))
                model.document_model.max_seq_length = SHORT_DOCUMENTS[name]
                row_tasks = [IMQA]  # kuake-qtr titles are shorter than the cut
            scores = {}
            for task_name in row_tasks:
                if task_name == STS and (model is not embedder or name == "bm25"):
                    continue  # BM25 gives no sentence embedding; a hybrid's STS is its dense model's
                result = evaluate(model, tasks[task_name], model_name=row, show_progress=True)
                scores[task_name] = {"main_score": result.main_score, "metrics": result.metrics}
                print(f"{run.name} {row} {task_name}: {result.main_score}", flush=True)
            entry["models"][row] = scores
        if name != "bm25" and name not in entry["info"]:
            entry["info"][name] = {
                "query_params": parameters(embedder.query_modules),
                "document_params": parameters(embedder.document_modules),
                "queries_per_s": query_speed(embedder, speed_queries),
            }
        tmp = cached.with_name(f".{cached.name}.tmp")  # after each model: an interrupted scoring keeps its work
        tmp.write_text(json.dumps(entry, indent=2), encoding="utf-8")
        tmp.replace(cached)
    return entry, True


def seed_of(state: dict, run: Path) -> int:
    """The seed a run trained with: its ``run.json``'s, else its ``seed-<k>`` folder's (``--seeds`` runs
    before run.json kept the seed), else its recipe file's."""
    seed = state.get("seed")
    if seed is None and run.name.startswith("seed-") and run.name[5:].isdigit():
        seed = int(run.name[5:])
    source = state.get("source")
    if seed is None and source and Path(source).is_file():
        import yaml

        seed = (yaml.safe_load(Path(source).read_text("utf-8")) or {}).get("seed")
    return int(seed or 0)


def stage_record(folder: Path, state: dict) -> dict:
    """A run's stage times as the JSON keeps them (so a ``--from-json`` re-render still shows them)."""
    walls = wall_seconds(folder, state)
    return {
        "run": str(folder),
        "init_seconds": float(state.get("init_seconds", 0.0)),
        "stages": [
            {
                "name": report["name"],
                "steps": report["steps"],
                "seconds": report["seconds"],
                "wall_seconds": walls.get(report["name"]),
                "first_loss": report.get("first_loss"),
                "last_loss": report.get("last_loss"),
            }
            for report in state.get("reports", [])
        ],
    }
