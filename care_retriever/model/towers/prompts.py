"""The query prompt: one template for instruction-following query towers, and how it is filled.

Decoder query towers read ``Instruct: <task>\\nQuery:<text>``, the form of Qwen3-Embedding's own prompt and
its model card's helper (no space after ``Query:``); BERT query towers take no prompt. A pretrained tower
that declares its own query prompt keeps it (:func:`literal_template`). CARE models keep their template in
``care_config.json``; baselines pick this one when the model's own query prompt is an ``Instruct`` prompt.
"""

from __future__ import annotations

QUERY_PROMPT_TEMPLATE = "Instruct: {instruction}\nQuery:"
# The query instruction of each task type: the paper's Table 8, which is also the instruction table of the
# authors' released code (their inference/asymmetric.py), where clustering has one too. Evaluation, the
# default query instruction and the authors' convention all read this one table.
TASK_INSTRUCTIONS: dict[str, str] = {
    "retrieval": "Given a Chinese medical question, retrieve medical documents that answer the question.",
    "rerank": "Based on a Chinese medical question, evaluate and rank the medical information that provide "
    "answers to the question.",
    "sts": "Retrieve semantically similar text.",
    "clustering": "Identify the category of disease based on the medical text.",
}
DEFAULT_INSTRUCTION = TASK_INSTRUCTIONS["retrieval"]


def fill_query_prompt(template: str | None, instruction: str | None) -> str | None:
    """The prompt put before each query: ``template`` with its ``{instruction}`` slot filled; None without one."""
    if not template:
        return None
    return template.format(instruction=instruction or "")


def literal_template(prompt: str) -> str:
    """A fixed prompt as a template with no ``{instruction}`` slot (braces in it are kept as they are)."""
    return prompt.replace("{", "{{").replace("}", "}}")


def is_instruction_prompt(prompt: str | None) -> bool:
    """Whether a model's own query prompt is of the ``Instruct: ...`` kind (so the task's instruction goes there)."""
    return bool(prompt) and prompt is not None and prompt.lstrip().startswith("Instruct")
