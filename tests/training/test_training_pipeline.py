"""A real two-stage CARE training on tiny towers: Stage 0, Stage I (cached teacher), Stage II.

The data are synthetic Chinese medical questions and answers about a dozen conditions, small enough
that every stage runs a few optimizer steps in about a second; the assertions are about what the
method must do, not about exact numbers: the losses fall, Stage I brings the query tower towards the
document tower, the teacher cache is reused, and an interrupted stage resumes from its checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.support.data import condition_pairs, write_jsonl

RECIPE = """
name: tiny-two-stage
seed: 0
model: {{preset: tiny, vocab_from: [pairs.jsonl], max_length: 32, query_pooling: mean}}
datasets:
  pairs: {{path: pairs.jsonl, format: pairs}}
defaults:
  per_device_train_batch_size: 16
  learning_rate: 2.0e-3
  num_train_epochs: {epochs}
  logging_steps: 1
  save_steps: 3
  save_total_limit: 3
stages:
  - {{name: stage0-query, type: stage0_query, datasets: [pairs]}}
  - {{name: stage0-document, type: stage0_document, datasets: [pairs], lora: {{r: 4, alpha: 8}}}}
  - {{name: stage1, type: stage1_align, alignment: {{queries: [pairs], documents: [pairs]}}}}
  - name: stage2
    type: stage2_joint
    datasets: [pairs]
    hard_negatives: {{num: 1, range_min: 0}}
    lora: {{r: 4, alpha: 8}}
"""


def write_pairs(path: Path) -> None:
    write_jsonl(path, condition_pairs())


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("train-data")
    write_pairs(folder / "pairs.jsonl")
    return folder


def recipe_file(folder: Path, epochs: int = 3) -> Path:
    path = folder / "recipe.yaml"
    path.write_text(RECIPE.format(epochs=epochs), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(data_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    from care_retriever.training.recipe import load_recipe
    from care_retriever.training.runner import run_recipe

    out = tmp_path_factory.mktemp("run") / "out"
    result = run_recipe(load_recipe(recipe_file(data_dir)), out, data_dir, show_progress=False, keep_stages=True)
    return result


def agreement(model_dir: Path, texts: list[str]) -> float:
    """Mean cosine between the query tower's and the document tower's embedding of the same text."""
    from care_retriever.model.embedder import AsymmetricEmbedder

    embedder = AsymmetricEmbedder.from_pretrained(model_dir)
    q = embedder.embed_queries(texts)
    d = embedder.embed_documents(texts)
    return float(np.mean(np.sum(q * d, axis=1)))


def texts_of(data_dir: Path) -> list[str]:
    rows = [json.loads(line) for line in (data_dir / "pairs.jsonl").read_text("utf-8").splitlines()]
    return [r["query"] for r in rows] + [r["text"] for r in rows]


def test_every_stage_trains_and_its_loss_falls(trained) -> None:
    reports = {r["name"]: r for r in trained.reports}
    assert list(reports) == ["stage0-query", "stage0-document", "stage1", "stage2"]
    # 48 pairs / 16 per batch * 3 epochs; Stage I aligns 48 queries and 48 documents (two sides)
    expected_steps = {"stage0-query": 9, "stage0-document": 9, "stage1": 18, "stage2": 9}
    for name, report in reports.items():
        assert report["steps"] == expected_steps[name], name
        logs = [json.loads(line) for line in (trained.out / "logs" / f"{name}.jsonl").read_text().splitlines()]
        losses = [row["loss"] for row in logs if "loss" in row]
        assert len(losses) == expected_steps[name]
        # mean of the last three logged losses below the mean of the first three
        assert np.mean(losses[-3:]) < np.mean(losses[:3]), (name, losses)
        assert all("learning_rate" in row for row in logs if "loss" in row)


def test_stage1_raises_query_document_agreement(trained, data_dir: Path) -> None:
    texts = texts_of(data_dir)
    before = agreement(trained.out / "stages" / "stage0-document", texts)
    after = agreement(trained.out / "stages" / "stage1", texts)
    assert after > before + 0.1, (before, after)


def test_final_model_is_the_last_stage_and_loads(trained, data_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    from care_retriever.model.embedder import AsymmetricEmbedder

    final = AsymmetricEmbedder.from_pretrained(trained.final)
    last = AsymmetricEmbedder.from_pretrained(trained.out / "stages" / "stage2")
    texts = texts_of(data_dir)[:8]
    np.testing.assert_allclose(final.embed_documents(texts), last.embed_documents(texts), atol=1e-6)
    # LoRA was merged: the saved folder is a plain sentence-transformers model without peft files
    assert not list(Path(trained.final).rglob("adapter_config.json"))
    st = SentenceTransformer(str(trained.final))
    np.testing.assert_allclose(st.encode_query(texts[:2]), final.embed_queries(texts[:2]), atol=1e-5)
    # Stage II changed the document tower (LoRA merged into it), Stage I did not
    stage0 = AsymmetricEmbedder.from_pretrained(trained.out / "stages" / "stage0-document")
    stage1 = AsymmetricEmbedder.from_pretrained(trained.out / "stages" / "stage1")
    assert stage0.space_fingerprint == stage1.space_fingerprint
    assert stage1.space_fingerprint != final.space_fingerprint
    # ... through the transformer only: the Matryoshka truncation is still an identity slice
    from sentence_transformers.sentence_transformer.modules import Dense

    (dense,) = [m for m in final.document_modules if isinstance(m, Dense)]
    weight = dense.linear.weight.detach()
    np.testing.assert_array_equal(weight.numpy(), np.eye(weight.shape[1], dtype=np.float32)[: weight.shape[0]])


def test_stage1_reads_a_memory_mapped_teacher_cache_that_is_reused(trained, data_dir: Path) -> None:
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.training.teacher_cache import build_teacher_cache

    report = next(r for r in trained.reports if r["name"] == "stage1")
    assert report["teacher"] == "cached" and report["teacher_cache_reused"] is False
    cache_file = Path(report["teacher_cache"])
    mtime = cache_file.stat().st_mtime_ns
    # Stage I's teacher texts, in the stage's order: queries, then documents, de-duplicated
    rows = [json.loads(line) for line in (data_dir / "pairs.jsonl").read_text("utf-8").splitlines()]
    teacher_texts = list(dict.fromkeys([r["query"] for r in rows] + [r["text"] for r in rows]))
    assert report["teacher_texts"] == len(teacher_texts)
    # Stage I leaves the document tower (the teacher) untouched, so its output model has the same teacher
    embedder = AsymmetricEmbedder.from_pretrained(trained.out / "stages" / "stage1")
    cache = build_teacher_cache(embedder, teacher_texts, cache_file.parent, show_progress=False)
    assert cache.reused and cache.path == cache_file
    assert cache_file.stat().st_mtime_ns == mtime
    assert isinstance(cache.vectors, np.memmap)
    # the cached rows are the document tower's embeddings of those texts
    np.testing.assert_allclose(cache.vectors[:5], embedder.embed_documents(teacher_texts[:5]), atol=1e-5)
    # another text set gets its own cache instead of a stale one
    other = build_teacher_cache(embedder, teacher_texts[:7], cache_file.parent, show_progress=False)
    assert not other.reused and other.path != cache_file and len(other) == 7


def test_resume_continues_an_interrupted_stage_from_its_checkpoint(trained, data_dir: Path, tmp_path: Path) -> None:
    from care_retriever.training.recipe import load_recipe
    from care_retriever.training.runner import run_recipe

    out = tmp_path / "out"
    shutil.copytree(trained.out, out)
    # Simulate a run killed in Stage II after its checkpoint at step 6.
    state = json.loads((out / "run.json").read_text())
    state["done"].remove("stage2")
    state["reports"] = [r for r in state["reports"] if r["name"] != "stage2"]
    (out / "run.json").write_text(json.dumps(state))
    shutil.rmtree(out / "stages" / "stage2")
    shutil.rmtree(out / "final")
    shutil.rmtree(out / "checkpoints" / "stage2" / "checkpoint-9")
    log = out / "logs" / "stage2.jsonl"
    log.write_text("".join(line + "\n" for line in log.read_text().splitlines() if json.loads(line)["step"] <= 6))
    stage1_log = (out / "logs" / "stage1.jsonl").read_text()

    result = run_recipe(
        load_recipe(recipe_file(data_dir)), out, data_dir, resume=True, show_progress=False, keep_stages=True
    )

    assert (out / "logs" / "stage1.jsonl").read_text() == stage1_log  # finished stages are not re-run
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert steps[:6] == [1, 2, 3, 4, 5, 6] and steps[6:9] == [7, 8, 9]  # continued, not restarted
    report = next(r for r in result.reports if r["name"] == "stage2")
    assert report["steps"] == 9
    assert (out / "final" / "care_config.json").is_file()


def test_score_distillation_baseline_from_a_saved_model(trained, data_dir: Path, tmp_path: Path) -> None:
    """Table 7's baseline: the query tower distils the document tower's scores; exported symmetric."""
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.training.recipe import parse_recipe
    from care_retriever.training.runner import run_recipe

    raw = {
        "name": "distill",
        "model": {"path": str(trained.out / "stages" / "stage0-document")},
        "datasets": {"pairs": {"path": "pairs.jsonl"}},
        "defaults": {"per_device_train_batch_size": 16, "learning_rate": 2e-3, "logging_steps": 1},
        "stages": [
            {
                "name": "distill",
                "type": "distill",
                "datasets": ["pairs"],
                "hard_negatives": {"num": 2, "range_min": 0},
                "export": {"score-distillation": "query-symmetric"},
            }
        ],
    }
    result = run_recipe(parse_recipe(raw), tmp_path / "out", data_dir, show_progress=False, keep_stages=True)
    report = result.reports[0]
    assert report["steps"] == 3 and report["hard_negatives"] == 2
    exported = AsymmetricEmbedder.from_pretrained(result.exports["score-distillation"])
    assert exported.mode == "symmetric"
    teacher = AsymmetricEmbedder.from_pretrained(trained.out / "stages" / "stage0-document")
    assert exported.space_fingerprint != teacher.space_fingerprint  # the query tower is the document side now


def test_language_model_pretraining_trains_each_tower_in_place(data_dir: Path, tmp_path: Path) -> None:
    """``mlm`` pretrains the BERT query tower, ``clm`` the decoder document tower (next-token loss);
    the LM heads are discarded: each saved tower keeps its architecture, with new weights."""
    import torch

    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.training.recipe import parse_recipe
    from care_retriever.training.runner import run_recipe

    raw = {
        "name": "lm-pretraining",
        "model": {"preset": "tiny", "vocab_from": ["pairs.jsonl"], "max_length": 32},
        "datasets": {"pairs": {"path": "pairs.jsonl"}},
        "defaults": {
            "per_device_train_batch_size": 16,
            "learning_rate": 5e-3,
            "num_train_epochs": 4,
            "logging_steps": 1,
        },
        "stages": [
            {"name": "mlm", "type": "mlm", "datasets": ["pairs"]},
            {"name": "clm", "type": "clm", "datasets": ["pairs"]},
        ],
    }
    result = run_recipe(parse_recipe(raw), tmp_path / "out", data_dir, show_progress=False, keep_stages=True)
    reports = {r["name"]: r for r in result.reports}
    for name in ("mlm", "clm"):
        logs = [json.loads(line) for line in (result.out / "logs" / f"{name}.jsonl").read_text().splitlines()]
        losses = [row["loss"] for row in logs if "loss" in row]
        assert reports[name]["examples"] == 96  # 48 unique queries + 48 unique answers
        assert np.mean(losses[-3:]) < np.mean(losses[:3]), (name, losses)
    init = AsymmetricEmbedder.from_pretrained(result.out / "stages" / "init")
    after_mlm = AsymmetricEmbedder.from_pretrained(result.out / "stages" / "mlm")
    final = AsymmetricEmbedder.from_pretrained(result.final)

    def weights(embedder: AsymmetricEmbedder, side: str) -> dict[str, torch.Tensor]:
        modules = embedder.query_modules if side == "query" else embedder.document_modules
        return {k: v.clone() for k, v in modules[0].auto_model.state_dict().items()}

    def changed(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
        assert a.keys() == b.keys()  # no LM head left behind in the tower
        return any(not torch.equal(a[k], b[k]) for k in a)

    assert changed(weights(init, "query"), weights(after_mlm, "query"))
    assert not changed(weights(init, "document"), weights(after_mlm, "document"))
    assert changed(weights(after_mlm, "document"), weights(final, "document"))
    assert not changed(weights(after_mlm, "query"), weights(final, "query"))
    assert type(final.document_modules[0].auto_model).__name__ == "Qwen3Model"


def test_clm_refuses_an_encoder_document_tower(trained, data_dir: Path, tmp_path: Path) -> None:
    from care_retriever.errors import InputError
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.training.models import export_model
    from care_retriever.training.recipe import parse_recipe
    from care_retriever.training.runner import run_recipe

    symmetric = tmp_path / "symmetric"
    export_model(AsymmetricEmbedder.from_pretrained(trained.final), "query-symmetric", symmetric)
    raw = {
        "name": "clm-on-bert",
        "model": {"path": str(symmetric)},
        "datasets": {"pairs": {"path": "pairs.jsonl"}},
        "stages": [{"name": "clm", "type": "clm", "datasets": ["pairs"]}],
    }
    with pytest.raises(InputError, match="causal-LM pretraining needs a decoder document tower, got BertModel"):
        run_recipe(parse_recipe(raw), tmp_path / "out", data_dir, show_progress=False, keep_stages=True)


def test_stage1_aligns_unlabelled_texts_on_the_side_it_lists_them_with_a_cap_per_side(
    data_dir: Path, tmp_path: Path
) -> None:
    """A ``text`` set (the pretraining corpus) is alignment data: listed under ``queries`` its texts are
    query-side texts only; ``max_query_texts`` / ``max_document_texts`` cap each side on its own."""
    from care_retriever.training.recipe import parse_recipe
    from care_retriever.training.runner import preload_datasets
    from care_retriever.training.stages import StageContext, alignment_texts

    unlabelled = [f"第{i}篇医学文本：患者出现症状{i}，建议就医。" for i in range(40)]
    (tmp_path / "corpus.txt").write_text("\n".join(unlabelled) + "\n", encoding="utf-8")
    shutil.copy(data_dir / "pairs.jsonl", tmp_path / "pairs.jsonl")

    def sides(**caps: int) -> tuple[list[str], list[str]]:
        stage = {"name": "stage1", "type": "stage1_align", "alignment": {"queries": ["pairs", "corpus"]}}
        stage["alignment"]["documents"] = ["pairs"]
        raw = {
            "name": "align-unlabelled",
            "model": {"preset": "tiny"},
            "datasets": {"pairs": {"path": "pairs.jsonl"}, "corpus": {"path": "corpus.txt", "format": "text"}},
            "stages": [{**stage, **caps}],
        }
        recipe = parse_recipe(raw)
        ctx = StageContext(tmp_path, tmp_path, 0, "x", {}, preload_datasets(recipe, tmp_path))
        return alignment_texts(ctx, recipe.stages[0])

    rows = [json.loads(line) for line in (data_dir / "pairs.jsonl").read_text("utf-8").splitlines()]
    labelled_queries = {r["query"] for r in rows}
    answers = {r["text"] for r in rows}
    queries, documents = sides()
    assert set(queries) == labelled_queries | set(unlabelled)
    assert set(documents) == answers  # not listed under documents: no unlabelled text there
    queries, documents = sides(max_query_texts=10)
    assert len(queries) == 10 and set(queries) <= labelled_queries | set(unlabelled)
    assert set(documents) == answers
    queries, documents = sides(max_document_texts=5, max_examples=1000)
    assert len(documents) == 5 and set(queries) == labelled_queries | set(unlabelled)


def test_length_buckets_train_each_batch_from_one_bucket(data_dir: Path, tmp_path: Path) -> None:
    """``length_buckets`` (recipe defaults) reach Stage 0 and Stage I: the run reports its buckets (the
    condition answers are longer than 20 characters, the questions shorter) and every stage trains."""
    from care_retriever.training.recipe import parse_recipe
    from care_retriever.training.runner import run_recipe

    raw = {
        "name": "buckets",
        "model": {"preset": "tiny", "vocab_from": ["pairs.jsonl"], "max_length": 32, "query_pooling": "mean"},
        "datasets": {"pairs": {"path": "pairs.jsonl"}},
        "defaults": {"per_device_train_batch_size": 8, "learning_rate": 2e-3, "length_buckets": [20]},
        "stages": [
            {"name": "stage0-query", "type": "stage0_query", "datasets": ["pairs"]},
            {"name": "stage1", "type": "stage1_align", "alignment": {"queries": ["pairs"], "documents": ["pairs"]}},
        ],
    }
    result = run_recipe(parse_recipe(raw), tmp_path / "out", data_dir, show_progress=False, keep_stages=True)
    reports = {r["name"]: r for r in result.reports}
    rows = [json.loads(line) for line in (data_dir / "pairs.jsonl").read_text("utf-8").splitlines()]
    short_queries = len({r["query"] for r in rows if len(r["query"]) < 20})
    long_answers = len({r["text"] for r in rows if len(r["text"]) >= 20})
    assert reports["stage1"]["length_buckets"]["queries@0-19"] == short_queries
    assert reports["stage1"]["length_buckets"]["documents@20+"] == long_answers
    assert sum(reports["stage0-query"]["length_buckets"].values()) == reports["stage0-query"]["examples"]
    assert all(reports[name]["steps"] > 0 for name in ("stage0-query", "stage1"))
