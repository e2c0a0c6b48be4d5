"""The framework doors load a tower without printing transformers' loading bars to the user's stderr, unless asked,
and leave the user's transformers settings as they found them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import haystack  # noqa: F401  (dev dependency: a broken install fails, never skips)
import pytest
from haystack_integrations.components.embedders.care_retriever import CareDocumentEmbedder, CareTextEmbedder
from transformers.utils import logging as hf_logging

from care_retriever.integrations.langchain import CareEmbeddings

LOADING_BAR = "Loading weights"


@pytest.fixture
def transformers_defaults() -> Iterator[None]:
    """transformers as a user's program has it: bars on, warnings shown (a CLI test may have silenced them)."""
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_warning()
    hf_logging.enable_progress_bar()
    yield
    hf_logging.set_verbosity(verbosity)
    (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()


def test_haystack_embedders_warm_up_quietly_unless_asked(
    tiny_model_dir: Path, transformers_defaults: None, capfd: pytest.CaptureFixture[str]
) -> None:
    capfd.readouterr()
    CareTextEmbedder(str(tiny_model_dir), device="cpu").warm_up()
    CareDocumentEmbedder(str(tiny_model_dir), device="cpu").warm_up()
    assert LOADING_BAR not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # the user's setting is back
    assert hf_logging.get_verbosity() == hf_logging.WARNING

    CareTextEmbedder(str(tiny_model_dir), device="cpu", progress_bar=True).warm_up()
    assert LOADING_BAR in capfd.readouterr().err


def test_langchain_embeddings_load_quietly_unless_asked(
    tiny_model_dir: Path, transformers_defaults: None, capfd: pytest.CaptureFixture[str]
) -> None:
    capfd.readouterr()
    quiet = CareEmbeddings(model=str(tiny_model_dir), device="cpu", backend="torch")
    quiet.embed_query("血压高")
    quiet.embed_documents(["高血压患者应低盐饮食"])
    assert LOADING_BAR not in capfd.readouterr().err

    CareEmbeddings(model=str(tiny_model_dir), device="cpu", backend="torch", show_progress=True).embed_query("血压高")
    assert LOADING_BAR in capfd.readouterr().err
