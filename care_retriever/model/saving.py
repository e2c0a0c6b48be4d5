"""The one writer of a saved CARE model folder, for :meth:`AsymmetricEmbedder.save_pretrained
<care_retriever.model.embedder.AsymmetricEmbedder.save_pretrained>` and for training's stage saves.

What a save writes: sentence-transformers' folder layout (a ``Router`` over both towers, then ``Normalize`` where the
towers do not normalise themselves), its model card, the towers' shipped model code beside ``modules.json``
(:func:`~care_retriever.model.towers.modules.lift_model_code`) and ``care_config.json`` (the config with the
document weights' fingerprint). It is written to a temporary folder renamed into place, so a failure leaves the
folder as it was; a full disk says in one line how much free space the model needs (:class:`DiskFullError`), any
other fault of the file system is a one-line :class:`~care_retriever.errors.WriteError`
(:mod:`care_retriever.faults`). A model is read through :class:`~care_retriever.model.protocols.SavableModel`,
so this writer does not import the embedder whose ``save_pretrained`` calls it.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch
from sentence_transformers import SentenceTransformer

from care_retriever.errors import DiskFullError
from care_retriever.faults import free_bytes, human, reason_of, write_error
from care_retriever.model.config import CONFIG_NAME
from care_retriever.model.protocols import SavableModel
from care_retriever.model.tower import Side
from care_retriever.model.towers.loading import replace_folder
from care_retriever.model.towers.modules import lift_model_code

logger = logging.getLogger("care_retriever")
SIDES: tuple[Side, ...] = ("query", "document")


def save_model(
    embedder: SavableModel,
    path: str | os.PathLike[str],
    *,
    dtypes: Mapping[Side, torch.dtype] | None = None,
    rehash: bool = True,
    write: bool = True,
    intact: str | None = None,
    retry: str = "free space, then save again",
) -> Path:
    """Write ``embedder`` to ``path`` atomically (a temporary folder renamed into place); returns ``path``.

    ``dtypes``: each tower written in this dtype (a bf16-pretrained tower in bf16); the towers are rounded to it in
    memory as well and cast back to the dtype they are held in, so the model in memory is the one on disk and the
    fingerprint hashes the weights that were written. None: each tower as it is held. ``rehash``: the document
    weights hashed again (a tower trained in place since it was hashed); False keeps a fingerprint already known
    (a training stage that left the document tower as it was). ``write=False``: the rounding and the fingerprint
    only, what the ranks of a distributed run that do not write do (they must hold what rank 0 wrote).
    ``intact``: what a failure's line says is left as it was; ``retry``: what a full disk's line says to do.
    """
    target = Path(path)
    intact = intact or f"any model at {target} is as it was"
    sides = [s for s in SIDES if s in embedder.loaded_towers]
    same_tower = embedder.query_modules is embedder.document_modules
    held = (
        {side: cast_tower(embedder, side, dtypes[side]) for side in sides[: 1 if same_tower else 2]} if dtypes else {}
    )
    tmp: Path | None = None
    try:
        st = embedder.to_sentence_transformer() if write else None  # both towers, or one line before any write
        config = embedder.saved_config(rehash=rehash)
        if st is None:
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        write_model(st, tmp)
        for side, dtype in held.items():  # back in the dtypes it runs in: the card's example encodes
            cast_tower(embedder, side, dtype)
        held = {}
        write_card(st, tmp)
        lift_model_code(tmp)
        (tmp / CONFIG_NAME).write_text(config.to_json(), encoding="utf-8")
        replace_folder(tmp, target)
        tmp = None
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            # an I/O error, permission denied, a read-only file system: one line, what was there intact
            reason = reason_of(exc)
            if reason is None:
                raise
            raise write_error(target, "the model", exc, reason, intact) from exc
        need = model_bytes(embedder, dtypes)
        if tmp is not None:  # its space freed before the free space is measured
            shutil.rmtree(tmp, ignore_errors=True)
            tmp = None
        free = free_bytes(target.parent)
        raise DiskFullError(
            f"{target}: no space left on the device while saving the model; it needs about {human(need)} "
            f"free on {target.parent} ({human(free)} free now); {intact}: {retry}",
            path=target,
            reason="the disk is full",
        ) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for side, dtype in held.items():
            cast_tower(embedder, side, dtype)
    return target


def cast_tower(embedder: SavableModel, side: Side, dtype: torch.dtype) -> torch.dtype:
    """Cast one tower's transformer to ``dtype`` in place; returns the dtype it was held in."""
    model: torch.nn.Module = embedder.tower(side).transformer.auto_model  # as a module: .to(dtype)
    held = next(model.parameters()).dtype
    if held != dtype:
        model.to(dtype)
    return held


def write_model(st: SentenceTransformer, folder: Path) -> None:
    """The write of a model's files (sentence-transformers' folder layout, its card written after the
    towers are cast back: its usage example runs the model); a test makes it fail."""
    st.save(str(folder), create_model_card=False)


def write_card(st: SentenceTransformer, folder: Path) -> None:
    """sentence-transformers' README.md for the model (what ``st.save`` writes); a card that cannot be
    generated is skipped with a log line, as ``st.save`` skips it."""
    from sentence_transformers.base.model_card import generate_model_card

    try:
        card = generate_model_card(st)
    except Exception as exc:  # a model card is never worth failing a save
        logger.warning("model card of %s not written: %s", folder.name, exc)
        return
    (folder / "README.md").write_text(card, encoding="utf-8")


def model_bytes(embedder: SavableModel, dtypes: Mapping[Side, torch.dtype] | None = None) -> int:
    """Bytes a saved model's weights take in ``dtypes`` (None: the dtypes they are held in; a shared tower
    counted once)."""
    total = 0
    seen: set[int] = set()
    for side in SIDES:
        for module in embedder.tower(side).modules if side in embedder.loaded_towers else []:
            for param in module.parameters():
                if id(param) not in seen:
                    seen.add(id(param))
                    total += param.numel() * (dtypes[side] if dtypes else param.dtype).itemsize
    return total
