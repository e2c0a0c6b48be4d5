"""What the CPU suite cannot run, checked on a CUDA GPU in under a minute: the packed forward through torch's
``varlen_attn`` (or ``flash_attn``) gives the padded pass's vectors; the RMSNorm layers through torch's fused kernel
give the model's own vectors, and how much faster one norm runs; Stage II's document side packed gives the padded
loss and gradients (the varlen kernel's backward), with and without LoRA; the packed and padded towers compile
without graph breaks and a bounded number of graphs.

    python -m benchmarks.cuda_checks   # one PASS / FAIL line per check (--json: all figures); exit 1 if one fails

The tower is a random two-layer decoder of Qwen3-4B's attention shape (32 query heads of 128 over 8 key/value
heads: the grouped-query case) and a narrow MLP, built with no hub; the texts mix one-token, short and long ones.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_index_tower import QWEN3_4B, sync

CHECK_TOWER = {**QWEN3_4B, "num_hidden_layers": 2, "intermediate_size": 1024}
TEXTS = [
    "痛",
    "高血压",
    "孩子发烧三十九度，精神还可以，需要马上去医院吗？",
    "糖尿病患者的饮食应该注意什么，主食可以吃多少，水果能不能吃？" * 3,
    "感冒",
    "长期失眠、多梦、早醒，白天乏力，记忆力下降，应该做哪些检查，中药和西药哪个更合适？" * 6,
    "胃痛",
    "宝宝拉肚子三天了，一天五六次，稀水样，没有发烧，吃奶还可以。",
]
QUERIES = ["高血压吃什么", "感冒怎么办", "失眠", "宝宝发烧"]


def cosines(a: Any, b: Any) -> Any:
    import numpy as np

    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def check_vectors(embedder: Any) -> dict[str, Any]:
    """Packed vs padded document vectors, bf16, the same tower."""
    from care_retriever.model.encoding import encode_texts
    from care_retriever.runtime.forward import document_forward

    model = embedder.document_model.to(torch.bfloat16)
    out = {}
    for forward in ("padded", "packed"):
        with document_forward(model, forward, "off") as state:
            out[forward] = encode_texts(model, TEXTS * 4, batch_size=16)
            out[f"{forward}_state"] = state.to_dict()
    found = cosines(out["padded"], out["packed"])
    return {
        "cosine_min": round(float(found.min()), 6),
        "attention": out["packed_state"]["attention"],
        "passed": bool(found.min() >= 0.999) and out["packed_state"]["forward"] == "packed",
    }


def check_norms(embedder: Any, device: str) -> dict[str, Any]:
    """The RMSNorm layers through torch's fused kernel give the model's own vectors (bf16, the same tower), and
    one norm of the 4B tower's width over a pass of tokens, timed: the model's own code against the fused call."""
    from care_retriever.model.encoding import encode_texts
    from care_retriever.runtime.forward import document_forward
    from care_retriever.runtime.fused_norms import fusable_norms

    model = embedder.document_model.to(torch.bfloat16)
    out = {}
    for norms in ("eager", "fused"):
        with document_forward(model, "padded", "off", norms=norms) as state:
            out[norms] = encode_texts(model, TEXTS * 4, batch_size=16)
            out[f"{norms}_state"] = state.norms
    found = cosines(out["eager"], out["fused"])
    width = model[0].auto_model.config.hidden_size
    norm = next(n for n in fusable_norms(model) if n.weight.shape[-1] == width)
    x = torch.randn(16384 if device.startswith("cuda") else 1024, width, dtype=torch.bfloat16, device=device)
    timings = {}
    with torch.inference_mode():
        for name, call in {
            "own": lambda: type(norm).forward(norm, x),
            "fused": lambda: torch.nn.functional.rms_norm(x, (width,), norm.weight, norm.variance_epsilon),
        }.items():
            call()
            sync(device)
            start = time.perf_counter()
            for _ in range(20):
                call()
            sync(device)
            timings[name] = (time.perf_counter() - start) / 20
    return {
        "cosine_min": round(float(found.min()), 6),
        "tokens": x.shape[0],
        "own_ms": round(timings["own"] * 1e3, 4),
        "fused_ms": round(timings["fused"] * 1e3, 4),
        "speedup": round(timings["own"] / timings["fused"], 2),
        "passed": bool(found.min() >= 0.999) and out["fused_state"] == "fused" and out["eager_state"] == "eager",
    }


def stage2_loss_and_grads(embedder: Any, forward: str, device: str) -> tuple[float, torch.Tensor, dict[str, Any]]:
    """One Stage II loss (queries on the query tower, positives and negatives on the document tower) under bf16
    autocast over fp32 weights, as training runs it, and the document tower's gradients."""
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from care_retriever.training.tower_forward import stage_document_forward

    model = embedder.to_sentence_transformer()
    model.train()
    loss = MultipleNegativesRankingLoss(model, scale=20.0)
    with stage_document_forward(embedder, forward, "check", compute_dtype=torch.bfloat16) as state:
        features = [
            model.preprocess(QUERIES, task="query"),
            model.preprocess(TEXTS[:4], task="document"),
            model.preprocess(TEXTS[4:], task="document"),
        ]
        features = [{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in f.items()} for f in features]
        torch.manual_seed(0)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            value = loss(features, labels=None)
        value.backward()
    params = [p for p in embedder.document_model.parameters() if p.requires_grad and p.grad is not None]
    grads = torch.cat([p.grad.detach().double().flatten() for p in params])
    embedder.document_model.zero_grad(set_to_none=True)
    embedder.query_model.zero_grad(set_to_none=True)
    return float(value.item()), grads, state


def check_training(embedder: Any, lora: bool, device: str) -> dict[str, Any]:
    from care_retriever.training.lora import LoraSpec
    from care_retriever.training.stage_common import lora_on

    embedder.document_model.float()
    embedder.query_model.float()
    if lora:
        lora_on(embedder, LoraSpec(r=4, alpha=8, dropout=0.0), seed=0)
    padded_loss, padded, _ = stage2_loss_and_grads(embedder, "padded", device)
    packed_loss, packed, state = stage2_loss_and_grads(embedder, "packed", device)
    cosine = float(torch.nn.functional.cosine_similarity(padded, packed, dim=0))
    relative = abs(packed_loss - padded_loss) / abs(padded_loss)
    return {
        "loss_padded": round(padded_loss, 5),
        "loss_packed": round(packed_loss, 5),
        "loss_relative_difference": round(relative, 6),
        "gradient_cosine": round(cosine, 6),
        "attention": state.get("attention"),
        # bf16 passes: the two layouts sum in different orders
        "passed": state.get("forward") == "packed" and relative <= 2e-2 and cosine >= 0.99,
    }


def check_compile(embedder: Any, forward: str) -> dict[str, Any]:
    """Compile the layers (the index path's way), then run passes of many shapes: no graph breaks, and nothing
    compiled after the warm-up."""
    import torch._dynamo.utils as dynamo_utils

    from care_retriever.model.encoding import encode_texts
    from care_retriever.runtime.forward import prepare_document_forward

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    model = embedder.document_model.to(torch.bfloat16)
    state = prepare_document_forward(model, forward, "on")
    after_warm_up = dict(dynamo_utils.counters["stats"])
    for size in (1, 3, 5, 8, 13, 21, 32):
        encode_texts(model, TEXTS * 4, batch_size=size)
    stats = dict(dynamo_utils.counters["stats"])
    counted = dynamo_utils.counters["graph_break"]
    # off CUDA the packed attention is the per-text reference, kept out of compiled code on purpose (a proof, not
    # a fast path): its break is expected there, and the CUDA kernels never call it
    reference = sum(n for reason, n in counted.items() if "_varlen_reference" in reason)
    breaks = sum(counted.values()) - reference
    later = stats.get("unique_graphs", 0) - after_warm_up.get("unique_graphs", 0)
    return {
        "compile": state.compile,
        "compile_seconds": round(state.compile_seconds, 1),
        "graphs_at_warm_up": after_warm_up.get("unique_graphs", 0),
        "graphs_after": later,
        "graph_breaks": breaks,
        "reference_attention_breaks": reference,
        "graph_break_reasons": sorted(r for r in counted if "_varlen_reference" not in r)[:5],
        "passed": state.compile == "on" and later == 0 and breaks == 0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=Path, action="append", help="texts the tokenizer trains on")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--device", default="cuda", help="cuda; cpu runs the same checks on the reference attention")
    args = parser.parse_args(argv)
    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("cuda_checks: no CUDA device; nothing checked", file=sys.stderr)
        return 0
    from care_retriever.model.scratch import init_from_scratch
    from care_retriever.model.towers.loading import quiet_transformers

    quiet_transformers()
    vocab = args.vocab or [Path(__file__).resolve().parents[1] / "README.md"]

    def fresh() -> Any:
        return init_from_scratch("tiny", vocab, device=device, document_config=CHECK_TOWER)

    checks: dict[str, Callable[[], dict[str, Any]]] = {
        "packed = padded vectors (bf16)": lambda: check_vectors(fresh()),
        "fused norms = own norms (bf16), timed": lambda: check_norms(fresh(), device),
        "stage II packed = padded, loss and gradients": lambda: check_training(fresh(), lora=False, device=device),
        "stage II packed = padded, with LoRA": lambda: check_training(fresh(), lora=True, device=device),
        "packed compiles once, no graph breaks": lambda: check_compile(fresh(), "packed"),
        "padded compiles once, no graph breaks": lambda: check_compile(fresh(), "padded"),
    }
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    results: dict[str, Any] = {"device": name, "torch": torch.__version__}
    failed = 0
    for name, check in checks.items():
        try:
            found = check()
        except Exception as exc:  # a check that raises is a failed check, reported with its first line
            found = {"passed": False, "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"}
        failed += not found["passed"]
        results[name] = found
        print(f"[cuda_checks] {'PASS' if found['passed'] else 'FAIL'} {name}: {json.dumps(found)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, ensure_ascii=False), encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
