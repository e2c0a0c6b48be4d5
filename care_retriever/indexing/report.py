"""What one write of the index writer did: documents added, updated, unchanged and deleted, its seconds, and the
tokens its forward passes computed (``index --json`` reports it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["WriteReport"]


@dataclass
class WriteReport:
    store: str
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0
    count: int = 0
    seconds: float = 0.0
    truncated: int = 0
    tokens: int = 0  # the encoded documents' tokens (prompt and special tokens included)
    padded_tokens: int = 0  # what the forward passes computed: with the padding of each batch

    @property
    def encoded(self) -> int:
        return self.added + self.updated

    @property
    def docs_per_second(self) -> float:
        return self.encoded / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def padding_ratio(self) -> float:
        """Padded tokens per real token (1.0: no padding)."""
        return self.padded_tokens / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "docs_per_second": round(self.docs_per_second, 2),
            "tokens_per_second": round(self.tokens_per_second, 1),
            "padding_ratio": round(self.padding_ratio, 4),
        }
