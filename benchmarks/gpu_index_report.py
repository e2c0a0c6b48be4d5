"""The report of ``benchmarks.gpu_index``: the device in words, the markdown table of a run, and its section of a doc
(between markers per device kind, so a CPU run and a GPU run keep each other's)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from benchmarks.gpu_index_sides import INDEX_SIDES
from benchmarks.gpu_profile import markdown_rows
from benchmarks.marked_sections import write_marked


def describe_device(device: str) -> str:
    import platform

    import torch

    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    return (
        f"CPU ({platform.processor() or platform.machine()}), {os.cpu_count()} cores, {torch.get_num_threads()} "
        f"torch threads, torch {torch.__version__}"
    )


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"### {result['device_kind']}: {result['device']}",
        "",
        f"Tower: {result['tower']} ({result['dtype']}, attention {result['attn_implementation']}). Matmul peak "
        f"measured: {result['matmul_tflops']:.3f} TFLOP/s ({result['matmul_dtype']}). {result['date']}.",
        f"Command: `{result['command']}`",
        "",
        "| corpus | docs | tokens/doc | batch | side | forward | docs/s (best) | docs/s per round | x encode_document "
        "| docs/s with compile | compile s | tokens/s | padding | MFU | peak MiB | cos min to fp32 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        for label, side in row["sides"].items():
            head = f"| {row['corpus']} | {row['docs']:,} | {row['tokens_per_doc']} "
            batch = side.get("batch", row["batch_size"])
            if "docs_per_second" not in side:
                lines.append(f"{head}| {batch} | `{label}` | not run: {side.get('not_run')} |" + " |" * 10)
                continue
            budget = f", budget {side['max_batch_tokens']}" if side.get("max_batch_tokens") else ""
            forward = side.get("forward", "padded (sentence-transformers)")
            dtype = f", {side['dtype']}" if "fp8" in str(side.get("dtype", "")) else ""
            dtype += ", fused norms" if side.get("norms") == "fused" else ""
            cosine = f"{side['cosine_min']:.5f}" if "cosine_min" in side else ""
            lines.append(
                f"{head}| {batch} | `{label}` | {forward}{dtype}, compile {side.get('compile', 'off')}{budget} "
                f"| {side['docs_per_second']:,.1f} | {', '.join(f'{v:,.1f}' for v in side['docs_per_second_rounds'])} "
                f"| {side.get('vs_encode_document', 1.0):.3f} | {side['docs_per_second_with_compile']:,.1f} "
                f"| {side.get('compile_seconds', 0.0):.1f} | {side['tokens_per_second']:,.0f} "
                f"| {side['padding_ratio']:.3f} | {side['mfu']:.2%} | {side['peak_mib']:,.1f} | {cosine} |"
            )
    lines += markdown_rows(result["rows"])
    lines.append("")
    lines += [
        f"* {row['corpus']}: `index` / `encode_document` = **{row['ratio']:.3f}** (best rounds; median of the "
        f"rounds' ratios {row['ratio_median_of_rounds']:.3f})"
        for row in result["rows"]
        if "ratio" in row
    ]
    for row in result["rows"]:
        defaults = row["sides"].get("encode_document defaults", {}).get("docs_per_second")
        fastest = max(
            ((side.get("docs_per_second", 0.0), label) for label, side in row["sides"].items() if label in INDEX_SIDES),
            default=(0.0, ""),  # a run of sentence-transformers' sides alone
        )
        if defaults and fastest[0]:
            lines.append(
                f"* {row['corpus']}: against `encode_document` at its defaults (the targets' baseline): `index` "
                f"{row['sides'].get('index', {}).get('docs_per_second', 0.0) / defaults:.2f}x, the fastest index "
                f"side (`{fastest[1]}`) {fastest[0] / defaults:.2f}x"
            )
        fp8 = row["sides"].get("index fp8", {})
        if "cosine_min" in fp8:
            lines.append(
                f"* {row['corpus']}: `index fp8` document vectors against the tower's in fp32, "
                f"{row.get('fidelity_docs', 0):,} texts: cosine min **{fp8['cosine_min']:.5f}**, "
                f"mean {fp8['cosine_mean']:.5f}; bf16 (`index packed`): "
                f"{row['sides'].get('index packed', {}).get('cosine_min', float('nan')):.5f}"
            )
    for name in result["skipped"]:
        lines.append(f"* {name}: skipped (corpus not found)")
    return "\n".join(lines) + "\n"


def write_section(doc: Path, kind: str, text: str) -> None:
    """Replace (or add) this device kind's section of ``doc`` (``<!-- gpu_index:KIND:begin -->``), keeping the
    others."""
    write_marked(doc, f"gpu_index:{kind}", text, add=True, title="# Indexing on GPUs\n\n")


def command_line(module: str, argv: list[str] | None) -> str:
    """The command a benchmark ran as, for its section: ``python -m benchmarks.NAME`` and its arguments."""
    import shlex
    import sys

    return f"python -m benchmarks.{module} {shlex.join(argv if argv is not None else sys.argv[1:])}".strip()


def publish(result: dict[str, Any], text: str, doc: Path, section: str, *, write: bool) -> None:
    """Print a benchmark's result (JSON, then its markdown) and, unless told not to, write its section of ``doc``."""
    import json

    print(json.dumps(result, ensure_ascii=False))
    print(text)
    if write:
        write_section(doc, section, text)
