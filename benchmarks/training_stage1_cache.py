"""Stage I with the cached frozen teacher vs recomputing the teacher every step; steps/s and peak memory.

    python -m benchmarks.training_stage1_cache                     # tiny query / mini document tower (CPU, minutes)
    python -m benchmarks.training_stage1_cache --document-preset base --steps 5 --max-length 32
    python -m benchmarks.training_stage1_cache --json out.json     # also write the numbers
    python -m benchmarks.training_stage1_cache --query-preset mini --document-preset base --document-layers 9
                                                                   # the paper's compute ratio (see below)

CARE's query tower is small and its document tower large (paper: 305M vs 4B parameters), so the
asymmetry is kept here: the towers are random-weight presets of different sizes (``--query-preset``,
``--document-preset``, ``--document-layers`` to cut the document preset's depth; parameter counts are
printed). What sets the speed-up is the ratio of per-token compute, i.e. of the parameters outside
the embedding tables: gte-multilingual-base has ~85M of them (its 250k-token table is 192M more),
Qwen3-4B ~3.6B, a ratio of ~43; a ``mini`` query tower (3.2M) with the ``base`` document tower cut
to 9 layers (141M) has the same ratio. A student step costs about three forward passes of the
student (forward, backward), so the cache can speed Stage I up by at most
(3 S + T) / (3 S) for student and teacher forward costs S and T. Every configuration runs in its own process
(so peak RSS is its own) on the shipped sample's texts with the same batches:

- ``stage0-query``, ``stage0-document``, ``stage2``: the other stages, for reference;
- ``stage1 cached``: the teacher read from the memory-mapped cache (the cache build is timed apart:
  it is a one-time cost, and a resumed or repeated run reuses it);
- ``stage1 recomputed``: the frozen document tower run on every batch.

``--forward padded packed`` runs the stages that run the document tower (Stage I's cache or recomputed teacher,
Stage II's document side) once per forward pass (care_retriever.runtime.forward; default ``auto``: packed on CUDA,
padded on the CPU, where ``packed`` is the reference attention, text by text, a proof and not a faster path), in
alternation with the rest; the table names the path each ran and its cache build time.

Steps/s comes from the trainer's per-step log timestamps (step 1 to the last, so start-up is left
out). On a machine shared with other jobs, load changes from minute to minute: ``--repeats R`` runs
the configurations R times in alternation and keeps each one's best run, so both sides of the ratio
see the same conditions. The target is cached >= 3x recomputed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.core_common import verdict

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "care_retriever" / "data" / "sample"
CONFIGS = ("stage0-query", "stage0-document", "stage1-cached", "stage1-recomputed", "stage2")
# the configurations whose stage runs the document tower's forward (the recipe key ``forward``)
FORWARD_CONFIGS = ("stage1-cached", "stage1-recomputed", "stage2")


def build_model(query_preset: str, document_preset: str, out: Path, document_layers: int = 0) -> None:
    """A CARE model whose towers come from two (possibly different) presets, random weights;
    ``document_layers`` (if > 0) replaces the document preset's depth."""
    from dataclasses import replace

    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.model.scratch import build_random_towers, iter_vocab_texts
    from care_retriever.model.towers.presets import PRESETS

    if document_layers:
        base = PRESETS[document_preset]
        document_preset = f"{document_preset}-{document_layers}l"
        # Registered in this process only: the benchmark's own shape, not a preset users see.
        PRESETS[document_preset] = replace(
            base, name=document_preset, document={**base.document, "num_hidden_layers": document_layers}
        )
    texts = list(iter_vocab_texts([SAMPLE / "corpus.jsonl", SAMPLE / "queries.jsonl"]))
    with tempfile.TemporaryDirectory() as tmp:
        q_dir, _ = build_random_towers(query_preset, texts, Path(tmp) / "q")
        _, d_dir = build_random_towers(document_preset, texts, Path(tmp) / "d")
        embedder = AsymmetricEmbedder.from_towers(str(q_dir), str(d_dir), dtype="fp32")
        embedder.save_pretrained(out)


def sample_pairs(folder: Path) -> Path:
    """Title -> text pairs of the shipped sample, the training data of every configuration."""
    rows = [json.loads(line) for line in (SAMPLE / "corpus.jsonl").read_text("utf-8").splitlines()]
    path = folder / "pairs.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps({"query": row["title"], "text": row["text"]}, ensure_ascii=False) + "\n")
    return path


def worker(config: str, model: Path, folder: Path, steps: int, batch: int, max_length: int, forward: str) -> dict:
    import torch

    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.training.models import set_max_length
    from care_retriever.training.pairs import load_pairset
    from care_retriever.training.recipe import build_stage
    from care_retriever.training.recipe_spec import DatasetSpec
    from care_retriever.training.stages import STAGES, StageContext

    embedder = AsymmetricEmbedder.from_pretrained(model, dtype="fp32")
    embedder = set_max_length(embedder, max_length)
    spec = DatasetSpec(name="pairs", path=str(sample_pairs(folder)), format="pairs")
    pairset = load_pairset(spec, folder)
    kind = {"stage0-query": "stage0_query", "stage0-document": "stage0_document", "stage2": "stage2_joint"}.get(
        config, "stage1_align"
    )
    rows = steps * batch
    options: dict = {"max_examples": rows}
    if kind in ("stage0_document", "stage2_joint"):
        options["lora"] = {"r": 8, "alpha": 16}
    if kind == "stage1_align":
        options = {"alignment": {"queries": ["pairs"]}, "max_examples": rows}
        options["teacher"] = "cached" if config == "stage1-cached" else "recompute"
    if kind == "stage2_joint":
        options["hard_negatives"] = {"num": 1, "mine": False}
    if config in FORWARD_CONFIGS:
        options["forward"] = forward
    stage = build_stage(
        {
            "name": config,
            "type": kind,
            "datasets": [] if kind == "stage1_align" else ["pairs"],
            "args": {
                "max_steps": steps,
                "per_device_train_batch_size": batch,
                "logging_steps": 1,
                "save_strategy": "no",
            },
            **options,
        },
        f"benchmark {config}",
    )
    out = folder / "run"
    ctx = StageContext(
        out=out,
        data_dir=folder,
        seed=0,
        fingerprint="bench",
        defaults={},
        load_pairset=lambda _: pairset,
        show_progress=False,
    )
    report = STAGES[kind](ctx, stage, embedder)
    logs = [json.loads(line) for line in (out / "logs" / f"{config}.jsonl").read_text().splitlines()]
    times = [row["time"] for row in logs if "loss" in row]
    steps_per_s = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
    result = {
        "config": config,
        "steps": report.steps,
        "steps_per_s": steps_per_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cache_build_s": report.extra.get("teacher_cache_seconds"),
        "teacher_cache_reused": report.extra.get("teacher_cache_reused"),
        "forward": report.extra.get("teacher_forward") or report.extra.get("document_forward"),
    }
    if torch.cuda.is_available():
        result["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return result


def parameter_counts(model: Path) -> dict[str, int]:
    """All parameters of each tower, and those outside embedding tables (what per-token compute scales with)."""
    import torch

    from care_retriever.model.embedder import AsymmetricEmbedder

    embedder = AsymmetricEmbedder.from_pretrained(model)
    counts = {}
    for side, modules in (("query", embedder.query_modules), ("document", embedder.document_modules)):
        counts[f"{side}_params"] = sum(p.numel() for m in modules for p in m.parameters())
        embedding = sum(
            p.numel()
            for m in modules
            for sub in m.modules()
            if isinstance(sub, torch.nn.Embedding)
            for p in sub.parameters()
        )
        counts[f"{side}_compute_params"] = counts[f"{side}_params"] - embedding
    return counts


def run_worker(args: argparse.Namespace, config: str, model: Path, folder: Path, forward: str = "auto") -> dict:
    """One configuration in a fresh process (its own peak RSS, no state shared with the others)."""
    folder.mkdir()
    command = [sys.executable, "-m", "benchmarks.training_stage1_cache", "--worker", config, "--forward", forward]
    command += ["--model", str(model.resolve()), "--folder", str(folder.resolve())]
    command += ["--steps", str(args.steps), "--batch", str(args.batch), "--max-length", str(args.max_length)]
    command += ["--threads", str(args.threads)]
    # From the repository root, where `benchmarks` is a package whatever the caller's working directory.
    proc = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        sys.exit(f"{config} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--query-preset", default="tiny")
    parser.add_argument("--document-preset", default="mini")
    parser.add_argument("--document-layers", type=int, default=0, help="replace the document preset's depth")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--only", nargs="*", choices=CONFIGS)
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs per configuration; best kept")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per run (0: torch's default)")
    parser.add_argument(
        "--forward",
        nargs="+",
        default=["auto"],
        choices=("auto", "packed", "padded"),
        help="the document tower's forward pass in the stages that run it; several: each, in alternation",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.worker:
        import torch
        import transformers

        if args.threads:
            torch.set_num_threads(args.threads)
        transformers.utils.logging.set_verbosity_error()
        forward = args.forward[0]
        result = worker(args.worker, args.model, args.folder, args.steps, args.batch, args.max_length, forward)
        print("RESULT " + json.dumps(result))
        return
    results, summary = measure(args)
    print("\n" + markdown(results, summary))
    if args.json:
        args.json.write_text(json.dumps({"results": results, **summary}, indent=2, default=str))


def measure(args: argparse.Namespace) -> tuple[list[dict], dict]:
    """Run every configuration (alternating, best of ``args.repeats``); results and a summary."""
    with tempfile.TemporaryDirectory(prefix="care-bench-stage1-") as tmp:
        model = Path(tmp) / "model"
        build_model(args.query_preset, args.document_preset, model, args.document_layers)
        counts = parameter_counts(model)
        print(f"towers: {towers_text(vars(args), counts)}; batch {args.batch}, {args.steps} steps", flush=True)
        best: dict[str, dict] = {}
        forwards = list(getattr(args, "forward", None) or ["auto"])
        runs = [
            (config, forward)
            for config in args.only or CONFIGS
            for forward in (forwards if config in FORWARD_CONFIGS else ["auto"])
        ]
        for repeat in range(args.repeats):
            for config, forward in runs:
                label = f"{config} [{forward}]" if len(forwards) > 1 and config in FORWARD_CONFIGS else config
                result = run_worker(args, config, model, Path(tmp) / f"{config}-{forward}-{repeat}", forward)
                result["label"] = label
                print(f"  run {repeat + 1}: {label}: {result['steps_per_s']:.2f} steps/s", flush=True)
                if label not in best or result["steps_per_s"] > best[label]["steps_per_s"]:
                    best[label] = result
        results = list(best.values())
    by_config: dict[str, dict] = {}
    for r in results:  # with several forwards, the speed-up compares the first one's runs
        by_config.setdefault(r["config"], r)
    summary: dict = {**counts, "args": vars(args) | {"json": None}}
    if "stage1-cached" in by_config and "stage1-recomputed" in by_config:
        cached, recomputed = by_config["stage1-cached"], by_config["stage1-recomputed"]
        summary["speedup"] = cached["steps_per_s"] / recomputed["steps_per_s"]
        summary["cache_build_s"] = cached["cache_build_s"]
    return results, summary


def towers_text(args: dict, counts: dict) -> str:
    layers = args.get("document_layers") or 0
    document = f"`{args['document_preset']}`" + (f" cut to {layers} layers" if layers else "")
    ratio = counts["document_compute_params"] / counts["query_compute_params"]
    return (
        f"query `{args['query_preset']}` ({counts['query_params'] / 1e6:.1f}M parameters, "
        f"{counts['query_compute_params'] / 1e6:.1f}M outside embeddings), document {document} "
        f"({counts['document_params'] / 1e6:.1f}M, {counts['document_compute_params'] / 1e6:.1f}M outside "
        f"embeddings); compute ratio document/query {ratio:.0f}"
    )


def markdown(results: list[dict], summary: dict) -> str:
    """The table and the verdict, as printed and as written into docs/benchmarks.md."""
    args = summary["args"]
    cuda = "peak_cuda_mb" in results[0]
    lines = [
        f"Towers: {towers_text(args, summary)}; batch {args['batch']}, "
        f"{args['steps']} steps, max_length {args['max_length']}, best of {args['repeats']} alternating run(s).",
        "",
        f"| stage | document forward | steps/s | cache build s | peak RSS (MB) |{' peak CUDA (MB) |' if cuda else ''}",
        f"|---|---|---|---|---|{'---|' if cuda else ''}",
    ]
    for r in results:
        extra = f" {r['peak_cuda_mb']:.0f} |" if cuda else ""
        state = r.get("forward") or {}
        forward = f"{state['forward']} ({state.get('attention')})" if state else ""
        build = f"{r['cache_build_s']:.2f}" if r.get("cache_build_s") is not None else ""
        lines.append(
            f"| {r.get('label', r['config'])} | {forward} | {r['steps_per_s']:.2f} | {build} | "
            f"{r['peak_rss_mb']:.0f} |{extra}"
        )
    if "speedup" in summary:
        speedup = summary["speedup"]
        lines += [
            "",
            f"Stage I, cached teacher: **{speedup:.1f}x** the steps/s of recomputing it "
            f"(target >= 3x: **{verdict(speedup >= 3)}**); one-time cache build "
            f"{summary['cache_build_s']:.1f} s for {args['steps'] * args['batch']} texts.",
        ]
    return "\n".join(lines)


def run(preset: str = "base") -> tuple[str, bool]:
    """Section of docs/benchmarks.md (``core_all.py``): Stage I cached vs recomputed at three compute ratios.

    The paper pairs a ~85M-compute-parameter query tower with a 4B or 8B LLM (compute ratio ~43 and
    ~85). ``mini`` / ``base`` cut to 9 layers has the 4B pairing's ratio and gives the verdict; the
    ``base`` / ``base`` pair (ratio ~5, the least favourable) and ``mini`` / full ``base`` (beyond
    the 8B pairing) bracket it.
    """
    pairings = [
        ("paper ratio (gte-multilingual-base : Qwen3-4B)", "mini", preset, 9),
        ("least favourable (same preset both sides)", preset, preset, 0),
        ("beyond the paper's 8B pairing (ratio ~85)", "mini", preset, 0),
    ]
    sections, speedups = [], []
    for title, query_preset, document_preset, layers in pairings:
        args = argparse.Namespace(
            query_preset=query_preset,
            document_preset=document_preset,
            document_layers=layers,
            steps=6,
            batch=16,
            max_length=32,
            only=["stage1-cached", "stage1-recomputed"],
            repeats=2,
            threads=0,
        )
        results, summary = measure(args)
        sections.append(f"**{title}.** " + markdown(results, summary))
        speedups.append(summary.get("speedup", 0.0))
    passed = speedups[0] >= 3
    text = (
        f"### (g) Stage I teacher cache ({preset} document tower)\n\n"
        + "\n\n".join(sections)
        + f"\n\nVerdict at the paper's compute ratio: **{verdict(passed)}** ({speedups[0]:.1f}x). The cache "
        "removes the teacher's forward pass, so a step can be at most (3 S + T) / (3 S) times faster for "
        "student and teacher forward costs S and T: with towers of the same size the bound is small, "
        "and the larger the document tower, the larger the gain.\n"
    )
    return text, passed


if __name__ == "__main__":
    main()
