"""Where a side's time goes: ``benchmarks.gpu_index --profile N`` runs each side once more, after its timed run, over
an even spread of N of the corpus's texts under ``torch.profiler``, and sorts the kernels' time (the operators' own
time on the CPU) by kind: matmuls, attention, reductions and norms, casts and copies, other elementwise work, other.

What the figures answer (the MFU target's "what the profile shows next"):

* **busy**: the kernels' time over the side's unprofiled time for the same tokens (its timed run's seconds scaled by
  the sample's share of the corpus's tokens: the profiler's own overhead on the host is not counted as idle). What
  is missing to 100% is the device waiting on the host: launches, tokenising, the writer's work.
* **matmul TFLOP/s**: the Linear layers' FLOPs on the tokens the passes computed (padding included) over the
  matmul kernels' time, and that as a share of the run's measured dense matmul: whether the GEMMs themselves run
  at the card's rate.
* **MFU if only matmuls and attention ran**: the forward FLOPs on the texts' own tokens over the matmul and
  attention kernels' time alone: the ceiling that removing every memory-bound kernel and every idle gap would
  reach (compiling fuses the elementwise kernels; packing removes padding; neither speeds a GEMM up).

Kernel kinds are read from the kernels' names (cuBLAS / CUTLASS / nvjet GEMMs, flash / fmha / varlen attention,
reduce kernels, copy kernels, Triton's fused kernels by what they fuse), so they say what the device ran, not which
module of the model asked for it: eager RMSNorm, for instance, is a cast, a power, a mean, an rsqrt and two
multiplications, and lands in three kinds. On the CPU the kinds are operators' own time, and a compiled graph's C++
kernels are no operator: their time is the compiled region's, under "other".
"""

from __future__ import annotations

import gzip
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.gpu_index_tower import sync

KINDS = ("matmul", "attention", "reductions and norms", "casts and copies", "elementwise", "other")

# checked in this order, on the lower-cased kernel (CUDA) or operator (CPU) name; the first that matches decides
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("attention", re.compile(r"flash|fmha|attention|varlen|softmax|attn")),
    (
        "matmul",
        re.compile(r"gemm|cutlass|xmma|nvjet|cublas|scaled_mm|^aten::(addmm|mm|bmm|baddbmm|_scaled_mm)$|^sm\d+_"),
    ),
    (
        "reductions and norms",
        re.compile(r"^triton_\w*(rsqrt|mean|norm)|rsqrt|norm|meanops|reduce|^aten::(mean|pow|sum)$"),
    ),
    ("elementwise", re.compile(r"^triton_")),  # Triton's fused kernels that are not a norm: RoPE, SiLU-mul, adds
    (
        "casts and copies",
        re.compile(r"copy|memcpy|memset|fill|gather|scatter|index|catarray|^aten::(cat|clone|contiguous|to|_to_copy)$"),
    ),
    ("elementwise", re.compile(r"elementwise|^aten::(mul|add|sub|div|neg|silu|sigmoid|sin|cos|exp|where)_?$")),
)


def kernel_kind(name: str) -> str:
    """The kind of a kernel or operator, from its name (one of :data:`KINDS`)."""
    lowered = name.lower()
    for kind, pattern in _RULES:
        if pattern.search(lowered):
            return kind
    return "other"


def _events(prof: Any, on_cuda: bool) -> list[tuple[str, int, float]]:
    """(name, calls, own seconds) of each kernel (CUDA) or operator (CPU) the profile recorded."""
    from torch.autograd import DeviceType

    rows = []
    for event in prof.key_averages():
        if on_cuda:
            if event.device_type != DeviceType.CUDA:
                continue
            own = getattr(event, "self_device_time_total", None)
            if own is None:  # torch before 2.4 named it for CUDA
                own = event.self_cuda_time_total
        else:
            own = event.self_cpu_time_total
        if own > 0:
            rows.append((event.key, int(event.count), own / 1e6))
    return rows


def profile_run(run: Callable[[], Any], device: str, trace: Path | None = None) -> tuple[Any, dict[str, Any]]:
    """Run ``run()`` once under ``torch.profiler`` and sort its kernels' time by kind; returns what ``run`` returned
    and the breakdown (``wall_seconds`` is the profiled run's, overhead included). ``trace``: also write the
    Chrome trace there, gzipped."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    on_cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if on_cuda else [ProfilerActivity.CPU]
    with profile(activities=activities, record_shapes=False, with_stack=False) as prof:
        sync(device)
        start = time.perf_counter()
        with torch.inference_mode():
            result = run()
        sync(device)
        wall = time.perf_counter() - start
    events = _events(prof, on_cuda)
    kinds = dict.fromkeys(KINDS, 0.0)
    for name, _calls, seconds in events:
        kinds[kernel_kind(name)] += seconds
    top = sorted(events, key=lambda e: -e[2])[:12]
    if trace is not None:
        raw = trace.with_suffix("")
        prof.export_chrome_trace(str(raw))
        with raw.open("rb") as source, gzip.open(trace, "wb") as target:
            shutil.copyfileobj(source, target)
        raw.unlink()
    breakdown = {
        "wall_seconds": wall,
        "kernel_seconds": sum(kinds.values()),
        "kinds": kinds,
        "top": [{"name": name[:120], "calls": calls, "seconds": seconds} for name, calls, seconds in top],
    }
    return result, breakdown


def summarize(
    breakdown: dict[str, Any], *, texts: int, seconds: float, linear_flops: float, forward_flops: float, peak: float
) -> dict[str, Any]:
    """The figures of a side's profile of ``texts`` texts: ``seconds``: the unprofiled time of the same tokens;
    ``linear_flops``: the
    Linear layers' FLOPs on the tokens the passes computed; ``forward_flops``: the forward FLOPs on the texts' own
    tokens (the MFU's numerator); ``peak``: the run's dense matmul FLOP/s."""
    kinds = breakdown["kinds"]
    kernel = breakdown["kernel_seconds"]
    matmul, attention = kinds["matmul"], kinds["attention"]
    return {
        "texts": texts,
        "busy": round(min(kernel / seconds, 1.0), 4) if seconds > 0 else None,
        "shares": {kind: round(value / kernel, 4) if kernel else 0.0 for kind, value in kinds.items()},
        "matmul_tflops": round(linear_flops / matmul / 1e12, 4) if matmul else None,
        "matmul_of_peak": round(linear_flops / matmul / peak, 4) if matmul else None,
        "mfu_ceiling": round(forward_flops / (matmul + attention) / peak, 4) if matmul + attention else None,
        "profiled_wall_seconds": round(breakdown["wall_seconds"], 3),
        "top": breakdown["top"][:6],
    }


def markdown_rows(rows: list[dict[str, Any]]) -> list[str]:
    """The profile table of a run (its sides that were profiled), or nothing."""
    profiled = [
        (row, label, side)
        for row in rows
        for label, side in row["sides"].items()
        if side.get("profile") or side.get("profile_error")
    ]
    if not profiled:
        return []
    lines = [
        "",
        "Where the time goes (`--profile`: each side once more under `torch.profiler`, an even spread of the texts; "
        "shares of the kernels' time by kind; busy: kernel time over the side's unprofiled time for those tokens):",
        "",
        "| corpus | side | texts | busy | " + " | ".join(KINDS) + " | matmul TFLOP/s (of peak) | MFU if only matmul "
        "and attention ran | top kernel |",
        "|---|---|---|---|" + "---|" * len(KINDS) + "---|---|---|",
    ]
    for row, label, side in profiled:
        if "profile" not in side:
            lines.append(f"| {row['corpus']} | `{label}` | profile failed: {side['profile_error']} |" + " |" * 10)
            continue
        p = side["profile"]
        busy = f"{p['busy']:.0%}" if p["busy"] is not None else ""
        shares = " | ".join(f"{p['shares'][kind]:.1%}" for kind in KINDS)
        matmul = f"{p['matmul_tflops']:.4g} ({p['matmul_of_peak']:.0%})" if p["matmul_tflops"] else ""
        ceiling = f"{p['mfu_ceiling']:.0%}" if p["mfu_ceiling"] else ""
        top = p["top"][0] if p["top"] else None
        first = f"`{top['name'][:60]}` ({kernel_kind(top['name'])})" if top else ""
        lines.append(
            f"| {row['corpus']} | `{label}` | {p['texts']:,} | {busy} | {shares} | {matmul} | {ceiling} | {first} |"
        )
    return lines
