"""CARE training: independent initialisation, Stage I query alignment, Stage II joint fine-tuning.

Entry points: :func:`load_recipe` + :func:`run_recipe` (``care-retriever train``), the data builders
(``care-retriever data``) in :mod:`.diversify`, :mod:`.hard_negatives`, :mod:`.alignment` and
:mod:`.labelling`, and the offline quickstart in :mod:`.quickstart`. Heavy libraries are imported
inside functions, so importing this package is cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_recipe", "parse_recipe", "require", "run_recipe"]


def __getattr__(name: str) -> Any:
    if name in ("load_recipe", "parse_recipe"):
        from care_retriever.training import recipe

        return getattr(recipe, name)
    if name == "run_recipe":
        from care_retriever.training.runner import run_recipe

        return run_recipe
    raise AttributeError(name)


def require(*modules: str, extra: str = "train") -> None:
    """Fail with one line naming the extra to install when an optional dependency is missing."""
    import importlib.util

    from care_retriever.errors import CareError

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise CareError(f"missing optional dependencies {missing}: pip install 'care-retriever[{extra}]'")
