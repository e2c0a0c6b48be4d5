"""The names of a tower's precisions and attention implementations, torch-free, so that a bad flag is refused
before torch is imported."""

# The precisions a tower loads in, as the CLI and the configs name them (torch's long names float32, bfloat16 and
# float16 are taken too: care_retriever.runtime.device.DTYPES). "saved": each tower in the dtype its own
# config.json names (fp32 where it names none), whatever the device: what `init` writes, so a GPU does not decide a
# model's bytes.
DTYPE_CHOICES = ("auto", "saved", "fp32", "bf16", "fp16")
DTYPE_NAMES = (*DTYPE_CHOICES, "float32", "bfloat16", "float16")
ATTN_IMPLEMENTATIONS = ("auto", "sdpa", "flash_attention_2", "eager")
