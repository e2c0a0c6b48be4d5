"""Security defaults: no model code from the model folder, no pickled weights, no API key in messages or
logs, the service on loopback unless told otherwise."""

from __future__ import annotations

import json
import logging
import shutil
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from care_retriever import AsymmetricEmbedder
from care_retriever.cli.serve import DEFAULT_HOST, bind_socket
from care_retriever.errors import InputError, ModelError, StoreError
from care_retriever.stores import open_store

SECRET = "sk-care-test-7f3a9e"


def _copy(tiny_model_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(tiny_model_dir, target)
    return target


def _pickle_weights(module_dir: Path) -> None:
    """Replace ``model.safetensors`` by a pickled ``pytorch_model.bin`` holding the same tensors."""
    torch.save(load_file(module_dir / "model.safetensors"), module_dir / "pytorch_model.bin")
    (module_dir / "model.safetensors").unlink()


def test_model_code_in_the_folder_is_not_run_by_default(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = _copy(tiny_model_dir, tmp_path)
    marker = tmp_path / "code-ran"
    tower = model / "query_0_Transformer"
    (tower / "evil_modeling.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    config = json.loads((tower / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "evil_modeling.EvilModel", "AutoConfig": "evil_modeling.EvilConfig"}
    (tower / "config.json").write_text(json.dumps(config))
    embedder = AsymmetricEmbedder.from_pretrained(model, load="query")
    assert embedder.embed_queries(["高血压"]).shape == (1, embedder.dim)
    assert not marker.exists()


def test_pickled_transformer_weights_are_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = _copy(tiny_model_dir, tmp_path)
    _pickle_weights(model / "query_0_Transformer")
    with pytest.raises(ModelError, match=r"model\.safetensors"):
        AsymmetricEmbedder.from_pretrained(model, load="query")


def test_pickled_dense_weights_are_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = _copy(tiny_model_dir, tmp_path)
    _pickle_weights(model / "document_2_Dense")
    with pytest.raises(ModelError, match="safetensors"):
        AsymmetricEmbedder.from_pretrained(model, load="document")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("userinfo", ["", f"admin:{SECRET}@"])
def test_qdrant_api_key_never_reaches_messages_or_logs(monkeypatch, caplog, capfd, userinfo: str) -> None:
    monkeypatch.setenv("QDRANT_API_KEY", SECRET)
    url = f"http://{userinfo}127.0.0.1:{_closed_port()}"
    with caplog.at_level(logging.DEBUG), pytest.raises(StoreError, match="cannot reach Qdrant") as info:
        open_store(f"qdrant:{url}")
    out, err = capfd.readouterr()
    seen = [str(info.value), caplog.text, out, err]
    assert all(SECRET not in text for text in seen)
    assert f"qdrant:http://127.0.0.1:{url.rsplit(':', 1)[1]}" in str(info.value)


def test_service_defaults_to_loopback() -> None:
    """``serve`` without ``--host`` binding 127.0.0.1 is checked on a real server in test_reliability_service."""
    assert DEFAULT_HOST == "127.0.0.1"
    sock = bind_socket(DEFAULT_HOST, 0)
    try:
        assert sock.getsockname()[0] == "127.0.0.1"
    finally:
        sock.close()
    with pytest.raises(InputError, match="--port"):
        bind_socket(DEFAULT_HOST, 70000)


def test_tower_folders_with_model_code_are_not_run_by_from_towers(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The other loader: pairing two tower folders never runs the code a tower's config points at."""
    model = _copy(tiny_model_dir, tmp_path)
    marker = tmp_path / "code-ran"
    for tower in (model / "query_0_Transformer", model / "document_0_Transformer"):
        (tower / "evil_modeling.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
        config = json.loads((tower / "config.json").read_text())
        config["auto_map"] = {"AutoModel": "evil_modeling.EvilModel", "AutoConfig": "evil_modeling.EvilConfig"}
        (tower / "config.json").write_text(json.dumps(config))
    embedder = AsymmetricEmbedder.from_towers(str(model / "query_0_Transformer"), str(model / "document_0_Transformer"))
    assert embedder.embed_queries(["高血压"]).shape == (1, embedder.dim)
    assert not marker.exists()
