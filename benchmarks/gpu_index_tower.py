"""The tower and the machine of ``benchmarks.gpu_index``: the random document tower it builds (no hub), the forward
FLOPs of a token through it, a dense matmul's FLOP/s (the MFU's denominator) and the peak memory of what runs."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

# Qwen3-4B's decoder (config.json of Qwen/Qwen3-4B): what a GPU run builds at random
QWEN3_4B = {
    "hidden_size": 2560,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 9728,
}


def build_embedder(device: str, vocab: list[Path], tower: str) -> Any:
    """A CARE model with random weights on ``device``: ``qwen3-4b`` (real size) or ``tiny``."""
    from care_retriever.model.scratch import init_from_scratch

    if tower == "qwen3-4b":
        return init_from_scratch("base", vocab, device=device, document_config=QWEN3_4B)
    return init_from_scratch("tiny", vocab, device=device)


def _heads(config: Any) -> tuple[int, int, int]:
    heads, kv = config.num_attention_heads, getattr(config, "num_key_value_heads", config.num_attention_heads)
    return heads, kv, getattr(config, "head_dim", None) or config.hidden_size // heads


def linear_flops_per_token(config: Any) -> float:
    """Forward FLOPs of one token through a decoder's Linear layers: 2 x the weights it multiplies (embeddings
    excluded)."""
    hidden, inter = config.hidden_size, config.intermediate_size
    heads, kv, head_dim = _heads(config)
    per_layer = hidden * heads * head_dim + 2 * hidden * kv * head_dim + heads * head_dim * hidden + 3 * hidden * inter
    return config.num_hidden_layers * 2 * per_layer


def flops_per_token(config: Any, mean_tokens: float) -> float:
    """Forward FLOPs of one token through a decoder: its Linear layers' (:func:`linear_flops_per_token`) plus the
    attention scores and values over a sequence of ``mean_tokens``."""
    heads, _kv, head_dim = _heads(config)
    attention = 2 * heads * head_dim * mean_tokens  # QK^T and AV, causal: half of 2 x 2 x heads x dim x length
    return linear_flops_per_token(config) + config.num_hidden_layers * 2 * attention


def matmul_peak(device: str, dtype: Any) -> float:
    """FLOP/s of a large dense matmul on ``device`` in ``dtype`` (the best of a few)."""
    import torch

    n = 8192 if device.startswith("cuda") else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(5):
        sync(device)
        start = time.perf_counter()
        for _ in range(4):
            a @ b
        sync(device)
        best = min(best, (time.perf_counter() - start) / 4)
    return 2 * n**3 / best


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


class PeakMemory:
    """Peak memory of what runs inside: torch's allocated bytes on CUDA, resident set growth on the CPU."""

    def __init__(self, device: str) -> None:
        self.device, self.peak = device, 0

    def __enter__(self) -> PeakMemory:
        import torch

        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
        else:
            import psutil  # type: ignore[import-untyped]

            self._proc = psutil.Process()
            self._base = self._proc.memory_info().rss
            self._stop = threading.Event()
            self._top = self._base
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self._top = max(self._top, self._proc.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        import torch

        if self.device.startswith("cuda"):
            self.peak = torch.cuda.max_memory_allocated() - self._base
        else:
            self._stop.set()
            self._thread.join()
            self.peak = max(self._top, self._proc.memory_info().rss) - self._base
