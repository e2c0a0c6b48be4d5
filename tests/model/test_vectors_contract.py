"""What a model's vectors are (care_retriever.vectors): one definition, read from a model's config and from a
store's manifest, and what ``verify`` checks a store's norms against."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from care_retriever.errors import InputError, StoreError
from care_retriever.indexing.corpus import Document
from care_retriever.model.config import CareConfig, TowerInfo
from care_retriever.model.towers import release
from care_retriever.vectors import VectorContract


def test_this_packages_models_are_unit_norm_cosine_and_the_release_convention_is_dot() -> None:
    own = CareConfig("asymmetric", 8, TowerInfo("cls", 8), TowerInfo("mean", 8))
    assert own.vectors == VectorContract("cosine", "after_truncation") and own.vectors.unit_norm
    authors = CareConfig(
        "asymmetric", 8, TowerInfo("cls", 8), TowerInfo("last_token", 16), **release.authors_conventions()
    )
    assert authors.vectors == VectorContract("dot", "before_truncation")
    assert not authors.vectors.unit_norm and authors.vectors.norm_range == (0.0, 1.0)
    assert VectorContract.for_metric("dot") == authors.vectors and VectorContract.for_metric("cosine") == own.vectors
    with pytest.raises(InputError, match="Unknown metric"):
        VectorContract.for_metric("l2")


def test_prepare_normalises_for_cosine_and_keeps_dot_product_vectors_as_given() -> None:
    cut = np.array([[0.6, 0.2, 0.0], [0.0, 0.0, 0.0]], dtype=np.float32)  # a cut vector (norm < 1) and a zero row
    np.testing.assert_array_equal(VectorContract.for_metric("dot").prepare(cut), cut)
    unit = VectorContract.for_metric("cosine").prepare(cut)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), [1.0, 0.0], atol=1e-6)


def test_bad_norms_are_what_the_model_does_not_promise() -> None:
    norms = np.array([1.0, 0.86, 0.0, 1.2])
    assert VectorContract.for_metric("cosine").bad_norms(norms).tolist() == [False, True, False, True]
    assert VectorContract.for_metric("dot").bad_norms(norms).tolist() == [False, False, False, True]


@pytest.mark.parametrize(
    ("metric", "norm", "sound"), [("dot", 0.86, True), ("dot", 1.3, False), ("cosine", 0.86, False)]
)
def test_verify_checks_the_norms_the_stores_model_promises(
    tmp_path: Path, metric: str, norm: float, sound: bool
) -> None:
    """A store of a dot-product model (the authors' released models) holds cut vectors (norms below 1): sound.
    Norms its model cannot give (above 1; or below 1 in a cosine store) are corruption."""
    from care_retriever.stores.faiss import FaissStore

    store = FaissStore(tmp_path / "store")
    vectors = np.zeros((2, 4), dtype=np.float32)
    vectors[:, 0] = norm
    with store.transaction(4, "fp", "m", metric=metric) as open_store:
        open_store.upsert([Document("a", "一"), Document("b", "二")], vectors)
    if sound:
        assert store.verify() == 2
    else:
        with pytest.raises(StoreError, match=f"not .* as its {metric} model's are"):
            store.verify()
    store.close()
