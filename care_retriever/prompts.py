"""The query prompt: one template for instruction-following query towers, and how it is filled.

Decoder query towers (Qwen3-Embedding style) read ``Instruct: <task>\\nQuery: <text>``; BERT query towers
take no prompt. CARE models keep their template in ``care_config.json``; baselines pick this one when
the model's own query prompt is an ``Instruct`` prompt. The document side takes no prompt.
"""

from __future__ import annotations

QUERY_PROMPT_TEMPLATE = "Instruct: {instruction}\nQuery: "
DEFAULT_INSTRUCTION = "Given a Chinese medical question, retrieve medical documents that answer the question."


def fill_query_prompt(template: str | None, instruction: str | None) -> str | None:
    """The prompt put before each query: ``template`` with its ``{instruction}`` slot filled; None without one."""
    if not template:
        return None
    return template.format(instruction=instruction or "")


def is_instruction_prompt(prompt: str | None) -> bool:
    """Whether a model's own query prompt is of the ``Instruct: ...`` kind (so the task's instruction goes there)."""
    return bool(prompt) and prompt.lstrip().startswith("Instruct")
