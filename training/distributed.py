"""Several processes (torchrun): the process group with the recipe's timeout, and work split over ranks.

The process group is created once per process and its timeout is fixed then: the first
``PartialState()`` to run creates it, and the trainer's later ``ddp_timeout`` is ignored. So the run
creates it itself, first thing, with the recipe's ``defaults.ddp_timeout`` (seconds; default the
trainer's own default, 1800 s), and reads back from torch the timeout in force.

Encoding work (the Stage I teacher cache, hard-negative mining) is split over the ranks: rank r takes
rows ``order[r::world]`` and writes them to a part file in the run folder (every rank sees the run folder:
the stages already load each other's saved models from it); after a barrier the parts are assembled.
A barrier waits for the slowest rank's share, not for one rank doing everyone's work.
"""

from __future__ import annotations

import contextlib
import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

logger = logging.getLogger("care_retriever")


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def default_timeout_seconds() -> float:
    """The trainer's default ``ddp_timeout`` (transformers' ``TrainingArguments``): one number for both."""
    from transformers import TrainingArguments

    default = TrainingArguments.__dataclass_fields__["ddp_timeout"].default
    assert isinstance(default, (int, float))  # a field with a plain default (not a default_factory)
    return float(default)


def recipe_timeout_seconds(defaults: dict[str, Any]) -> float:
    """The recipe's ``defaults.ddp_timeout`` (seconds), else the trainer's default."""
    from care_retriever.errors import InputError

    value = defaults.get("ddp_timeout", default_timeout_seconds())
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if seconds <= 0:
        raise InputError(f"defaults.ddp_timeout must be a positive number of seconds, got {value!r}")
    return seconds


def start_process_group(timeout_seconds: float) -> float | None:
    """Create the process group (under torchrun) with ``timeout_seconds``; return the timeout in force.

    None when one process trains outside a launcher. A single process started by torchrun (or
    accelerate: ``LOCAL_RANK`` is set) gets a group too, as the trainer would create it (gloo on CPU),
    so it is created here with the recipe's timeout, not the trainer's 1800 s. A group created earlier
    in this process keeps its timeout (torch cannot change it), which is then what is returned.
    """
    if world_size() <= 1 and "LOCAL_RANK" not in os.environ:
        return None
    import torch
    from accelerate import PartialState

    # accelerate's shared state: the trainer's TrainingArguments later finds the group initialised
    # and keeps it; on CPU it is created as the trainer creates it (gloo).
    PartialState(cpu=not torch.cuda.is_available(), timeout=timedelta(seconds=timeout_seconds))
    return process_group_timeout()


def process_group_timeout() -> float | None:
    """The timeout (seconds) of the default process group, as torch holds it; None without one."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    try:  # torch keeps it in the backend's options (no public accessor): read defensively
        group = dist.distributed_c10d._get_default_group()
        device = torch.device("cuda") if "nccl" in str(dist.get_backend()) else torch.device("cpu")
        return float(group._get_backend(device).options._timeout.total_seconds())
    except (AttributeError, RuntimeError) as exc:
        logger.warning("could not read the process group's timeout back from torch (%s)", exc)
        return None


def barrier() -> None:
    if world_size() > 1:
        from care_retriever.training.engine import wait_for_everyone

        wait_for_everyone()


def my_share(order: np.ndarray) -> np.ndarray:
    """This rank's rows of ``order``: every ``world``-th, so length-sorted work is balanced."""
    return order[rank() :: world_size()]


def part_path(folder: Path, name: str, r: int) -> Path:
    return folder / f".{name}.part{r}-of-{world_size()}.f32"


class PartWriter:
    """This rank's rows, written straight to disk (memory stays flat) under a temporary name and renamed
    when complete (a killed rank leaves no part that looks finished)."""

    def __init__(self, folder: Path, name: str, rows: int, dim: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.target = part_path(folder, name, rank())
        self.tmp = self.target.with_name(f"{self.target.name}.{os.getpid()}.tmp")
        self.rows = np.memmap(self.tmp, dtype=np.float32, mode="w+", shape=(rows, dim)) if rows else None

    def close(self) -> None:
        if self.rows is None:
            self.tmp.write_bytes(b"")  # a rank with no rows still reports in
        else:
            self.rows.flush()
            self.rows = None
        os.replace(self.tmp, self.target)


def write_part(folder: Path, name: str, rows: np.ndarray) -> None:
    writer = PartWriter(folder, name, len(rows), rows.shape[1])
    if writer.rows is not None:
        writer.rows[:] = rows
    writer.close()


ArrayT = TypeVar("ArrayT", bound=np.ndarray)


def read_parts(folder: Path, name: str, order: np.ndarray, out: ArrayT, chunk: int = 4096) -> ArrayT:
    """Fill ``out[order[r::world]]`` with rank r's part, for every rank, a chunk of rows at a time."""
    dim = out.shape[1]
    for r in range(world_size()):
        idx = order[r :: world_size()]
        if not len(idx):
            continue
        part = np.memmap(part_path(folder, name, r), dtype=np.float32, mode="r", shape=(len(idx), dim))
        for start in range(0, len(idx), chunk):
            out[idx[start : start + chunk]] = part[start : start + chunk]
        del part
    return out


def remove_parts(folder: Path, name: str) -> None:
    for r in range(world_size()):
        part_path(folder, name, r).unlink(missing_ok=True)


def gather_rows(folder: Path, name: str, order: np.ndarray, rows: np.ndarray, dim: int) -> np.ndarray:
    """Every rank's ``rows`` (its share of ``order``) assembled into one array on every rank."""
    if world_size() == 1:
        out = np.empty((len(order), dim), dtype=np.float32)
        out[order] = rows
        return out
    write_part(folder, name, rows)
    barrier()
    out = read_parts(folder, name, order, np.empty((len(order), dim), dtype=np.float32))
    barrier()  # every rank has read every part
    if rank() == 0:
        remove_parts(folder, name)
        with contextlib.suppress(OSError):  # not empty: something else lives there
            folder.rmdir()  # nothing is left behind in the run folder
    return out


def gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (small objects: mined indices, counts)."""
    if world_size() == 1:
        return [obj]
    import torch.distributed as dist

    gathered: list[Any] = [None] * world_size()
    dist.all_gather_object(gathered, obj)
    return gathered
