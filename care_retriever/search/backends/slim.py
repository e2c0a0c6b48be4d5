"""The slim (torch-free) install: print the requirements that search and serve an exported model.

``pip install care-retriever`` is the full product (torch, transformers, sentence-transformers). A
search/serve host that only runs an exported query tower (``care-retriever export``) needs none of
them; packaging has no way for an extra to *remove* base dependencies (default extras, PEP 771, are
not in pip yet), so the slim install is two steps, the second reading the ``serve-slim`` extra from
the installed package's own metadata (one list: pyproject.toml's extra)::

    pip install --no-deps care-retriever
    pip install $(python -m care_retriever.search.backends.slim)

Standard library only: it runs before any dependency is installed.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, requires

DISTRIBUTION = "care-retriever"
SLIM_EXTRA = "serve-slim"
# Base dependencies a slim install leaves out: commands that need them (train, index, eval, export,
# search --backend torch) say so in one line instead of a traceback.
FULL_ONLY = {  # import name -> distribution name
    "torch": "torch",
    "transformers": "transformers",
    "sentence_transformers": "sentence-transformers",
    "safetensors": "safetensors",
    "peft": "peft",
    "jieba": "jieba",  # the BM25 side: --mode sparse|hybrid
    "yaml": "pyyaml",
}
TORCH_STACK = frozenset({"torch", "transformers", "sentence_transformers", "safetensors", "peft"})
_EXTRA_MARKER = re.compile(r"""^(?P<req>[^;]+?)\s*;\s*extra\s*==\s*["'](?P<extra>[^"']+)["']\s*$""")


def slim_requirements(distribution: str = DISTRIBUTION) -> list[str]:
    """The requirement strings of the ``serve-slim`` extra, as the installed metadata lists them."""
    try:
        listed = requires(distribution) or []
    except PackageNotFoundError as exc:
        raise SystemExit(f"error: {distribution} is not installed (pip install --no-deps {distribution})") from exc
    out = []
    for line in listed:
        match = _EXTRA_MARKER.match(line)
        if match and match["extra"] == SLIM_EXTRA:
            out.append(match["req"].replace(" ", ""))
    if not out:
        raise SystemExit(f"error: the installed {distribution} has no {SLIM_EXTRA!r} extra")
    return out


def missing_full_dependency(exc: ModuleNotFoundError, argv: list[str]) -> str | None:
    """The one-line error for a command run on a slim install without one of its dependencies, else None."""
    root = (exc.name or "").split(".")[0]
    if root not in FULL_ONLY:
        return None
    command = next((a for a in argv if not a.startswith("-")), "this command")
    needed = FULL_ONLY[root]
    fix = f"pip install {DISTRIBUTION}" if root in TORCH_STACK else f"pip install {needed} (or the full {DISTRIBUTION})"
    return (
        f"`care-retriever {command}` needs {needed}, which this slim install leaves out (it searches and "
        f"serves an exported model, --backend onnx); install it: {fix}"
    )


def main() -> int:
    print(" ".join(slim_requirements()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
