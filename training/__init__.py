"""CARE training: independent initialisation, Stage I query alignment, Stage II joint fine-tuning.

Entry points: :func:`load_recipe` + :func:`run_recipe` (``care-retriever train``), the data builders
(``care-retriever data``) in :mod:`.diversify`, :mod:`.hard_negatives`, :mod:`.alignment` and
:mod:`.labelling`, and the offline quickstart in :mod:`.quickstart`. Heavy libraries are imported
inside functions, so importing this package is cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_recipe", "parse_recipe", "run_recipe"]


def __getattr__(name: str) -> Any:
    if name in ("load_recipe", "parse_recipe"):
        from care_retriever.training import recipe

        return getattr(recipe, name)
    if name == "run_recipe":
        from care_retriever.training.runner import run_recipe

        return run_recipe
    raise AttributeError(name)
