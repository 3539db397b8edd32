"""Single-exchange chat data (prompt and response) rendered as role-tagged text.

The block format is the one in ``rendering``: ``<user>\\n...\\n</user>`` and
``<assistant>\\n...\\n</assistant>`` joined by a blank line. Reasoning that a provider keeps
in its own field renders as a ``<thinking>`` block between the two.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from marin_assets.core.ingest.transforms import register
from marin_assets.core.ingest.transforms.rendering import (
    Skip,
    as_list,
    first_id,
    message_role,
    nonblank,
    per_row,
    role_block,
    strip_think_tags,
    text_or_none,
)


def exchange(user: str, assistant: str, thinking: str | None = None) -> str:
    blocks = [role_block("user", user)]
    if thinking:
        blocks.append(role_block("thinking", thinking))
    blocks.append(role_block("assistant", assistant))
    return "\n\n".join(blocks)


# --------------------------------------------------------------------------- GPT-OSS rollouts


@register("gpt_oss_chat")
@per_row(("user_content", "assistant_thinking", "assistant_content", "id"))
def gpt_oss_chat(row: Mapping[str, Any]) -> dict[str, Any]:
    """GPT-OSS-20B rollouts: user, optional thinking, assistant (``missing_user_or_assistant``)."""
    user, answer = nonblank(row.get("user_content")), nonblank(row.get("assistant_content"))
    if user is None or answer is None:
        raise Skip("missing_user_or_assistant")
    return {"text": exchange(user, answer, nonblank(row.get("assistant_thinking"))), "source_id": first_id(row, ("id",))}


# --------------------------------------------------------------------------- NuminaMath-1.5

VALID = "Yes"


@register("numinamath_chat")
@per_row(("problem", "solution", "problem_is_valid", "solution_is_valid", "source", "answer", "problem_type",
          "question_type", "synthetic", "id"))  # fmt: skip
def numinamath_chat(row: Mapping[str, Any]) -> dict[str, Any]:
    """Math problems and solutions; only rows whose problem and solution are both marked valid.

    Drops ``missing_problem_or_solution`` first, then ``invalid_problem_or_solution`` (either
    validity flag other than "Yes"). ``problem_hash`` is the SHA-256 of the stripped problem,
    to group solutions of one problem; the provider's ``source`` is kept as ``numina_source``.
    """
    problem, solution = nonblank(row.get("problem")), nonblank(row.get("solution"))
    if problem is None or solution is None:
        raise Skip("missing_problem_or_solution")
    if row.get("problem_is_valid") != VALID or row.get("solution_is_valid") != VALID:
        raise Skip("invalid_problem_or_solution")
    return {
        "text": exchange(problem, solution),
        "source_id": first_id(row, ("id",)),
        "problem_hash": hashlib.sha256(problem.encode("utf-8")).hexdigest(),
        "numina_source": text_or_none(row.get("source")) or "",
        "answer": text_or_none(row.get("answer")) or "",
        "problem_type": text_or_none(row.get("problem_type")) or "",
        "question_type": text_or_none(row.get("question_type")) or "",
        "synthetic": row.get("synthetic") is True,
    }


# --------------------------------------------------------------------------- NuminaMath-TIR

TIR_ROLES = frozenset({"system", "user", "assistant", "tool"})


@register("numinamath_tir_chat")
@per_row(("messages", "id"))
def numinamath_tir_chat(row: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI-style messages; tool-integrated reasoning (code and its output) stays inline.

    A row with any message that is not a known role with non-empty string content is dropped
    whole (``malformed_messages``): a transcript with a hole would misattribute the steps.
    """
    messages = as_list(row.get("messages"), "missing_messages", "malformed_messages")
    blocks = []
    for message in messages:
        try:
            role = message_role(message)
        except Skip:
            raise Skip("malformed_messages") from None
        content = nonblank(message.get("content"))
        if role not in TIR_ROLES or content is None:
            raise Skip("malformed_messages")
        blocks.append(role_block(role, content))
    return {"text": "\n\n".join(blocks), "source_id": first_id(row, ("id",))}


# --------------------------------------------------------------------------- Superior-Reasoning


@register("superior_reasoning_chat")
@per_row(("input", "output", "id"))
def superior_reasoning_chat(row: Mapping[str, Any]) -> dict[str, Any]:
    """Prompt and response; ``<think>`` markers are removed, the reasoning text stays.

    Drops ``missing_input_or_output`` (either side absent or blank, also after the markers
    are removed).
    """
    prompt, response = nonblank(row.get("input")), text_or_none(row.get("output"))
    response = strip_think_tags(response) if response is not None else None
    if prompt is None or not response:
        raise Skip("missing_input_or_output")
    return {"text": exchange(prompt, response), "source_id": first_id(row, ("id",))}


# --------------------------------------------------------------------------- SYNTHETIC-1

GRADES = ((1.0, "correct"), (0.8, "mostly correct"), (0.5, "partially correct"), (0.2, "mostly incorrect"))


def grade(score: Any) -> str:
    """The verifier score as a word: correct (1), mostly correct (>=0.8), partially correct
    (>=0.5), mostly incorrect (>=0.2), incorrect (below), unscored (missing or not a number)."""
    if score is None or isinstance(score, bool):
        return "unscored"
    try:
        value = float(score)
    except (TypeError, ValueError):
        return "unscored"
    if value != value:  # NaN
        return "unscored"
    for threshold, word in GRADES:
        if value >= threshold:
            return word
    return "incorrect"


@register("synthetic1_scored_response")
@per_row(("prompt", "llm_response", "score", "response_id", "problem_id", "task_type", "id"))
def synthetic1_scored_response(row: Mapping[str, Any]) -> dict[str, Any]:
    """Prompt, a grade line, then the response with ``<think>`` markers removed.

    Text: ``{prompt}\\n\\nGrade: {grade}\\n\\n{response}``. Drops ``missing_prompt_or_response``.
    Keeps ``task_type``, ``problem_id`` and the numeric ``score``.
    """
    prompt, response = nonblank(row.get("prompt")), text_or_none(row.get("llm_response"))
    response = strip_think_tags(response) if response is not None else None
    if prompt is None or not response:
        raise Skip("missing_prompt_or_response")
    score = row.get("score")
    return {
        "text": f"{prompt}\n\nGrade: {grade(score)}\n\n{response}",
        "source_id": first_id(row, ("response_id", "id")),
        "task_type": text_or_none(row.get("task_type")),
        "problem_id": first_id(row, ("problem_id",)),
        "score": float(score) if isinstance(score, (int, float)) and not isinstance(score, bool) else None,
    }
