"""Which run a bulk write belongs to: :class:`RunTag`, recorded with a staged write and compared by the next one.

A store that stages a bulk write before publishing it (FAISS) keeps the tag of the run that made the staging copy
beside it. Another command neither publishes nor silently adopts that copy: it resumes it only when its own tag is
the same (the same command, corpus, model and store settings run again), and otherwise says in one line what is
pending and how to finish or discard it. A store that publishes each write as it is made (Qdrant) has nothing
pending, and ignores the tag. What a stopped run leaves in a store, for its error line, the store says itself
(:meth:`WriteRuns.left_behind <care_retriever.stores.capabilities.WriteRuns.left_behind>`): this module is the tag
alone, which the store's contract names.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

# The command of a write made by a program (the store's API, an integration) that names no run.
PROGRAM = "write"


@dataclass(frozen=True)
class RunTag:
    """What a bulk write is: its command, the corpus it reads (resolved path; None: documents a program hands in),
    the model whose vectors it writes, and the options that decide what is written (store settings, BM25 side,
    pruning). Two runs are the same when every field is equal, with one exception: documents that a program
    hands in (no corpus named: the store's API, the index writer without ``source``) carry no identity but
    their model, so a program's writes of one model resume each other as they always have; a command names its
    corpus and never adopts a program's run, nor a program a command's."""

    command: str = PROGRAM
    corpus: str | None = None
    space_fingerprint: str = ""
    model_name: str = ""
    options: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-normal dict (tuples as lists, keys sorted): what is written and what is compared."""
        data: dict[str, Any] = json.loads(json.dumps(asdict(self), sort_keys=True, default=str))
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunTag:
        known = {name: data[name] for name in ("command", "corpus", "space_fingerprint", "model_name") if name in data}
        options = data.get("options")
        return cls(**known, options=options if isinstance(options, dict) else {})

    def same_run(self, other: RunTag | None) -> bool:
        return other is not None and self._key() == other._key()

    def _key(self) -> dict[str, Any]:
        if self.corpus is None and self.command in (PROGRAM, "index"):  # a program's write: its model alone
            return {"command": PROGRAM, "space_fingerprint": self.space_fingerprint}
        return self.to_dict()

    def describe(self) -> str:
        """``index`` of corpus X (model M), for the one line that names a pending run."""
        source = f" of {self.corpus}" if self.corpus else " (documents from a program)"
        model = f", model {self.model_name}" if self.model_name else ""
        return f"`{self.command}`{source}{model}"

    def difference(self, pending: RunTag | None) -> str:
        """Why this run is not ``pending``, in words: another run, or the same command and corpus with other
        settings (which ones, and what the pending run asked), so that the two never read alike."""
        mine = f"this is {self.describe()}"
        if pending is None or (self.command, self.corpus, self.space_fingerprint) != (
            pending.command,
            pending.corpus,
            pending.space_fingerprint,
        ):
            return f"{mine}, another run"
        ours, theirs = _leaves(self.to_dict()["options"]), _leaves(pending.to_dict()["options"])
        differ = [
            f"{key} {ours.get(key)} (the pending run's: {theirs.get(key)})"
            for key in sorted(ours.keys() | theirs.keys())
            if ours.get(key) != theirs.get(key)
        ]
        return f"{mine} with other settings: {', '.join(differ[:3]) or 'its options'}"


def _leaves(options: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested options dict as dotted keys (``index.index_type``) to its values."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if isinstance(value, dict):
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
