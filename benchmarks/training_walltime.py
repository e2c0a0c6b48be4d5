"""How much of each training stage's wall time is training: read a finished run's ``run.json`` and write a table
of it into benchmarks/results/gpu.md (its own section, beside the indexing ones).

    care-retriever train --recipe paper --out /tmp/p --preset base --dry-run-steps 10   # on the GPU machine
    python -m benchmarks.training_walltime /tmp/p/run.json --device "NVIDIA H200, torch 2.11.0+cu130"
    python -m benchmarks.training_walltime /tmp/p40/run.json --device "..." --command "..." --section training-40

Per stage: its steps, ``seconds`` (the trainer's loop: forward, backward, optimizer, logging) and ``wall_seconds``
(the whole stage: data reading and checks, loading the towers the stage starts from, a teacher cache or negative
mining, the loop and saving the stage), as the run recorded them; the share is seconds / wall_seconds. The target
is a share of at least one half in every stage. The extra column names the document tower's forward pass where a
stage ran it (Stage I's teacher, Stage II's document side: packed or padded, the attention kernel, compiled).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.gpu_index import DOC, write_section

TARGET = 0.5


def table(run: dict[str, Any], device: str, command: str) -> str:
    lines = [
        f"### training: {device}",
        "",
        f"Recipe `{run.get('recipe')}`, {run.get('processes', {}).get('world_size', 1)} process(es); "
        f"the random towers and tokenizers built in {run.get('init_seconds', 0):.1f} s before the first stage.",
        f"Command: `{command}`",
        "",
        "| stage | type | steps | rows | training s | wall s | training share | extra |",
        "|---|---|---|---|---|---|---|---|",
    ]
    short = []
    for report in run.get("reports", []):
        seconds, wall = float(report["seconds"]), float(report["wall_seconds"])
        share = seconds / wall if wall else 0.0
        extra = []
        if "teacher_cache_seconds" in report:
            extra.append(f"teacher cache {report['teacher_cache_seconds']:.2f} s for {report['teacher_texts']} texts")
        if "hard_negatives" in report:
            extra.append(f"{report['hard_negatives']} mined negatives a row")
        for key, what in (("teacher_forward", "teacher"), ("document_forward", "document side")):
            state = report.get(key)
            if isinstance(state, dict):  # the document tower's forward the stage ran (model/forward.py)
                compiled = ", compiled" if state.get("compile") == "on" else ""
                extra.append(f"{what} {state.get('forward')} ({state.get('attention')}{compiled})")
        lines.append(
            f"| {report['name']} | {report['type']} | {report['steps']} | {report['examples']} | {seconds:.2f} | "
            f"{wall:.2f} | {share:.0%} | {'; '.join(extra)} |"
        )
        if share < TARGET:
            short.append(report["name"])
    lines.append("")
    verdict = f"below one half: {', '.join(short)}" if short else "every stage at or above one half"
    lines.append(f"* training share of each stage's wall time (target >= {TARGET:.0%}): {verdict}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run's run.json (or its folder)")
    parser.add_argument("--device", required=True, help="the machine that ran it, in words")
    parser.add_argument(
        "--command",
        default="care-retriever train --recipe paper --out /tmp/p --preset base --dry-run-steps 10",
        help="the command that made the run",
    )
    parser.add_argument("--docs", type=Path, default=DOC)
    parser.add_argument("--section", default="training", help="the doc's section to write (one per run kept)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    path = args.run / "run.json" if args.run.is_dir() else args.run
    run = json.loads(path.read_text(encoding="utf-8"))
    text = table(run, args.device, args.command)
    print(text)
    if not args.no_write:
        write_section(args.docs, args.section, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
