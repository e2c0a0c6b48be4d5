"""Suites: a folder of task folders run as one benchmark.

``cmedteb`` expects the five CMedTEB tasks as subfolders (names matched case- and
punctuation-insensitively; a missing one is reported, not fatal, since users often have only the
public parts). ``all`` runs every task folder or rows file directly under the folder.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from care_retriever.errors import InputError

logger = logging.getLogger("care_retriever")

# CMedTEB task -> accepted subfolder names (normalised: lower case, letters and digits only).
CMEDTEB: dict[str, tuple[str, ...]] = {
    "Retrieval": ("retrieval", "cmedtebretrieval", "medtebretrieval"),
    "Rerank": ("rerank", "reranking", "cmedtebrerank", "medtebrerank"),
    "Synonym STS": ("sts", "synonymsts", "synonym", "cmedtebsts", "medtebsts"),
    "CMedQA-v1": ("cmedqav1", "cmedqav1reranking", "cmedqa1"),
    "CMedQA-v2": ("cmedqav2", "cmedqav2reranking", "cmedqa2"),
}
SUITES = ("cmedteb", "all")


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _is_task(path: Path) -> bool:
    if path.is_file():
        return path.suffix == ".jsonl"
    return (path / "corpus.jsonl").is_file() or any(p.suffix == ".jsonl" for p in path.glob("*.jsonl"))


def resolve_suite(name: str, folder: Path) -> list[Path]:
    """Task paths of suite ``name`` under ``folder``."""
    if name not in SUITES:
        raise InputError(f"--suite {name!r}: unknown suite; expected one of {list(SUITES)}")
    if not folder.is_dir():
        raise InputError(f"--suite {name}: folder not found: {folder}")
    children = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    if name == "all":
        tasks = [p for p in children if _is_task(p)]
        if not tasks:
            raise InputError(f"{folder}: no task folders or rows files found")
        return tasks
    by_norm = {_norm(p.name.removesuffix(".jsonl")): p for p in children}
    found: list[Path] = []
    missing: list[str] = []
    for task, aliases in CMEDTEB.items():
        hit = next((by_norm[a] for a in aliases if a in by_norm), None)
        if hit is not None:
            found.append(hit)
        else:
            missing.append(task)
    if not found:
        raise InputError(f"{folder}: none of the CMedTEB tasks found; expected subfolders named {list(CMEDTEB)}")
    if missing:
        logger.warning("CMedTEB suite in %s: missing %s; running the %d present", folder, missing, len(found))
    return found
