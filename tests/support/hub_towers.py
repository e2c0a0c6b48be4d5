"""Tiny random-weight towers written offline in the on-disk formats users download from the hub.

Each writer lays a folder out the way the real model's repository is laid out (see
``../shared/docs/hub-formats.md``): the real architecture classes, the real special-token layout of
the tokenizer, safetensors weights only, sentence-transformers folders written by
sentence-transformers itself. Only the sizes are tiny and the weights random.

- :func:`write_qwen3_embedding`: like Qwen/Qwen3-Embedding-*: a sentence-transformers folder
  (Transformer -> last-token Pooling -> Normalize) over ``Qwen3Model``; the tokenizer appends
  ``<|endoftext|>`` while its ``eos_token`` is ``<|im_end|>``, pads on the left; the query prompt
  ends ``Query:`` (no space), the document prompt is empty.
- :func:`write_qwen3_causal_lm`: like Qwen/Qwen3-4B: a ``Qwen3ForCausalLM`` checkpoint in sharded
  safetensors with an index; the tokenizer appends nothing.
- :func:`write_bert_sentence_transformer`: like BAAI/bge-base-zh-v1.5: ``BertModel``, [CLS] pooling.
- :func:`write_gte_sentence_transformer`: like gte-multilingual-base as transformers reads it
  natively (``GteModel``, model_type ``gte``), [CLS] pooling.
- :func:`write_remote_code_encoder`: a tower whose config and model classes live in the folder's
  own code (``auto_map``), as gte-multilingual-base's original repository ships them.
- :func:`write_lora_adapter`: a LoRA adapter as peft writes it for a Qwen3 causal LM (``CAUSAL_LM``)
  or a Qwen3 encoder (``FEATURE_EXTRACTION``), with non-zero weights so that applying it matters.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import torch

TEXTS = [
    "高血压患者应低盐饮食，规律服用降压药，定期监测血压。",
    "普通感冒多由病毒引起，多休息多喝水，一般一周左右可以自愈。",
    "糖尿病患者需要控制饮食、适量运动，并遵医嘱使用降糖药物。",
    "拉肚子时注意补充水分和电解质，避免脱水，严重时及时就医。",
    "失眠可以通过规律作息、睡前避免咖啡和手机来改善。",
    "宝宝发烧超过三十八度五或精神差时应及时就医。",
    "血压高怎么办",
    "感冒了吃什么药好得快",
    "What should a patient with hypertension eat?",
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:",
]

QWEN3_EMBEDDING_QUERY_PROMPT = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
)
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
HIDDEN = 64


def _seed(seed: int) -> None:
    torch.manual_seed(seed)


def _widen(model: torch.nn.Module, std: float = 0.2, seed: int = 0) -> None:
    """Redraw weight matrices wider than the default init, so that different texts get different vectors."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.copy_(torch.randn(param.shape, generator=generator) * std)


def qwen_tokenizer(*, append_endoftext: bool, padding_side: str):
    """A byte-level BPE ``Qwen2Tokenizer`` with Qwen's special tokens (eos ``<|im_end|>``, pad ``<|endoftext|>``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import Qwen2Tokenizer

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    backend.train_from_iterator(TEXTS * 3, trainer=trainer)
    vocab = backend.get_vocab()
    merges = [tuple(pair) for pair in json.loads(backend.to_str())["model"]["merges"]]
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side=padding_side,
        model_max_length=32768,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.add_tokens(["<|endoftext|>", "<|im_end|>"], special_tokens=True)
    if append_endoftext:
        # Qwen3-Embedding's tokenizer.json: every text ends with <|endoftext|>, the token the model pools.
        eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single="$A:0 <|endoftext|>:0",
            pair="$A:0 <|endoftext|>:0 $B:1 <|endoftext|>:1",
            special_tokens=[("<|endoftext|>", eot)],
        )
    return tokenizer


def _qwen3_config(tokenizer, **overrides):
    from transformers import Qwen3Config

    values = {
        "vocab_size": len(tokenizer),
        "hidden_size": HIDDEN,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 1024,
        "bos_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
        "pad_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        "tie_word_embeddings": True,
    }
    values.update(overrides)
    return Qwen3Config(**values)


def _save_sentence_transformer(hf_folder: Path, out: Path, pooling: str, prompts: dict[str, str]) -> Path:
    """``hf_folder`` (a transformers model + tokenizer) as a sentence-transformers folder, written by the library."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    transformer = Transformer(str(hf_folder), max_seq_length=512)
    pool = Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling)
    model = SentenceTransformer(
        modules=[transformer, pool, Normalize()], device="cpu", prompts=prompts, similarity_fn_name="cosine"
    )
    model.save(str(out), safe_serialization=True)
    shutil.rmtree(hf_folder)
    _assert_safetensors_only(out)
    return out


def _assert_safetensors_only(folder: Path) -> None:
    pickled = [p.name for p in folder.rglob("*.bin")] + [p.name for p in folder.rglob("*.pt")]
    assert not pickled, f"fixture {folder} must hold safetensors only, found {pickled}"


def write_qwen3_embedding(
    out: Path, seed: int = 0, *, document_prompt: str = "", dtype: torch.dtype = torch.float32
) -> Path:
    """A Qwen3-Embedding-format sentence-transformers folder (``Qwen3Model``, last-token pooling).

    ``document_prompt``: a prompt before every document, as some embedding models declare (e5's ``passage: ``).
    ``dtype=torch.bfloat16`` saves weights and config in bf16, as Qwen3-Embedding ships.
    """
    from transformers import Qwen3Model

    _seed(seed)
    tokenizer = qwen_tokenizer(append_endoftext=True, padding_side="left")
    model = Qwen3Model(_qwen3_config(tokenizer))
    _widen(model, seed=seed)
    model.to(dtype)
    hf = out.parent / f".{out.name}-hf"
    model.save_pretrained(hf, safe_serialization=True)
    tokenizer.save_pretrained(hf)
    prompts = {"query": QWEN3_EMBEDDING_QUERY_PROMPT, "document": document_prompt}
    return _save_sentence_transformer(hf, out, "lasttoken", prompts)


def write_qwen3_causal_lm(
    out: Path, seed: int = 0, *, hidden_size: int = HIDDEN, dtype: torch.dtype = torch.float32
) -> Path:
    """A ``Qwen3ForCausalLM`` checkpoint laid out like Qwen/Qwen3-4B (sharded safetensors + index).

    ``hidden_size`` widens it (a recipe's ``dim`` names the real tower's width); ``dtype=torch.bfloat16``
    saves weights and config in bf16, as Qwen3-4B ships.
    """
    from transformers import Qwen3ForCausalLM

    _seed(seed)
    tokenizer = qwen_tokenizer(append_endoftext=False, padding_side="right")
    model = Qwen3ForCausalLM(_qwen3_config(tokenizer, hidden_size=hidden_size))
    _widen(model, seed=seed)
    model = model.to(dtype)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="60KB")
    tokenizer.save_pretrained(out)
    assert (out / "model.safetensors.index.json").is_file(), "the causal-LM fixture must be sharded"
    _assert_safetensors_only(out)
    return out


def _wordpiece_tokenizer():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertTokenizer

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(handle_chinese_chars=True, lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.train_from_iterator(
        TEXTS * 3, trainer=trainers.WordPieceTrainer(vocab_size=400, special_tokens=special, show_progress=False)
    )
    # BertTokenizer builds BERT's own [CLS] $A [SEP] template around the trained vocabulary.
    return BertTokenizer(vocab=backend.get_vocab(), model_max_length=512)


def _bert_config(vocab_size: int, **overrides):
    from transformers import BertConfig

    values = {
        "vocab_size": vocab_size,
        "hidden_size": 48,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 512,
    }
    values.update(overrides)
    return BertConfig(**values)


def write_bert_sentence_transformer(out: Path, seed: int = 0) -> Path:
    """A BERT sentence-transformers folder like BAAI/bge-base-zh-v1.5 (``BertModel``, [CLS] pooling)."""
    from transformers import BertModel

    _seed(seed)
    tokenizer = _wordpiece_tokenizer()
    model = BertModel(_bert_config(len(tokenizer)), add_pooling_layer=False)
    _widen(model, seed=seed)
    hf = out.parent / f".{out.name}-hf"
    model.save_pretrained(hf, safe_serialization=True)
    tokenizer.save_pretrained(hf)
    return _save_sentence_transformer(hf, out, "cls", {})


def write_gte_sentence_transformer(out: Path, seed: int = 0, *, hidden_size: int = 48) -> Path:
    """gte-multilingual-base as transformers reads it natively: ``GteModel`` (rotary, GLU), [CLS] pooling."""
    from transformers import GteConfig, GteModel

    _seed(seed)
    tokenizer = _wordpiece_tokenizer()
    config = GteConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=1024,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = GteModel(config)
    _widen(model, seed=seed)
    hf = out.parent / f".{out.name}-hf"
    model.save_pretrained(hf, safe_serialization=True)
    tokenizer.save_pretrained(hf)
    return _save_sentence_transformer(hf, out, "cls", {})


REMOTE_MODEL_TYPE = "care-fixture-remote-bert"
REMOTE_CONFIGURATION = f'''
"""A model shipped as code in its own folder (auto_map), loaded with trust_remote_code=True."""
from transformers import BertConfig


class RemoteBertConfig(BertConfig):
    model_type = "{REMOTE_MODEL_TYPE}"
'''
REMOTE_MODELING = """
import torch
from transformers.models.bert.modeling_bert import BertModel

from .configuration_remote import RemoteBertConfig


class RemoteBertModel(BertModel):
    config_class = RemoteBertConfig

    def __init__(self, config, add_pooling_layer=False):
        super().__init__(config, add_pooling_layer=add_pooling_layer)
        # Something plain BERT does not have, so that loading this folder as BertModel would differ.
        self.output_scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, config.hidden_size))

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.last_hidden_state = out.last_hidden_state * self.output_scale
        return out
"""


def write_remote_code_encoder(out: Path, seed: int = 0, *, hidden_size: int = 48) -> Path:
    """A sentence-transformers folder whose config and model classes are the folder's own code (``auto_map``)."""
    import importlib.util
    import sys

    _seed(seed)
    code = out.parent / f".{out.name}-code"
    code.mkdir(parents=True, exist_ok=True)
    (code / "__init__.py").write_text("", "utf-8")
    (code / "configuration_remote.py").write_text(textwrap.dedent(REMOTE_CONFIGURATION), "utf-8")
    (code / "modeling_remote.py").write_text(textwrap.dedent(REMOTE_MODELING), "utf-8")
    package = f"care_fixture_remote_{seed}"
    spec = importlib.util.spec_from_file_location(package, code / "__init__.py", submodule_search_locations=[str(code)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[package] = module
    spec.loader.exec_module(module)
    configuration = importlib.import_module(f"{package}.configuration_remote")
    modeling = importlib.import_module(f"{package}.modeling_remote")

    tokenizer = _wordpiece_tokenizer()
    base = _bert_config(len(tokenizer), hidden_size=hidden_size)
    config = configuration.RemoteBertConfig(**base.to_dict())
    config.auto_map = {
        "AutoConfig": "configuration_remote.RemoteBertConfig",
        "AutoModel": "modeling_remote.RemoteBertModel",
    }
    config.architectures = ["RemoteBertModel"]
    model = modeling.RemoteBertModel(config)
    _widen(model, seed=seed)
    hf = out.parent / f".{out.name}-hf"
    model.save_pretrained(hf, safe_serialization=True)
    tokenizer.save_pretrained(hf)
    for name in ("configuration_remote.py", "modeling_remote.py"):
        shutil.copy(code / name, hf / name)
    shutil.rmtree(code)
    del sys.modules[package]
    # sentence-transformers needs the code to read the folder: the trust a user gives it.
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    transformer = Transformer(
        str(hf),
        max_seq_length=512,
        model_kwargs={"trust_remote_code": True},
        config_kwargs={"trust_remote_code": True},
        processor_kwargs={"trust_remote_code": True},
    )
    pool = Pooling(transformer.get_embedding_dimension(), pooling_mode="cls")
    st = SentenceTransformer(modules=[transformer, pool, Normalize()], device="cpu", similarity_fn_name="cosine")
    st.save(str(out), safe_serialization=True)
    for name in ("configuration_remote.py", "modeling_remote.py"):
        if not (out / name).is_file():
            shutil.copy(hf / name, out / name)
    shutil.rmtree(hf)
    _assert_safetensors_only(out)
    return out


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_lora_adapter(
    base: Path,
    out: Path,
    *,
    task_type: str = "CAUSAL_LM",
    target_modules: list[str] | str | None = None,
    seed: int = 0,
) -> Path:
    """A LoRA adapter (r=4) as peft saves it for ``base`` under ``task_type``; lora_B is non-zero.

    ``CAUSAL_LM`` wraps ``AutoModelForCausalLM`` (keys ``base_model.model.model.layers...``), as adapters
    published for Qwen3-4B are; ``FEATURE_EXTRACTION`` wraps ``AutoModel`` (``base_model.model.layers...``).
    """
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel, AutoModelForCausalLM

    _seed(seed)
    loader = AutoModelForCausalLM if task_type == "CAUSAL_LM" else AutoModel
    model = loader.from_pretrained(str(base))
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=target_modules or LORA_TARGETS, task_type=task_type, lora_dropout=0.0
    )
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    peft_model.save_pretrained(str(out), safe_serialization=True)
    _assert_safetensors_only(out)
    return out
