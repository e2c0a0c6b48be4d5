"""Each store and encoding option has one home: its config class declares its default, help and check, and the
``index`` command, IndexSettings, the stores and the integrations all read it from there. Manifests read and write
the dicts stores have always written."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer

from care_retriever.cli import core
from care_retriever.cli.dataclass_options import cli_fields, cli_options
from care_retriever.cli.index_settings import settings_from_options
from care_retriever.cli.main import main as cli_main
from care_retriever.errors import InputError
from care_retriever.indexing.config import DOCUMENT_BATCH_SIZE, EncodeConfig
from care_retriever.indexing.distributed import index_options_classes
from care_retriever.integrations.common import check_index_options
from care_retriever.stores.config import (
    FaissIndexConfig,
    IndexType,
    QdrantCollectionConfig,
    QdrantQuantize,
    Quantize,
    StoreKind,
    StoreSpec,
    flag_of,
)

REPO = Path(__file__).resolve().parents[2]
FORMAT1 = REPO / "tests" / "fixtures" / "format1"
# the command's own switches: no store or encoding setting
CLI_ONLY = {"--json", "--sparse-only", "--discard-pending", "--help"}


def _index_command() -> Any:
    """The click command typer builds for ``index`` (typer may carry its own copy of click: read it by duck type)."""
    app = typer.Typer()
    core.register(app)
    return typer.main.get_command(app).commands["index"]  # type: ignore[attr-defined]


def _options(command: Any) -> list[Any]:
    return [p for p in command.params if p.param_type_name == "option"]


def _options_by_flag() -> dict[str, Any]:
    return {opt: param for param in _options(_index_command()) for opt in param.opts if opt.startswith("--")}


# ---------------------------------------------------------------------------------------------------- the CLI
def test_every_config_field_is_one_index_option_with_the_fields_default() -> None:
    by_flag = _options_by_flag()
    seen: dict[str, list[str]] = {}
    for cls in index_options_classes():
        for f in cli_fields(cls):
            flag = flag_of(f)
            seen.setdefault(flag, []).append(f"{cls.__name__}.{f.name}")
            assert flag in by_flag, f"{cls.__name__}.{f.name}: no option {flag}"
            cli_default = by_flag[flag].default
            field_default = None if f.default is dataclasses.MISSING else f.default
            assert cli_default == field_default, (
                f"{flag}: CLI {cli_default!r}, {cls.__name__}.{f.name} {field_default!r}"
            )
            assert by_flag[flag].help, flag
    # every option of the command is a config field's (or one of its own switches), declared once
    options = _options(_index_command())
    declared = {p.opts[0] for p in options}
    assert declared - CLI_ONLY == set(seen)
    assert len(options) == len(declared)
    # fields share a flag only across the two store kinds (one --quantize, one --oversample)
    shared = {flag: owners for flag, owners in seen.items() if len(owners) > 1}
    assert shared == {
        "--quantize": ["FaissIndexConfig.quantize", "QdrantCollectionConfig.quantize"],
        "--oversample": ["FaissIndexConfig.oversample", "QdrantCollectionConfig.oversample"],
    }


def test_flags_help_and_defaults_kept() -> None:
    """The flags users type, with their defaults and wording."""
    by_flag = _options_by_flag()
    assert by_flag["--hnsw-m"].default == 32 and by_flag["--hnsw-m"].help == "HNSW neighbours per node."
    assert by_flag["--index-type"].default == "flat" and by_flag["--max-batch-tokens"].default == "auto"
    assert "Default: 16 on CPU, 2048 on a GPU." in (by_flag["--batch-size"].help or "")
    assert "--no-progress" in by_flag["--progress"].secondary_opts and by_flag["--progress"].default is True
    assert by_flag["--on-disk-vectors"].secondary_opts == [] and by_flag["--trust-remote-code"].secondary_opts == []
    assert by_flag["--store"].required


def test_settings_from_the_cli_options_hold_the_configs() -> None:
    values: dict[str, Any] = {o.name: o.default for o in cli_options(*index_options_classes())}
    values.update(store="faiss:/tmp/x", model="m", corpus=Path("c.jsonl"), hnsw_m=8, index_type="hnsw")
    settings = settings_from_options(values)
    assert settings.store == StoreSpec(StoreKind.FAISS, "/tmp/x")
    assert settings.index == FaissIndexConfig(index_type=IndexType.HNSW, m=8)
    assert settings.encode == EncodeConfig()
    values.update(store="qdrant::memory:", collection="c", quantize="binary")
    settings = settings_from_options(values)
    assert settings.store == StoreSpec(StoreKind.QDRANT, ":memory:", "c")
    # FAISS's HNSW flags act on a Qdrant collection too (--hnsw-m 8 is its m); an IVF index is FAISS's only
    assert settings.index == QdrantCollectionConfig(quantize=QdrantQuantize.BINARY, m=8)
    values.update(index_type="ivf")
    with pytest.raises(InputError, match="a Qdrant collection is HNSW"):
        settings_from_options(values)


# ---------------------------------------------------------------------------------------------------- one check
def _cli_error(capsys: pytest.CaptureFixture[str], tmp_path: Path, *flags: str) -> str:
    (tmp_path / "c.jsonl").write_text('{"id": "a", "text": "t"}\n', "utf-8")
    args = ["index", "--model", str(tmp_path), "--corpus", str(tmp_path / "c.jsonl"), "--store"]
    assert cli_main([*args, f"faiss:{tmp_path / 's'}", *flags]) == 2
    return capsys.readouterr().err.strip()


@pytest.mark.parametrize(
    ("flags", "given"),
    [
        (("--quantize", "int4"), {"quantize": "int4"}),
        (("--hnsw-m", "0"), {"m": 0}),
        (("--index-type", "lsh"), {"type": "lsh"}),
        (("--oversample", "0.5"), {"oversample": 0.5}),
        (("--quantize", "binary", "--index-type", "hnsw"), {"quantize": "binary", "type": "hnsw"}),
    ],
)
def test_a_bad_value_gets_one_error_from_the_config_class_everywhere(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: tuple[str, ...], given: dict[str, Any]
) -> None:
    with pytest.raises(InputError) as direct:
        FaissIndexConfig.from_manifest(given)
    message = str(direct.value)
    assert "\n" not in message
    with pytest.raises(InputError) as integration:
        check_index_options("faiss", given)
    assert str(integration.value) == message
    assert _cli_error(capsys, tmp_path, *flags) == f"error: {message}"
    assert not (tmp_path / "s").exists()


def test_qdrant_values_are_checked_by_its_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(InputError) as direct:
        QdrantCollectionConfig(shards=0)
    with pytest.raises(InputError) as integration:
        check_index_options("qdrant", {"shards": 0})
    assert str(direct.value) == str(integration.value) == "Qdrant option shards must be an integer >= 1, got 0"
    with pytest.raises(InputError, match="unknown Qdrant quantization 'pq'"):
        QdrantCollectionConfig.from_manifest({"quantize": "pq"})


def test_encode_options_are_checked_by_encode_config() -> None:
    assert EncodeConfig(max_batch_tokens="none").max_batch_tokens is None
    assert EncodeConfig(max_batch_tokens="512").max_batch_tokens == 512
    with pytest.raises(InputError, match="--max-batch-tokens must be an integer >= 1, auto or none, got 'lots'"):
        EncodeConfig(max_batch_tokens="lots")
    with pytest.raises(InputError, match="--sort-window must be an integer >= 1, got 0"):
        EncodeConfig(sort_window=0)


# ---------------------------------------------------------------------------------------------------- one default
OLD_LITERAL_DEFAULTS = [
    # an index option's default written again where it is read
    re.compile(
        r"""(?:options|index|\(index or \{\}\))\.get\(\s*"""
        r"""["'](m|ef_construction|ef_search|nlist|nprobe|pq_m|pq_bits|type|quantize)["']"""
    ),
    # the document batch written again in a signature
    re.compile(r"batch_size: int(?: \| None)? = 16\b"),
    # the oversampling tables, or the "none" spellings of a missing quantization, outside the config module
    re.compile(r"""\{\s*["']sq8["']\s*:\s*[0-9.]+"""),
    re.compile(r"""quantize["']?\)? (?:not )?in \(None, ["']none["']\)"""),
    # an encoding option's default written again in a signature (EncodeConfig's; the writer takes the config)
    re.compile(r"\b(?:chunk_size|sort_window|checkpoint_every): int = \d"),
    re.compile(r"""max_batch_tokens: [^=\n]*= ["']auto["']"""),
    # whether an indexing run writes the BM25 side (indexing.config.SPARSE)
    re.compile(r"\bsparse: bool = (?:True|False)\b"),
]


# The homes of the defaults: every other file is scanned.
CONFIG_HOMES = {
    Path("care_retriever/stores/config.py"),
    Path("care_retriever/indexing/config.py"),
    Path("care_retriever/model/batch_limits.py"),
}


def test_no_store_option_is_defaulted_outside_its_config() -> None:
    found = []
    for folder in ("care_retriever", "integrations"):
        for path in (REPO / folder).rglob("*.py"):
            if path.relative_to(REPO) in CONFIG_HOMES:
                continue
            text = path.read_text("utf-8")
            for pattern in OLD_LITERAL_DEFAULTS:
                found += [f"{path.relative_to(REPO)}: {m.group(0)}" for m in pattern.finditer(text)]
    assert found == []
    assert DOCUMENT_BATCH_SIZE == 16


# ---------------------------------------------------------------------------------------------------- manifests
# Every shape of a FAISS manifest's "index" dict written before, and the config it reads as.
WRITTEN_BEFORE = [
    ({"type": "flat", "tombstones": 0}, FaissIndexConfig()),  # format 1 (and format 2 without quantization)
    ({"type": "hnsw", "tombstones": 2}, FaissIndexConfig(index_type=IndexType.HNSW)),
    (  # care-retriever index, no quantization
        {"type": "hnsw", "m": 8, "ef_construction": 200, "ef_search": 24, "nlist": 1024, "nprobe": 32, "pq_m": 96},
        FaissIndexConfig(index_type=IndexType.HNSW, m=8, ef_search=24),
    ),
    (  # a quantized store: its oversample resolved
        {"type": "flat", "quantize": "sq8", "oversample": 4.0},
        FaissIndexConfig(quantize=Quantize.SQ8, oversample=4.0),
    ),
    ({"type": "ivf", "nlist": 8}, FaissIndexConfig(index_type=IndexType.IVF, nlist=8)),  # an integration's dict
    ({"quantize": "none"}, FaissIndexConfig(quantize=Quantize.NONE)),
    ({}, FaissIndexConfig()),
    (None, FaissIndexConfig()),
]


@pytest.mark.parametrize(("written", "config"), WRITTEN_BEFORE)
def test_faiss_manifests_written_before_read_as_their_config(written: dict[str, Any] | None, config: Any) -> None:
    read = FaissIndexConfig.from_manifest(written)
    assert read == config
    assert FaissIndexConfig.from_manifest(read.to_manifest()).to_manifest() == read.to_manifest()


def test_the_cli_writes_the_manifest_dict_it_always_wrote() -> None:
    cli_default = {"type": "flat", "m": 32, "ef_construction": 200, "ef_search": 128, "nlist": 1024, "nprobe": 32}
    assert FaissIndexConfig().to_manifest() == {**cli_default, "pq_m": 96}
    assert FaissIndexConfig(quantize=Quantize.NONE).to_manifest() == {**cli_default, "pq_m": 96}  # no key: format 2
    binary = FaissIndexConfig(quantize=Quantize.BINARY).to_manifest()
    assert binary == {**cli_default, "pq_m": 96, "quantize": "binary", "oversample": 100.0}
    assert FaissIndexConfig(quantize=Quantize.PQ, pq_bits=4).to_manifest()["pq_bits"] == 4
    # asked without quantize, oversample is kept as asked (an existing quantized store takes it)
    assert FaissIndexConfig(oversample=6).oversample == 6.0
    assert FaissIndexConfig().quantize is None and FaissIndexConfig(quantize=Quantize.NONE).quantize is Quantize.NONE


def test_format1_fixture_manifests_read() -> None:
    for name in ("flat", "hnsw"):
        index = json.loads((FORMAT1 / name / "manifest.json").read_text("utf-8"))["index"]
        assert FaissIndexConfig.from_manifest(index).index_type.value == name


@pytest.mark.parametrize(
    ("written", "recorded"),
    [
        ({"type": "hnsw", "quantize": "none"}, {"type": "hnsw", "quantize": "none"}),
        (
            {"type": "hnsw", "quantize": "sq8", "always_ram": True, "oversample": 2.0},
            {"type": "hnsw", "quantize": "sq8", "always_ram": True, "oversample": 2.0},
        ),
        (
            {"quantization": "int8", "shard_number": 2, "replication_factor": 3, "on_disk": False},
            {"type": "hnsw", "quantize": "sq8", "shards": 2, "replicas": 3, "on_disk": False},
        ),
        ({"m": 16, "ef_construct": 64}, {"type": "hnsw", "m": 16, "ef_construct": 64}),
        (None, {"type": "hnsw"}),
    ],
)
def test_qdrant_manifests_round_trip(written: dict[str, Any] | None, recorded: dict[str, Any]) -> None:
    config = QdrantCollectionConfig.from_manifest(written)
    assert config.to_manifest() == recorded
    assert QdrantCollectionConfig.from_manifest(config.to_manifest()) == config


def test_qdrant_resolved_defaults() -> None:
    assert QdrantCollectionConfig(quantize=QdrantQuantize.BINARY).resolved().to_manifest() == {
        "type": "hnsw",
        "quantize": "binary",
        "always_ram": True,
        "oversample": 3.0,
    }
    with pytest.raises(InputError, match="apply to a quantized collection"):
        QdrantCollectionConfig(oversample=3).resolved()
