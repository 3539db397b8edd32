"""Agent trajectories rendered as role-tagged transcripts (see ``rendering`` for the format).

Every recipe here keeps the provider's row id as ``source_id`` (the first of a few likely id
columns that is present) and reads Parquet in batches of at most 256 rows, because one row
holds a whole multi-turn rollout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marin_assets.core.ingest.transforms import register
from marin_assets.core.ingest.transforms.rendering import (
    Skip,
    as_list,
    bounded_batches,
    first_id,
    message_role,
    per_row,
    reads_with,
    render_messages,
    with_outcome,
)

TRAJECTORY_BATCH_ROWS = 256
small_batches = bounded_batches(TRAJECTORY_BATCH_ROWS)


def _reward_outcome(value: Any) -> str | None:
    """solved for a reward >= 1, failed below, None when there is no numeric reward."""
    if value is None or isinstance(value, bool):
        return None if value is None else ("solved" if value else "failed")
    try:
        reward = float(value)
    except (TypeError, ValueError):
        return None
    return "solved" if reward >= 1.0 else "failed"


# --------------------------------------------------------------------------- AgentTrove

EXCLUDED_TEACHERS = ("gpt", "openai", "claude", "anthropic", "gemini")
ALLOWED_TEACHERS = ("gpt-oss",)
PROVENANCE_FIELDS = ("model", "model_provider", "original_teacher")


def proprietary_teacher(row: Mapping[str, Any]) -> bool:
    """True when a provenance field names a proprietary model family (gpt-oss is open: kept)."""
    values = [str(row.get(f) or "").lower() for f in PROVENANCE_FIELDS]
    if any(marker in v for v in values for marker in ALLOWED_TEACHERS):
        return False
    return any(marker in v for v in values for marker in EXCLUDED_TEACHERS)


def agenttrove_outcome(result: Any) -> str | None:
    """``result`` mixes conventions: "success"/"timeout", a numeric reward, or an error class.

    An error class means the run stopped before anything verified it: ``unverified``.
    """
    if result is None or result == "":
        return None
    word = str(result).strip().lower()
    if word == "success":
        return "solved"
    if word == "timeout":
        return "failed"
    try:
        return "solved" if float(word) >= 1.0 else "failed"
    except ValueError:
        return "unverified"


@register("agenttrove_transcript")
@reads_with(small_batches)
@per_row(("conversations", "model", "model_provider", "original_teacher", "original_source", "task_source",
          "result", "id", "trial_name", "run_id"))  # fmt: skip
def agenttrove_transcript(row: Mapping[str, Any]) -> dict[str, Any]:
    """Terminal-agent rollouts; rollouts taught by proprietary models are dropped.

    Drops: ``proprietary_teacher``, ``missing_conversations``, ``malformed_conversations``,
    ``empty_conversation``. Keeps ``teacher`` and ``task_source`` (empty string when unknown).
    """
    if proprietary_teacher(row):
        raise Skip("proprietary_teacher")
    messages = as_list(row.get("conversations"), "missing_conversations", "malformed_conversations")
    text = with_outcome(agenttrove_outcome(row.get("result")), render_messages(messages))
    return {
        "text": text,
        "source_id": first_id(row, ("id", "trial_name", "run_id")),
        "teacher": str(row.get("original_teacher") or ""),
        "task_source": str(row.get("original_source") or row.get("task_source") or ""),
    }


# --------------------------------------------------------------------------- CoderForge


@register("coderforge_trajectory")
@reads_with(small_batches)
@per_row(("messages", "reward", "id", "trajectory_id", "instance_id"))
def coderforge_trajectory(row: Mapping[str, Any]) -> dict[str, Any]:
    """SWE agent trajectories (``messages`` is a JSON string or a list) with a reward tag.

    reward >= 1 is ``solved``, a lower reward ``failed``, a missing one ``unknown``.
    """
    messages = as_list(row.get("messages"), "missing_messages", "malformed_messages")
    outcome = _reward_outcome(row.get("reward")) or "unknown"
    reward = row.get("reward")
    return {
        "text": with_outcome(outcome, render_messages(messages)),
        "source_id": first_id(row, ("id", "trajectory_id", "instance_id")),
        "reward": float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None,
    }


# --------------------------------------------------------------------------- daVinci-Dev env-native


@register("davinci_env_trajectory")
@reads_with(small_batches)
@per_row(("messages", "success", "id", "instance_id"))
def davinci_env_trajectory(row: Mapping[str, Any]) -> dict[str, Any]:
    """SWE-Agent rollouts on SWE-rebench tasks; ``success`` (when recorded) gives the tag."""
    messages = as_list(row.get("messages"), "missing_messages", "malformed_messages")
    success = row.get("success")
    outcome = None if success is None else ("solved" if success is True or success == 1 else "failed")
    return {
        "text": with_outcome(outcome, render_messages(messages)),
        "source_id": first_id(row, ("id", "instance_id")),
        "instance_id": row.get("instance_id") if isinstance(row.get("instance_id"), str) else None,
    }


# --------------------------------------------------------------------------- GLM KernelGym

REASONING_CLOSE = "</think>"


def _join_reasoning(content: str) -> str:
    """GLM's reasoning ends with a dangling ``</think>`` (no opener): make it a paragraph break."""
    return "\n\n".join(part.strip() for part in content.split(REASONING_CLOSE) if part.strip())


def kernelgym_messages(messages: list[Any], turns: list[Any]) -> list[dict[str, str]]:
    """The recorded generations only.

    An assistant message whose content is not one of the ``turns`` responses is sampler
    bookkeeping (the final stop sentinel, or a rejected answer to a "keep going?" prompt):
    it is dropped together with the user prompt that drew it.
    """
    generations = {turn["response"] for turn in turns}
    kept: list[dict[str, str]] = []
    for message in messages:
        role = message_role(message)
        content = message.get("content")
        if not isinstance(content, str):
            raise Skip("malformed_message")
        if role == "assistant":
            if content not in generations:
                if kept and kept[-1]["role"] == "user":
                    kept.pop()
                continue
            content = _join_reasoning(content)
        kept.append({"role": role, "content": content})
    return kept


@register("kernelgym_trajectory")
@reads_with(small_batches)
@per_row(("messages", "turns", "max_tokens", "id", "task_id", "problem_id"))
def kernelgym_trajectory(row: Mapping[str, Any]) -> dict[str, Any]:
    """GPU-kernel repair loops; rows whose last turn hit ``max_tokens`` are dropped.

    Truncation earlier in a loop is kept (the next turn recovers from the rejected kernel);
    only a truncated final turn (``truncated_final_turn``) leaves a broken ending. Every
    kept row ends on a passing kernel, so no outcome tag is added.
    """
    messages = as_list(row.get("messages"), "missing_messages", "malformed_messages")
    turns = as_list(row.get("turns"), "missing_turns", "malformed_turns")
    max_tokens = row.get("max_tokens")
    last_usage = turns[-1].get("usage") or {}
    completion = last_usage.get("completion_tokens")
    if isinstance(max_tokens, (int, float)) and isinstance(completion, (int, float)) and completion >= max_tokens:
        raise Skip("truncated_final_turn")
    kept = kernelgym_messages(messages, turns)
    return {"text": render_messages(kept), "source_id": first_id(row, ("id", "task_id", "problem_id"))}


# --------------------------------------------------------------------------- Nemotron terminal


@register("nemotron_terminal_conversations")
@reads_with(small_batches)
@per_row(("conversations", "id", "uuid", "trial_name"))
def nemotron_terminal_conversations(row: Mapping[str, Any]) -> dict[str, Any]:
    """Terminal-agent conversations with thinking traces, as role blocks (no outcome recorded)."""
    messages = as_list(row.get("conversations"), "missing_conversations", "malformed_conversations")
    return {"text": render_messages(messages), "source_id": first_id(row, ("id", "uuid", "trial_name"))}


# --------------------------------------------------------------------------- SWE-rebench OpenHands


@register("swe_rebench_openhands_trajectory")
@reads_with(small_batches)
@per_row(("trajectory", "resolved", "id", "instance_id", "trajectory_id"))
def swe_rebench_openhands_trajectory(row: Mapping[str, Any]) -> dict[str, Any]:
    """OpenHands trajectories (system/user/assistant/tool turns) with a ``resolved`` tag."""
    messages = as_list(row.get("trajectory"), "missing_trajectory", "malformed_trajectory")
    resolved = row.get("resolved")
    outcome = _reward_outcome(resolved) if resolved is not None else None
    instance = row.get("instance_id")
    return {
        "text": with_outcome(outcome, render_messages(messages)),
        "source_id": first_id(row, ("id", "trajectory_id", "instance_id")),
        "instance_id": instance if isinstance(instance, str) else None,
    }


# --------------------------------------------------------------------------- SWE-ZERO


@register("swe_zero_trajectory")
@reads_with(small_batches)
@per_row(("messages", "exit_status", "id", "instance_id"))
def swe_zero_trajectory(row: Mapping[str, Any]) -> dict[str, Any]:
    """Execution-free mini-swe-agent trajectories as role blocks; ``exit_status`` is kept."""
    messages = as_list(row.get("messages"), "missing_messages", "malformed_messages")
    status = row.get("exit_status")
    return {
        "text": render_messages(messages),
        "source_id": first_id(row, ("id", "instance_id")),
        "exit_status": status if isinstance(status, str) else None,
    }

