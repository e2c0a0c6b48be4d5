"""Fixtures of the training tests: a model in the authors' release layout to train from."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.data import REPO, condition_pairs, load_script, write_jsonl

RELEASE_FIXTURES = REPO / "tests" / "fixtures" / "release" / "make_release_fixtures.py"


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model in the authors' release layout (``query_encoder/`` + ``doc_encoder/``, BERT + Qwen3 1024 wide)."""
    make = load_script(RELEASE_FIXTURES, "make_release_fixtures")
    return make.build_release_fixture("bert", tmp_path_factory.mktemp("release") / "care")


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Torch on one thread for a module: tiny models train faster on one, and the CI machine is shared."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def condition_pairs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder whose ``pairs.jsonl`` holds 16 condition pairs (8 conditions, 2 questions each)."""
    folder = tmp_path_factory.mktemp("condition-pairs")
    write_jsonl(folder / "pairs.jsonl", condition_pairs(conditions=8, aspects=2))
    return folder
