"""Offline tokenizer training for towers built from scratch.

Chinese has no spaces, so both tokenizers split CJK ideographs into single characters before
WordPiece / BPE merges run (``BertNormalizer(handle_chinese_chars=True)``). The query tower gets a
BERT-style tokenizer ([CLS] text [SEP]); the document tower gets a decoder-style one that appends
the EOS token to every text, because the decoder tower pools the EOS hidden state.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from care_retriever.errors import ModelError

BERT_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
DECODER_EOS = "<|endoftext|>"
DECODER_PAD = "<|pad|>"
DECODER_UNK = "<|unk|>"


def _normalizer() -> normalizers.Normalizer:
    return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=True)


def train_query_tokenizer(texts: Iterable[str], vocab_size: int = 8000) -> PreTrainedTokenizerFast:
    """A WordPiece tokenizer for the BERT-style query tower, trained on ``texts``."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = _normalizer()
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        special_tokens=BERT_SPECIAL_TOKENS,
        show_progress=False,  # seconds long; off a terminal its Rust bars leave blank lines on stdout
    )
    tokenizer.train_from_iterator(_nonempty(texts), trainer=trainer)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
    )


def train_document_tokenizer(texts: Iterable[str], vocab_size: int = 8000) -> PreTrainedTokenizerFast:
    """A BPE tokenizer for the decoder document tower that appends EOS to every text."""
    tokenizer = Tokenizer(models.BPE(unk_token=DECODER_UNK))
    tokenizer.normalizer = _normalizer()
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.BPEDecoder()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[DECODER_PAD, DECODER_UNK, DECODER_EOS], show_progress=False
    )
    tokenizer.train_from_iterator(_nonempty(texts), trainer=trainer)
    eos_id = tokenizer.token_to_id(DECODER_EOS)
    assert eos_id is not None  # a special token of the trainer: always in the vocabulary
    tokenizer.post_processor = append_eos_processor(DECODER_EOS, eos_id)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token=DECODER_UNK,
        pad_token=DECODER_PAD,
        eos_token=DECODER_EOS,
        model_max_length=512,
    )


def append_eos_processor(eos_token: str, eos_id: int) -> processors.TemplateProcessing:
    """Post-processor that ends every sequence with EOS (the decoder tower pools that position)."""
    return processors.TemplateProcessing(
        single=f"$A {eos_token}",
        pair=f"$A {eos_token} $B:1 {eos_token}:1",
        special_tokens=[(eos_token, eos_id)],
    )


def appended_tokens(tokenizer: PreTrainedTokenizerBase | None) -> list[int]:
    """The token ids the tokenizer's post-processor puts after every text (e.g. [SEP], ``<|endoftext|>``)."""
    if tokenizer is None:
        return []
    probe = "测试 test"
    plain = tokenizer(probe, add_special_tokens=False)["input_ids"]
    full = tokenizer(probe)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return list(full[start + len(plain) :])
    return []


def ensure_eos_appended(tokenizer: PreTrainedTokenizerBase | None, name: str = "the tower") -> bool:
    """Make a last-token tower's tokenizer end every text with a token to pool; True if it had to be changed.

    A tokenizer that already appends a token keeps it: Qwen3-Embedding's appends ``<|endoftext|>``
    (while its ``eos_token`` is ``<|im_end|>``), and that is the token the model was trained to pool.
    One that appends nothing (a base LLM's, such as Qwen3-4B's) gets its EOS appended after whatever
    its post-processor already does (a Llama-style BOS stays), as the paper pools the EOS state.
    """
    if tokenizer is None:
        raise ModelError(f"{name}: the tower has no tokenizer")
    if appended_tokens(tokenizer):
        return False
    eos = tokenizer.eos_token
    if eos is None or tokenizer.eos_token_id is None:
        raise ModelError(
            f"{name}: its tokenizer appends no token and has no eos_token; last-token pooling needs one "
            "(set eos_token in tokenizer_config.json, or use another pooling)"
        )
    backend = tokenizer.backend_tokenizer
    append = append_eos_processor(eos, tokenizer.eos_token_id)
    current = backend.post_processor
    backend.post_processor = append if current is None else processors.Sequence([current, append])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = eos
    return True


def append_nothing(tokenizer: PreTrainedTokenizerBase | None, name: str = "the tower") -> bool:
    """Make a tokenizer put nothing after a text; True if it had to be changed.

    The authors' released document towers pool the last text token: their slow ``Qwen2Tokenizer`` ignores
    ``add_eos_token``. transformers 5 reads the same folder with a tokenizer that may honour that flag (or
    a post-processor may add a token), so whatever follows the text is removed here.
    """
    if tokenizer is None:
        raise ModelError(f"{name}: the tower has no tokenizer")
    if not appended_tokens(tokenizer):
        return False
    backend = tokenizer.backend_tokenizer
    backend.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B:1", special_tokens=[])
    if appended_tokens(tokenizer):
        raise ModelError(f"{name}: its tokenizer keeps appending tokens after the text; cannot pool the last text")
    return True


def _nonempty(texts: Iterable[str]) -> Iterator[str]:
    for text in texts:
        if text and not text.isspace():
            yield text
