"""The report of ``benchmarks.quantization``: its JSON results as the markdown tables of
benchmarks/results/scale.md, written between the section's markers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.marked_sections import write_marked

SECTION = "quantization"  # the section of the scale log it writes: <!-- quantization:start --> ... :end -->


def render_dev(dev: dict[str, Any]) -> list[str]:
    """The dev-task tables of one tower pair: nDCG@10 (overlap@10 with exact) per setting, and the sweep."""
    names = list(dev["tasks"])
    what = (
        f"the tower pair `{dev['model']}`"
        if dev["model"].startswith("random")
        else f"the trained model `{dev['model']}`" + (f" (recipe {dev['recipe']})" if dev.get("recipe") else "")
    )
    lines = [
        "",
        f"Dev tasks: nDCG@10 with {what}, {dev['dim']} dims, measured {dev['measured']}; in brackets, overlap@10 "
        "with the exact ranking (recall@10 against exact search).",
        "",
        "| quantize | " + " | ".join(f"{n} ({dev['tasks'][n]['documents']:,} docs)" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    settings = [r["setting"] for r in dev["tasks"][names[0]]["rows"]]
    for s in settings:
        cells = []
        for n in names:
            row = next(r for r in dev["tasks"][n]["rows"] if r["setting"] == s)
            extra = f" ({row['overlap_at_10_with_exact']:.3f})" if row["overlap_at_10_with_exact"] is not None else ""
            cells.append(f"{row['ndcg_at_10']:.4f}{extra}")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    swept = [(n, r) for n in names for r in dev["tasks"][n]["rows"] if r.get("oversample_sweep")]
    if swept:
        values = sorted({v for _, r in swept for v in r["oversample_sweep"]}, key=float)
        lines += ["", "overlap@10 with the exact ranking by search-time `oversample` (same stores):", ""]
        lines += ["| task | quantize | " + " | ".join(values) + " |", "|---|---|" + "---|" * len(values)]
        for n, r in swept:
            cells = [
                f"{r['oversample_sweep'][v]['overlap_at_10_with_exact']:.4f}" if v in r["oversample_sweep"] else "-"
                for v in values
            ]
            lines.append(f"| {n} | {r['setting']} | " + " | ".join(cells) + " |")
    return lines


def render(result: dict[str, Any]) -> str:
    lines: list[str] = [""]  # a blank line after the start marker
    syn = result.get("synthetic")
    if syn and syn.get("rows"):
        base = next((r for r in syn["rows"] if r["setting"] == "none"), None)
        lines += [
            f"Synthetic: {syn['n']:,} clustered unit vectors x {syn['dim']} dims through `FaissStore` (flat index), "
            f"{syn['queries']} queries ({syn['latency_queries']} timed one at a time), {syn['cpu_cores']} shared "
            f"CPU cores, measured {syn['measured']}.",
            "",
            "| quantize | oversample | RAM B/doc | RAM vs flat | disk B/doc | build (s) | p50 (ms) | p99 (ms) "
            "| recall@10 | recall@100 |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in syn["rows"]:
            ratio = (
                f"1/{base['ram_bytes_per_doc'] / r['ram_bytes_per_doc']:.1f}"
                if base and r["ram_bytes_per_doc"] > 0
                else "-"
            )
            lines.append(
                f"| {r['setting']} | {r['oversample'] or '-'} | {r['ram_bytes_per_doc']:,.0f} | {ratio} "
                f"| {r['disk_bytes_per_doc']:,.0f} | {r['build_s']:.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} "
                f"| {r['recall_at_10']:.4f} | {r['recall_at_100']:.4f} |"
            )
        sweeps = [r for r in syn["rows"] if r.get("oversample_sweep")]
        if sweeps:
            # rows measured by different runs may sweep different values: "-" where a row has none
            values = sorted({v for r in sweeps for v in r["oversample_sweep"]}, key=float)
            lines += ["", "recall@10 by search-time `oversample` (same builds):", ""]
            lines += ["| quantize | " + " | ".join(values) + " |", "|---|" + "---|" * len(values)]
            for r in sweeps:
                sweep = r["oversample_sweep"]
                cells = [f"{sweep[v]['recall_at_10']:.4f}" if v in sweep else "-" for v in values]
                lines.append(f"| {r['setting']} | " + " | ".join(cells) + " |")
    devs = [d for d in (result.get("dev"), *result.get("dev_models", [])) if d and d.get("tasks")]
    for dev in devs:
        lines += render_dev(dev)
    listed = [c for part in (syn, *devs) if part for c in part.get("commands", [part.get("command")]) if c]
    commands = list(dict.fromkeys(listed))
    lines += ["", "Measured by " + " and ".join(f"`{c}`" for c in commands) + "."]
    return "\n".join(lines)


def write_docs(path: Path, section: str) -> None:
    """Write the report into ``path``'s quantization section (added at the end where it has none)."""
    write_marked(path, SECTION, section + "\n", add=True)
