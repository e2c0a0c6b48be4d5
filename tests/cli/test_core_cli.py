"""The ``care-retriever`` CLI: init, index, search --json, info, delete, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from care_retriever.cli.main import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def cli_model(tmp_path_factory: pytest.TempPathFactory, small_corpus_path: Path) -> Path:
    out = tmp_path_factory.mktemp("cli") / "model"
    assert main(["init", str(out), "--preset", "tiny", "--vocab-from", str(small_corpus_path)]) == 0
    return out


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in ("init", "index", "search", "info", "delete"):
        assert command in out


@pytest.mark.parametrize("backend", ["faiss", "qdrant"])
def test_init_index_search_json_info(
    capsys, cli_model: Path, small_corpus_path: Path, tmp_path: Path, backend: str
) -> None:
    store = f"{backend}:{tmp_path / 'store'}"
    code, out, _ = run(
        capsys,
        "index",
        "--model",
        cli_model,
        "--corpus",
        small_corpus_path,
        "--store",
        store,
        "--json",
        "--no-progress",
    )
    assert code == 0 and json.loads(out)["added"] == 6
    code, out, _ = run(
        capsys,
        "search",
        "--model",
        cli_model,
        "--store",
        store,
        "--top-k",
        "3",
        "--json",
        "血压高怎么办",
        "宝宝发烧",
    )
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [r["query"] for r in rows] == ["血压高怎么办", "宝宝发烧"]
    for row in rows:
        assert len(row["hits"]) == 3
        assert {"id", "score", "text"} <= set(row["hits"][0])
        scores = [h["score"] for h in row["hits"]]
        assert scores == sorted(scores, reverse=True)
    code, out, _ = run(capsys, "info", "--store", store, "--json")
    info = json.loads(out)
    assert code == 0 and info["count"] == 6 and info["backend"] == backend and info["dim"] == 32
    code, out, _ = run(capsys, "info", "--store", store)
    assert code == 0 and f"engine: {backend}\n" in out and "count: 6\n" in out
    code, out, _ = run(
        capsys,
        "index",
        "--model",
        cli_model,
        "--corpus",
        small_corpus_path,
        "--store",
        store,
        "--json",
        "--no-progress",
    )
    assert json.loads(out)["added"] == 0 and json.loads(out)["unchanged"] == 6
    code, out, _ = run(capsys, "delete", "--store", store, "a", "zz")
    assert code == 0 and "deleted 1 of 2" in out


def test_search_filters(capsys, cli_model: Path, small_corpus_path: Path, tmp_path: Path) -> None:
    store = f"faiss:{tmp_path / 'store'}"
    run(
        capsys,
        "index",
        "--model",
        cli_model,
        "--corpus",
        small_corpus_path,
        "--store",
        store,
        "--no-progress",
    )
    code, out, _ = run(
        capsys, "search", "--model", cli_model, "--store", store, "--json", "--filter", "group=odd", "血压"
    )
    assert code == 0 and {h["id"] for h in json.loads(out)["hits"]} == {"b", "d", "f"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["index", "--model", "{model}", "--corpus", "{bad}", "--store", "faiss:{tmp}/s"],
            "bad.jsonl:2: empty text",
        ),
        (
            ["index", "--model", "{tmp}/nope", "--corpus", "{corpus}", "--store", "faiss:{tmp}/s"],
            "model folder not found",
        ),
        (
            ["index", "--model", "{model}", "--corpus", "{corpus}", "--store", "redis:{tmp}/s"],
            "invalid store",
        ),
        (
            ["index", "--model", "{model}", "--corpus", "{tmp}/missing.jsonl", "--store", "faiss:{tmp}/s"],
            "corpus not found",
        ),
        (
            ["index", "--model", "{model}", "--corpus", "{corpus}", "--store", "faiss:{tmp}/s", "--index-type", "lsh"],
            "Unknown FAISS index type 'lsh'. Available: ['flat', 'hnsw', 'ivf', 'ivfpq']",
        ),
        (
            ["index", "--model", "{model}", "--corpus", "{corpus}", "--store", "faiss:{tmp}/s", "--nprobe", "0"],
            "nprobe (--nprobe) must be an integer >= 1, got 0",
        ),
        (["search", "--model", "{model}", "--store", "faiss:{tmp}/none", "q"], "does not exist"),
        (["serve", "--model", "{model}", "--store", "faiss:{tmp}/none", "--threads", "0"], "--threads must be >= 1"),
        (["init", "{tmp}/m2", "--preset", "huge", "--vocab-from", "{corpus}"], "Unknown preset 'huge'"),
        (["init", "{tmp}/m3", "--preset", "tiny"], "--vocab-from"),
    ],
)
def test_bad_input_is_one_line_nonzero_and_writes_nothing(
    capsys, cli_model, small_corpus_path, tmp_path: Path, args: list[str], message: str
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"_id": "a", "text": "好"}\n{"_id": "b", "text": ""}\n', encoding="utf-8")
    fill = {"model": str(cli_model), "bad": str(bad), "tmp": str(tmp_path), "corpus": str(small_corpus_path)}
    code, _, err = run(capsys, *[a.format(**fill) for a in args])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and message in lines[0] and "Traceback" not in err
    assert not (tmp_path / "s").exists() and not (tmp_path / ".s.staging").exists()


def test_installed_entry_point_prints_no_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "care_retriever.cli.main", "info", "--store", f"faiss:{tmp_path / 'x'}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error:") and "Traceback" not in proc.stderr


def test_index_settings_reach_the_manifest(capsys, cli_model: Path, small_corpus_path: Path, tmp_path: Path) -> None:
    """HNSW build/search settings given to `index` are what later searches use (kept in the manifest)."""
    store = tmp_path / "hnsw"
    args = ["index", "--model", cli_model, "--corpus", small_corpus_path, "--store", f"faiss:{store}"]
    code, _, err = run(capsys, *args, "--index-type", "hnsw", "--hnsw-m", "8", "--ef-search", "16", "--no-progress")
    assert code == 0, err
    index = json.loads((store / "manifest.json").read_text("utf-8"))["index"]
    assert index["type"] == "hnsw" and index["m"] == 8 and index["ef_search"] == 16
    code, out, err = run(capsys, "search", "--model", cli_model, "--store", f"faiss:{store}", "--json", "感冒")
    assert code == 0, err
    assert len(json.loads(out)["hits"]) == 6


def test_an_error_is_one_line_and_keeps_its_cause_for_debugging(
    tiny_model_dir: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """The CLI prints the error's one line; CARE_DEBUG=1 raises it with the error that caused it."""
    import shutil

    from care_retriever.errors import ModelError

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "care_config.json").read_text("utf-8"))
    del config["query"]
    (model / "care_config.json").write_text(json.dumps(config), encoding="utf-8")
    monkeypatch.delenv("CARE_DEBUG", raising=False)
    assert main(["export", "--model", str(model)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "malformed CARE config" in errors[0]
    monkeypatch.setenv("CARE_DEBUG", "1")
    with pytest.raises(ModelError) as raised:
        main(["export", "--model", str(model)])
    assert isinstance(raised.value.__cause__, KeyError)


def test_init_writes_each_tower_in_its_own_dtype(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A model written by init keeps each tower's own precision, whatever the device: a Qwen3 document tower
    saved in bf16 stays bf16 (half the bytes; on a GPU, init used to load both towers in bf16 and wrote the query
    tower in bf16, on a CPU it wrote the 4B tower in fp32), a BERT query tower saved in fp32 stays fp32."""
    import torch
    from safetensors import safe_open

    from tests.support.hub_towers import write_bert_sentence_transformer, write_qwen3_causal_lm

    query = write_bert_sentence_transformer(tmp_path / "bert_fp32_query_tower")
    document = write_qwen3_causal_lm(tmp_path / "qwen3_bf16_document_tower", dtype=torch.bfloat16)
    out = tmp_path / "model"
    code, _, err = run(capsys, "init", out, "--query-model", query, "--document-model", document)
    assert code == 0, err
    router = json.loads((out / "router_config.json").read_text("utf-8"))
    dtypes: dict[str, set[str]] = {}
    for route, modules in router["structure"].items():
        for module_id in modules:
            for weights in (out / module_id).glob("*.safetensors"):
                with safe_open(str(weights), "pt") as f:
                    dtypes.setdefault(route, set()).update(str(f.get_slice(k).get_dtype()) for k in f.keys())  # noqa: SIM118 (a safetensors file, not a dict)
    assert dtypes == {"query": {"F32"}, "document": {"BF16"}}


def test_main_called_again_in_one_process_registers_its_commands_once(capsys) -> None:
    """A program (or a test suite) calling ``main`` many times: the commands are registered once, not once per
    call (typer rebuilt its group from every registration on each call: a few hundred calls took seconds each)."""
    from care_retriever.cli import main as cli_main

    for _ in range(3):
        assert cli_main.main(["--help"]) == 0
    registered = len(cli_main.app.registered_commands) + len(cli_main.app.registered_groups)
    first = cli_main.command()
    for _ in range(3):
        assert cli_main.main(["info", "--store", "faiss:/nonexistent/store"]) != 0
    assert len(cli_main.app.registered_commands) + len(cli_main.app.registered_groups) == registered
    assert cli_main.command() is first
    names = [c.name or c.callback.__name__ for c in cli_main.app.registered_commands]
    assert len(names) == len(set(names)), names
    capsys.readouterr()
