"""Fixtures of the LangChain integration tests."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def tower_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ``load`` (query / document / both) of every CARE model load from here on, the model loaded as usual."""
    from care_retriever.model.embedder import AsymmetricEmbedder

    loads: list[str] = []
    real = AsymmetricEmbedder.from_pretrained.__func__  # type: ignore[attr-defined]

    def recording(cls: type, model: Any, load: str = "both", **kwargs: Any) -> Any:
        loads.append(load)
        return real(cls, model, load, **kwargs)

    monkeypatch.setattr(AsymmetricEmbedder, "from_pretrained", classmethod(recording))
    return loads
