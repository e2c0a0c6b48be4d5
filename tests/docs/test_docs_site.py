"""The docs site: its CLI reference covers every command and option, and the guides' examples fit the sample."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDES = sorted((ROOT / "docs").rglob("*.md"))
SAMPLE_CORPUS = ROOT / "care_retriever" / "data" / "sample" / "corpus.jsonl"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


@pytest.fixture(scope="module")
def cli_reference() -> str:
    sys.path.insert(0, str(ROOT / "docs_hooks"))
    try:
        import cli_reference as hook
    finally:
        sys.path.remove(str(ROOT / "docs_hooks"))
    return hook.on_page_markdown((ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8"))


def test_cli_reference_lists_every_command_and_option(cli_reference: str) -> None:
    from care_retriever.cli.main import command

    group = command()
    context = group.context_class(group, info_name="care-retriever")
    names = group.list_commands(context)
    assert {"index", "search", "serve", "copy", "migrate", "export"} <= set(names)
    for name in names:
        sub = group.get_command(context, name)
        assert f"## `care-retriever {name}`" in cli_reference, name
        for param in sub.params:
            for opt in param.opts:
                assert f"`{opt}`" in cli_reference, f"{name} {opt}"
    assert "::: cli-reference" not in cli_reference


def _sample_metadata_fields() -> set[str]:
    fields: set[str] = set()
    for line in SAMPLE_CORPUS.read_text(encoding="utf-8").splitlines():
        fields |= set(json.loads(line).get("metadata", {}))
    return fields


def _request_bodies(text: str) -> list[dict]:
    bodies = []
    for language, block in FENCE.findall(text):
        if language != "bash" or "curl" not in block:
            continue
        words = shlex.split(block.replace("\\\n", " "), comments=True)
        bodies += [json.loads(words[i + 1]) for i, word in enumerate(words) if word in ("-d", "--data")]
    return bodies


@pytest.mark.parametrize("page", GUIDES, ids=lambda page: str(page.relative_to(ROOT)))
def test_guide_filters_use_fields_the_shipped_sample_has(page: Path) -> None:
    fields = _sample_metadata_fields()
    for body in _request_bodies(page.read_text(encoding="utf-8")):
        unknown = set(body.get("filters") or {}) - fields
        assert not unknown, f"{page.name}: filters on {sorted(unknown)}, not in the sample's {sorted(fields)}"


@pytest.mark.parametrize("page", GUIDES, ids=lambda page: str(page.relative_to(ROOT)))
def test_guide_python_blocks_compile(page: Path) -> None:
    for language, block in FENCE.findall(page.read_text(encoding="utf-8")):
        if language == "python" and not block.lstrip().startswith(">>>"):
            compile(block, f"{page.name} python block", "exec")


def test_configuration_reference_lists_every_field_of_every_config() -> None:
    import dataclasses
    import importlib

    sys.path.insert(0, str(ROOT / "docs_hooks"))
    try:
        import config_reference as hook
    finally:
        sys.path.remove(str(ROOT / "docs_hooks"))
    page = hook.on_page_markdown((ROOT / "docs" / "reference" / "configuration.md").read_text(encoding="utf-8"))
    assert hook.MARKER not in page
    for module, name, _ in hook.CONFIGS:
        section = page.split(f"## `{name}`", 1)[1].split("\n## ", 1)[0]
        cls = getattr(importlib.import_module(module), name)
        for field in dataclasses.fields(cls):
            if field.init:
                assert f"| `{field.name}` |" in section, f"{name}.{field.name}"
