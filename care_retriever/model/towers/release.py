"""The authors' release layout: ``query_encoder/`` + ``doc_encoder/``, read the way the authors' code reads it.

The paper's authors publish their trained models (``PhilipGAQ/CARE-0.3B-4B``, ``PhilipGAQ/CARE-0.3B-8B``) as
their trainer saves them: two transformers ``save_pretrained`` folders side by side, a gte-multilingual-base
query tower and a Qwen3 document tower. Their inference code (``inference/asymmetric.py`` of the public
repository PhilipGAQ/CARE) fixes what a vector is; this module records those facts as data, it copies no code:

- queries: ``<instruct>{instruction}\\n<query>{text}``, an instruction per task (:data:`AUTHORS_INSTRUCTIONS`),
  the query tower's own tokenizer, [CLS] pooling;
- documents: no instruction; the tokenizer appends nothing (their slow ``Qwen2Tokenizer`` ignores
  ``add_eos_token``), last-token pooling over left padding, so the last text token is pooled;
- both: max length 512, L2-normalised at full width, then the first 768 dimensions kept as they are (document
  vectors have norms below 1), scores are dot products.

The query tower is saved in gte's original ``new`` format, whose model code lives in another hub repository
(``Alibaba-NLP/new-impl``) and no longer runs under transformers 5. transformers 5 reads the architecture
natively as ``GteModel`` (its weight conversion maps the ``new`` names); :func:`gte_config_from_new` carries
the ``new`` config over, NTK rope scaling included, or refuses it in one line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from care_retriever.errors import ModelError
from care_retriever.model.towers.loading import local_model_dir, offline
from care_retriever.model.towers.prompts import TASK_INSTRUCTIONS

logger = logging.getLogger("care_retriever")

QUERY_FOLDER = "query_encoder"
DOCUMENT_FOLDER = "doc_encoder"
CONVENTION = "authors-release"

# The authors' query format (a prompt put before the text) and their instruction table, by this package's
# task types. Facts of their published code, needed to give the vectors their models were trained with.
AUTHORS_QUERY_TEMPLATE = "<instruct>{instruction}\n<query>"
AUTHORS_INSTRUCTIONS: dict[str, str] = TASK_INSTRUCTIONS  # their table is the paper's Table 8 (prompts.py)
AUTHORS_MAX_LENGTH = 512
AUTHORS_DIM = 768

# Tokenizer and config files a tower folder may hold besides its weights.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@dataclass(frozen=True)
class ReleaseLayout:
    """A model in the authors' layout: where its two towers are (local folders), and where it came from."""

    source: str
    query: Path
    document: Path

    @property
    def root(self) -> Path:
        return self.query.parent


def find_release(name: str, *, need: tuple[str, ...] = ("query", "document")) -> ReleaseLayout | None:
    """The release layout at ``name`` (a folder or hub id), or None where ``name`` is not one.

    A folder holding only one of the two tower folders is an error naming the missing one. A hub id is
    looked up only for the tower folders in ``need`` (a search process downloads the query tower only);
    offline (``HF_HUB_OFFLINE=1``) it reads the hub cache.
    """
    local = local_model_dir(name)
    if local is not None:
        return _local_release(local, name)
    return _hub_release(name, need)


def _local_release(folder: Path, name: str) -> ReleaseLayout | None:
    has_query = (folder / QUERY_FOLDER).is_dir()
    has_document = (folder / DOCUMENT_FOLDER).is_dir()
    if not (has_query or has_document):
        return None
    if not (has_query and has_document):
        missing = DOCUMENT_FOLDER if has_query else QUERY_FOLDER
        raise ModelError(
            f"{name}: has {QUERY_FOLDER if has_query else DOCUMENT_FOLDER}/ but no {missing}/; a model in the "
            f"authors' layout holds both {QUERY_FOLDER}/ and {DOCUMENT_FOLDER}/"
        )
    return ReleaseLayout(name, folder / QUERY_FOLDER, folder / DOCUMENT_FOLDER)


def _hub_release(name: str, need: tuple[str, ...]) -> ReleaseLayout | None:
    try:
        from huggingface_hub import list_repo_files, snapshot_download
    except ImportError:  # pragma: no cover - a dependency of transformers
        return None
    if offline():
        try:
            root = Path(snapshot_download(name, local_files_only=True, allow_patterns=["*/config.json"]))
        except Exception:  # not in the cache: not a release this process can read
            return None
        files = [str(p.relative_to(root)) for p in root.rglob("config.json")]
    else:
        try:
            files = list_repo_files(name)
        except Exception:  # not a hub repository (or unreachable): the caller's own lookup says why
            return None
    tops = {f.split("/", 1)[0] for f in files if "/" in f}
    if QUERY_FOLDER not in tops and DOCUMENT_FOLDER not in tops:
        return None
    if QUERY_FOLDER not in tops or DOCUMENT_FOLDER not in tops:
        missing = DOCUMENT_FOLDER if QUERY_FOLDER in tops else QUERY_FOLDER
        raise ModelError(f"{name}: the hub repository has no {missing}/; the authors' layout holds both towers")
    folders = [QUERY_FOLDER if side == "query" else DOCUMENT_FOLDER for side in need]
    try:
        root = Path(
            snapshot_download(
                name, allow_patterns=[f"{f}/*" for f in folders] + ["README.md", "LICENSE*"], local_files_only=offline()
            )
        )
    except Exception as exc:
        raise ModelError(f"cannot download {name}: {str(exc).splitlines()[0]}") from exc
    return ReleaseLayout(name, root / QUERY_FOLDER, root / DOCUMENT_FOLDER)


# ---------------------------------------------------------------------- checks on the two folders
def check_document_folder(folder: Path, source: str) -> None:
    """A document tower saved as a LoRA adapter only cannot be read alone: say what to pass instead."""
    adapter = folder / "adapter_config.json"
    has_weights = any(p.suffix in _WEIGHT_SUFFIXES and not p.name.startswith("adapter_") for p in folder.iterdir())
    if adapter.is_file() and not has_weights:
        base = json.loads(adapter.read_text("utf-8")).get("base_model_name_or_path") or "BASE_MODEL"
        raise ModelError(
            f"{source}: {DOCUMENT_FOLDER}/ is a LoRA adapter without its base model; pass the base and the adapter: "
            f"care-retriever init OUT --query-model {folder.parent / QUERY_FOLDER} --document-model {base} "
            f"--document-adapter {folder} --convention {CONVENTION}"
        )
    if not (folder / "config.json").is_file():
        raise ModelError(f"{source}: {DOCUMENT_FOLDER}/ has no config.json; not a transformers model folder")


# ---------------------------------------------------------------------- gte's "new" format
_NEW_TO_GTE = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "pad_token_id",
)


def gte_config_from_new(config: dict[str, Any], source: str) -> dict[str, Any]:
    """transformers' ``GteConfig`` for a checkpoint saved in gte's ``new`` format; one-line error where it differs.

    Rope: the ``new`` code's ``ntk`` scaling is static (applied at every length): frequencies
    ``(theta * f) ** (-2i / d) / f ** (2 / d)`` for head width ``d``. That is transformers' ``linear`` rope with
    ``rope_theta = theta * f`` and ``factor = f ** (2 / d)``; ``mixed_b`` (a per-frequency factor) has no
    transformers counterpart and is refused.
    """

    def refuse(what: str) -> ModelError:
        return ModelError(
            f"{source}: its gte 'new' model code cannot run under this transformers and {what}, which "
            "transformers' native GteModel does not implement; this query tower cannot be read here"
        )

    if config.get("position_embedding_type", "rope") != "rope":
        raise refuse(f"it uses position_embedding_type {config.get('position_embedding_type')!r}")
    if config.get("layer_norm_type", "layer_norm") != "layer_norm":
        raise refuse(f"it uses layer_norm_type {config.get('layer_norm_type')!r}")
    if config.get("logn_attention_scale"):
        raise refuse("it uses logn_attention_scale")
    head_dim = int(config["hidden_size"]) // int(config["num_attention_heads"])
    theta = float(config.get("rope_theta", 10000.0))
    scaling = config.get("rope_scaling")
    if scaling:
        kind = scaling.get("type") or scaling.get("rope_type")
        if kind != "ntk" or scaling.get("mixed_b") is not None:
            raise refuse(f"it uses rope scaling {scaling!r}")
        factor = float(scaling["factor"])
        rope: dict[str, Any] = {"rope_type": "linear", "rope_theta": theta * factor, "factor": factor ** (2 / head_dim)}
    else:
        rope = {"rope_type": "default", "rope_theta": theta}
    out = {k: config[k] for k in _NEW_TO_GTE if k in config}
    out.update(model_type="gte", architectures=["GteModel"], rope_parameters=rope)
    return out


def is_new_format(folder: Path) -> bool:
    """Whether ``folder`` holds a gte checkpoint in the original ``new`` format (``model_type: new``)."""
    config = folder / "config.json"
    return config.is_file() and json.loads(config.read_text("utf-8")).get("model_type") == "new"


def native_gte_folder(folder: Path, source: str) -> Path:
    """A folder transformers reads natively as ``GteModel``: ``folder``'s files linked, its config converted.

    Kept in the user cache, keyed by the config and the weight files' identities, so it is built once.
    """
    config = json.loads((folder / "config.json").read_text("utf-8"))
    converted = gte_config_from_new(config, source)
    key = hashlib.sha256(json.dumps(converted, sort_keys=True).encode())
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name != "config.json" and p.suffix != ".py")
    for path in files:
        stat = path.stat()
        key.update(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    target = _cache_root() / "gte-native" / key.hexdigest()[:24]
    if (target / "config.json").is_file():
        return target
    target.mkdir(parents=True, exist_ok=True)
    for path in files:
        link = target / path.name
        if not link.exists():
            try:
                link.symlink_to(path.resolve())
            except OSError:  # no symlinks here (some file systems): a copy reads the same
                import shutil

                shutil.copyfile(path, link)
    tmp = target / "config.json.tmp"
    tmp.write_text(json.dumps(converted, indent=2), encoding="utf-8")
    os.replace(tmp, target / "config.json")  # written last: its presence marks the folder complete
    return target


def readable_folder(name: str, source: str | None = None) -> str:
    """``name``, or for a local gte tower in the original ``new`` format a folder transformers reads natively."""
    local = Path(name).expanduser()
    if local.is_dir() and is_new_format(local):
        return str(native_gte_folder(local, source or name))
    return name


def _cache_root() -> Path:
    base = os.environ.get("CARE_RETRIEVER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "care-retriever"
    )
    return Path(base)


# ---------------------------------------------------------------------- licence
_NON_COMMERCIAL = re.compile(r"(?i)\b(cc-by-nc[\w.-]*|non-?commercial)\b")
_said_licence: set[str] = set()


def declared_licence(root: Path) -> str | None:
    """The non-commercial licence a model's card (``README.md`` front matter) or ``LICENSE`` file declares."""
    card = root / "README.md"
    if card.is_file():
        text = card.read_text("utf-8", errors="replace")
        front = text.split("---", 2)[1] if text.startswith("---") and text.count("---") >= 2 else ""
        match = re.search(r"(?im)^license:\s*([\w.-]+)", front)
        if match and _NON_COMMERCIAL.search(match.group(1)):
            return match.group(1)
    for licence in sorted(root.glob("LICENSE*")):
        match = _NON_COMMERCIAL.search(licence.read_text("utf-8", errors="replace")[:4000])
        if match:
            return match.group(1)
    return None


def say_licence(root: Path, source: str) -> str | None:
    """Say once per process, in one line, that a model declares a non-commercial licence; the licence."""
    licence = declared_licence(root)
    if licence and source not in _said_licence:
        _said_licence.add(source)
        logger.warning("%s is licensed %s: non-commercial use only (see its model card)", source, licence)
    return licence


# ---------------------------------------------------------------------- fingerprint
_FINGERPRINT_SKIP = {"README.md", ".gitattributes"}


def release_fingerprint(layout: ReleaseLayout, dim: int) -> str:
    """The weights fingerprint of a release's document tower, from its files (no tower loaded).

    The sha256 of every file of ``doc_encoder/`` (weights, config, tokenizer), so a search process that
    loads only the query tower knows the document space. Local hashes are cached by file size and time;
    for a hub model whose document tower is not downloaded, the hub's own sha256 of each file is used.
    """
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"dim={dim};release;".encode())
    for rel, sha in sorted(_document_file_hashes(layout).items()):
        digest.update(f"{rel}={sha};".encode())
    return digest.hexdigest()


def _document_file_hashes(layout: ReleaseLayout) -> dict[str, str]:
    folder = layout.document
    if folder.is_dir() and (folder / "config.json").is_file():
        return {
            p.name: _file_sha256(p)
            for p in sorted(folder.iterdir())
            if p.is_file() and p.name not in _FINGERPRINT_SKIP and not p.name.startswith(".")
        }
    if offline():
        raise ModelError(
            f"{layout.source}: its {DOCUMENT_FOLDER}/ is not in the hub cache, and offline its file hashes (the "
            "document space's fingerprint) cannot be read; load the model once online, or load the document tower"
        )
    from huggingface_hub import HfApi

    try:
        info = HfApi().model_info(layout.source, files_metadata=True)
    except Exception as exc:
        raise ModelError(f"cannot read the file list of {layout.source}: {str(exc).splitlines()[0]}") from exc
    hashes: dict[str, str] = {}
    for sibling in info.siblings or []:
        rel = sibling.rfilename
        if not rel.startswith(f"{DOCUMENT_FOLDER}/") or rel.count("/") != 1:
            continue
        name = rel.split("/", 1)[1]
        if name in _FINGERPRINT_SKIP or name.startswith("."):
            continue
        if sibling.lfs is not None:
            hashes[name] = sibling.lfs.sha256
        else:  # small files are not in LFS: fetch and hash them, as a local copy would be hashed
            from huggingface_hub import hf_hub_download

            hashes[name] = _file_sha256(Path(hf_hub_download(layout.source, rel)))
    return hashes


def _file_sha256(path: Path) -> str:
    stat = path.stat()
    resolved = path.resolve()
    key = hashlib.sha256(f"{resolved}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:32]
    cached = _cache_root() / "file-sha256" / key
    if cached.is_file():
        return cached.read_text().strip()
    digest = hashlib.sha256()
    with open(resolved, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            digest.update(block)
    value = digest.hexdigest()
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp")
        tmp.write_text(value)
        os.replace(tmp, cached)
    except OSError:  # a read-only cache only costs the hashing again
        pass
    return value


# ---------------------------------------------------------------------- the model's config
def hidden_size(folder: Path) -> int:
    """A tower's native width from its config.json, without loading it (0 where it does not say)."""
    config = folder / "config.json"
    if not config.is_file():
        return 0
    data = json.loads(config.read_text("utf-8"))
    return int(data.get("hidden_size") or data.get("text_config", {}).get("hidden_size") or 0)


def authors_conventions() -> dict[str, Any]:
    """The :class:`~care_retriever.model.config.CareConfig` fields that record the authors' conventions: one
    definition for a release read as it is, a converted one, and towers paired with ``convention="authors-release"``."""
    return {
        "query_prompt_template": AUTHORS_QUERY_TEMPLATE,
        "default_instruction": AUTHORS_INSTRUCTIONS["retrieval"],
        "normalize": "before_truncation",
        "similarity": "dot",
        "instructions": dict(AUTHORS_INSTRUCTIONS),
        "convention": CONVENTION,
    }
