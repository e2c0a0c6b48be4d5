"""The space fingerprint: which document embedding space a store's vectors live in.

A store records the fingerprint of the model that wrote it and refuses searches from another one.
The space is set by two things: the document tower's weights (:func:`weights_fingerprint`, what a
saved model keeps in ``care_config.json``) and the text the tower reads for a document
(:func:`care_retriever.documents.document_text`). :func:`space_fingerprint` combines them. The rule of
format 1 (``title\\ntext``) adds nothing, so every store and model written so far keeps its value; any
other rule gives every model a new fingerprint, and indexes built under the old rule then refuse
searches ("built with another model") instead of silently returning wrong neighbours.

The query side (tower, prompt) is not part of it on purpose: a Stage-I update of the query tower, or
another instruction, searches the same document vectors.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import care_retriever.documents as documents

# (title, text) pairs run through the document-text rule, and what the format-1 rule gives for them.
_RULE_PROBES = (("标题 title", "正文 text"), ("", "正文 text"), ("标题 title", ""))
_FORMAT_1_RULE = ("标题 title\n正文 text", "正文 text", "标题 title\n")


def weights_fingerprint(modules: Sequence[Any], dim: int) -> str:
    """Hash of the embedding width and the weights of ``modules`` (torch modules), key by key."""
    import torch

    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"dim={dim};".encode())
    for module in modules:
        for key, tensor in sorted(module.state_dict().items()):
            digest.update(key.encode())
            digest.update(tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def document_text_rule() -> tuple[str, ...]:
    """What the current document-text rule makes of the probe documents (a rule change changes this)."""
    return tuple(documents.document_text(title, text) for title, text in _RULE_PROBES)


def space_fingerprint(
    weights: str, document_prompt: str | None = None, document_convention: dict[str, Any] | None = None
) -> str:
    """The fingerprint of the space a model with weights fingerprint ``weights`` embeds documents into.

    ``document_prompt``: the text a pretrained document tower declares before every document (none for
    Qwen3-Embedding and CARE's own towers, so their fingerprints are unchanged); it is part of the space.
    ``document_convention``: how the document tower turns text into a vector beyond its weights, where the
    model records it (the token ids its tokenizer appends, normalisation before the Matryoshka cut, the
    max length): two towers with the same weights and another end token or normalisation embed into
    different spaces. Models saved before these were recorded pass None and keep their fingerprint.
    """
    rule = document_text_rule()
    convention = {k: v for k, v in (document_convention or {}).items() if v is not None}
    if rule == _FORMAT_1_RULE and not document_prompt and not convention:
        return weights
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{weights};document_text={json.dumps(rule, ensure_ascii=False)}".encode())
    if document_prompt:
        digest.update(f";document_prompt={json.dumps(document_prompt, ensure_ascii=False)}".encode())
    if convention:
        digest.update(f";convention={json.dumps(convention, sort_keys=True, ensure_ascii=False)}".encode())
    return digest.hexdigest()
