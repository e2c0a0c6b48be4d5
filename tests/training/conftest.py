"""Fixtures of the training tests: a model in the authors' release layout to train from."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.data import REPO, load_script

RELEASE_FIXTURES = REPO / "tests" / "fixtures" / "release" / "make_release_fixtures.py"


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model in the authors' release layout (``query_encoder/`` + ``doc_encoder/``, BERT + Qwen3 1024 wide)."""
    make = load_script(RELEASE_FIXTURES, "make_release_fixtures")
    return make.build_release_fixture("bert", tmp_path_factory.mktemp("release") / "care")
