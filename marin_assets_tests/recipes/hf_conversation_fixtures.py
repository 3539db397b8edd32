"""Fixtures for the Hugging Face sources of agent trajectories and chat, in each provider's schema.

Every fixture mixes well-formed conversations (whose rendered text is written out in full below)
with awkward ones the recipe must count and drop or repair: missing fields, empty turns, wrong
types, invalid UTF-8 and broken lines in JSON, whitespace runs past the cap.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from marin_assets_tests.recipes import FixtureCase, register_fixture
from marin_assets_tests.recipes.formats import RUN, encode, json_lines, parquet


def msg(role: str | None, content: Any, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": content, **extra}


def call(name: str, arguments: str, call_id: str = "call_0") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def blocks(*pairs: tuple[str, str]) -> str:
    return "\n\n".join(f"<{role}>\n{body}\n</{role}>" for role, body in pairs)


# --------------------------------------------------------------------------- trajectories


@register_fixture("agenttrove")
def agenttrove(source: Any) -> FixtureCase:
    def row(trial: str, conversations: Any, teacher: str | None = "GLM-4.6", model: str | None = None,
            provider: str | None = None, result: str | None = None, task: str | None = "r2egym") -> dict[str, Any]:  # fmt: skip
        return {"trial_name": trial, "conversations": conversations, "model": model, "model_provider": provider,
                "original_teacher": teacher, "result": result, "original_source": task}  # fmt: skip

    rows = [
        row("t-solved", [msg("user", "List the files."), msg("assistant", "ls -la")], model="GLM-4.6", provider="zai", result="success", task="swesmith"),
        row("t-claude", [msg("user", "x"), msg("assistant", "y")], teacher="claude-sonnet-4-5", result="1.0"),
        row("t-provider", [msg("user", "x"), msg("assistant", "y")], model="some-model", provider="anthropic"),
        row("t-gptoss", [msg("system", "You are in a shell."), msg("user", "Make a dir."), msg("assistant", "mkdir out")],
            teacher="GPT-OSS-120B", model="openai/gpt-oss-120b", provider="openai", result="AgentTimeoutError", task="nl2bash"),  # fmt: skip
        row("t-failed", [msg("user", "Count lines."), msg("assistant", ""), msg("assistant", None), msg("assistant", "wc -l file")],
            teacher="Qwen3-Coder", result="0.0"),  # fmt: skip
        row("t-notag", [msg("user", "Echo hi" + " " * 300 + "twice"), msg("assistant", "echo hi")], task=None),
        row("t-empty", []),
        row("t-null", None),
        row("t-norole", [msg(None, "who am I")]),
        row("t-blank", [msg("user", "   "), msg("assistant", "")]),
    ]
    texts = {
        "t-solved": "Outcome: solved\n\n" + blocks(("user", "List the files."), ("assistant", "ls -la")),
        "t-gptoss": "Outcome: unverified\n\n" + blocks(("system", "You are in a shell."), ("user", "Make a dir."), ("assistant", "mkdir out")),
        "t-failed": "Outcome: failed\n\n" + blocks(("user", "Count lines."), ("assistant", "wc -l file")),
        "t-notag": blocks(("user", "Echo hi" + " " * RUN + "twice"), ("assistant", "echo hi")),
    }

    def check(frame: Any) -> None:
        by_id = {r["source_id"]: r for r in frame.to_dicts()}
        assert by_id["t-gptoss"]["teacher"] == "GPT-OSS-120B" and by_id["t-solved"]["task_source"] == "swesmith"
        assert by_id["t-notag"]["task_source"] == ""

    return FixtureCase(
        files={"data/train-00000-of-00001.parquet": parquet(rows), "README.md": b"# AgentTrove\n"},
        rows=4, texts=texts, all_texts=list(texts.values()),
        bad_rows={"proprietary_teacher": 2, "missing_conversations": 2, "malformed_message": 1, "empty_conversation": 1},
        counters={"whitespace_compacted": 1}, columns=("teacher", "task_source"), absent_columns=("conversations",), check=check,
    )  # fmt: skip


@register_fixture("coderforge")
def coderforge(source: Any) -> FixtureCase:
    solved = [
        msg("system", "You are a coding agent."),
        msg("user", "Fix the failing test."),
        msg("assistant", None, tool_calls=[call("bash", '{"command": "pytest -x"}', "c1")]),
        msg("tool", "1 failed", tool_call_id="c1"),
        msg("assistant", "Fixed the off-by-one."),
    ]
    rebench = [
        {"trajectory_id": "cf-1", "messages": json.dumps(solved), "reward": 1.0},
        {"trajectory_id": "cf-2", "messages": json.dumps([msg("user", "Fix it."), msg("assistant", "I could not.")]), "reward": 0.0},
        {"trajectory_id": "cf-3", "messages": "", "reward": None},
        {"trajectory_id": "cf-4", "messages": '[{"role": "user"', "reward": 1.0},
    ]
    smith = [{"trajectory_id": "cf-5", "messages": json.dumps([msg("user", "Add a test."), msg("assistant", "Added.")]), "reward": None}]
    bad_args = [msg("user", "Run it."), msg("assistant", "Running.", tool_calls=[{"function": {"name": "bash", "arguments": "{bad"}}])]
    r2e = [{"trajectory_id": "cf-6", "messages": json.dumps(bad_args), "reward": 2.0}]
    texts = {
        "cf-1": "Outcome: solved\n\n" + blocks(
            ("system", "You are a coding agent."), ("user", "Fix the failing test."),
            ("assistant", '<tool_call>\n{"name": "bash", "arguments": {"command": "pytest -x"}}\n</tool_call>'),
            ("tool", "1 failed"), ("assistant", "Fixed the off-by-one."),
        ),  # fmt: skip
        "cf-2": "Outcome: failed\n\n" + blocks(("user", "Fix it."), ("assistant", "I could not.")),
        "cf-5": "Outcome: unknown\n\n" + blocks(("user", "Add a test."), ("assistant", "Added.")),
        "cf-6": "Outcome: solved\n\n" + blocks(("user", "Run it."), ("assistant", 'Running.\n\n<tool_call>\n{"name": "bash", "arguments": "{bad"}\n</tool_call>')),
    }
    other = [{"trajectory_id": "decoy", "messages": json.dumps([msg("user", "DECOY")]), "reward": 1.0}]
    return FixtureCase(
        files={
            "trajectories/SWE_Rebench-00000-of-00001.parquet": parquet(rebench),
            "trajectories/SWE_Smith-00000-of-00001.parquet": parquet(smith),
            "trajectories/R2E_Gym-00000-of-00001.parquet": parquet(r2e),
            "trajectories/Other_Split-00000-of-00001.parquet": parquet(other),
        },
        rows=4, texts=texts, all_texts=list(texts.values()),
        bad_rows={"missing_messages": 1, "malformed_messages": 1}, columns=("reward",),
    )  # fmt: skip


@register_fixture("davinci-dev/env-native")
def davinci_env(source: Any) -> FixtureCase:
    looking = msg("assistant", "Looking.", tool_calls=[call("str_replace_editor", '{"command": "view", "path": "/repo"}', "a")])
    lines: list[Any] = [
        {"instance_id": "acme__w-1", "messages": [msg("system", "SWE agent."), msg("user", "Fix issue 1."), looking,
                                                  msg("tool", "file list"), msg("assistant", "Done.")], "success": True},  # fmt: skip
        {"instance_id": "acme__w-2", "messages": [msg("user", "Fix issue 2."), msg("assistant", "Gave up.")], "success": False},
        {"instance_id": "acme__w-3", "messages": [msg("user", "Fix issue 3."), msg("assistant", "Patched.")]},
        {"instance_id": "acme__w-4", "messages": []},
        b'{"instance_id": "acme__w-5", "messages": [{"role": "user", "content": "R\xe9sum\xe9 parser"}, '
        b'{"role": "assistant", "content": "Fixed."}], "success": true}',
        b'{"instance_id": "acme__w-6", "messages": [',
    ]
    texts = {
        "acme__w-1": "Outcome: solved\n\n" + blocks(
            ("system", "SWE agent."), ("user", "Fix issue 1."),
            ("assistant", 'Looking.\n\n<tool_call>\n{"name": "str_replace_editor", "arguments": {"command": "view", "path": "/repo"}}\n</tool_call>'),
            ("tool", "file list"), ("assistant", "Done."),
        ),  # fmt: skip
        "acme__w-2": "Outcome: failed\n\n" + blocks(("user", "Fix issue 2."), ("assistant", "Gave up.")),
        "acme__w-3": blocks(("user", "Fix issue 3."), ("assistant", "Patched.")),
        "acme__w-5": "Outcome: solved\n\n" + blocks(("user", "R\ufffdsum\ufffd parser"), ("assistant", "Fixed.")),
    }
    return FixtureCase(
        files={"env-native.jsonl": json_lines(lines)},
        rows=4, texts=texts, all_texts=list(texts.values()),
        bad_rows={"missing_messages": 1, "invalid_utf8_repaired": 1, "bad_json": 1}, columns=("instance_id",),
    )  # fmt: skip


@register_fixture("glm-5.2-kernelgym-rollouts")
def kernelgym(source: Any) -> FixtureCase:
    v1 = "I should use a grid-stride loop.</think>__global__ void add_v1() {}"
    v2 = "Bound the index.</think>__global__ void add_v2() {}"
    lines: list[Any] = [
        {"id": "kg-1", "max_tokens": 16384,
         "messages": [msg("user", "Write a CUDA kernel for vector add."), msg("assistant", v1),
                      msg("user", "Correctness failed: out of bounds."), msg("assistant", v2),
                      msg("user", "Is another attempt worthwhile?"), msg("assistant", "No."),
                      msg("user", "Wrap up."), msg("assistant", "KERNELGYM_FINAL")],
         "turns": [{"response": v1, "usage": {"completion_tokens": 16384}}, {"response": v2, "usage": {"completion_tokens": 900}}]},
        {"id": "kg-2", "max_tokens": 16384, "messages": [msg("user", "Q"), msg("assistant", "x</think>y")],
         "turns": [{"response": "x</think>y", "usage": {"completion_tokens": 16384}}]},
        {"id": "kg-3", "max_tokens": 16384, "messages": [msg("user", "Q"), msg("assistant", "z")], "turns": []},
        {"id": "kg-4", "max_tokens": 16384, "turns": [{"response": "z", "usage": {"completion_tokens": 1}}]},
        b'{"id": "kg-5", "max_tokens": 16384, "messages": [{"role": "user"',
        {"id": "kg-6", "max_tokens": 16384, "messages": [msg("user", "Make it faster."), msg("assistant", "kernel_v3")],
         "turns": [{"response": "kernel_v3", "usage": {"completion_tokens": 10}}]},
    ]  # fmt: skip
    texts = {
        "kg-1": blocks(
            ("user", "Write a CUDA kernel for vector add."),
            ("assistant", "I should use a grid-stride loop.\n\n__global__ void add_v1() {}"),
            ("user", "Correctness failed: out of bounds."),
            ("assistant", "Bound the index.\n\n__global__ void add_v2() {}"),
        ),
        "kg-6": blocks(("user", "Make it faster."), ("assistant", "kernel_v3")),
    }
    return FixtureCase(
        files={"data/train-00000.jsonl.gz": encode("jsonl.gz", lines), "README.md": b"# rollouts\n"},
        rows=2, texts=texts, all_texts=list(texts.values()),
        bad_rows={"truncated_final_turn": 1, "missing_turns": 1, "missing_messages": 1, "bad_json": 1},
    )  # fmt: skip


@register_fixture("nemotron-terminal")
def nemotron_terminal(source: Any) -> FixtureCase:
    rows = [
        {"id": "nt-1", "conversations": [msg("user", "Find large files."), msg("assistant", "<think>Use find.</think>\nfind / -size +1G")]},
        {"id": "nt-2", "conversations": []},
        {"id": "nt-3", "conversations": [msg("user", "")]},
        {"id": "nt-4", "conversations": [msg("user", "Tabs" + "\t" * 201 + "end"), msg("assistant", "ok")]},
    ]
    texts = {
        "nt-1": blocks(("user", "Find large files."), ("assistant", "<think>Use find.</think>\nfind / -size +1G")),
        "nt-4": blocks(("user", "Tabs" + "\t" * RUN + "end"), ("assistant", "ok")),
    }
    return FixtureCase(
        files={"dataset_adapters/part-00000.parquet": parquet(rows), "README.md": b"# terminal\n"},
        rows=2, texts=texts, all_texts=list(texts.values()),
        bad_rows={"missing_conversations": 1, "empty_conversation": 1}, counters={"whitespace_compacted": 1},
    )  # fmt: skip


@register_fixture("swe-rebench-openhands")
def swe_rebench_openhands(source: Any) -> FixtureCase:
    first = [
        msg("system", "You are OpenHands."),
        msg("user", "Fix it."),
        msg("assistant", "", tool_calls=[call("execute_bash", '{"command": "ls"}', "t1")]),
        msg("tool", "README.md setup.py", tool_calls=None),
        msg("assistant", "Done."),
    ]
    rows = [
        {"instance_id": "django__django-1", "trajectory": first, "resolved": 1},
        {"instance_id": "flask-2", "trajectory": [msg("user", "Fix that."), msg("assistant", "Tried.")], "resolved": 0},
        {"instance_id": "requests-3", "trajectory": [msg("user", "Look."), msg("assistant", "Looked.")], "resolved": None},
        {"instance_id": "x-4", "trajectory": None, "resolved": 1},
    ]
    texts = {
        "django__django-1": "Outcome: solved\n\n" + blocks(
            ("system", "You are OpenHands."), ("user", "Fix it."),
            ("assistant", '<tool_call>\n{"name": "execute_bash", "arguments": {"command": "ls"}}\n</tool_call>'),
            ("tool", "README.md setup.py"), ("assistant", "Done."),
        ),  # fmt: skip
        "flask-2": "Outcome: failed\n\n" + blocks(("user", "Fix that."), ("assistant", "Tried.")),
        "requests-3": blocks(("user", "Look."), ("assistant", "Looked.")),
    }
    return FixtureCase(
        files={"data/train-00000-of-00001.parquet": parquet(rows)},
        rows=3, texts=texts, all_texts=list(texts.values()), bad_rows={"missing_trajectory": 1}, columns=("instance_id",),
    )  # fmt: skip


@register_fixture("swe-zero-12m")
def swe_zero(source: Any) -> FixtureCase:
    action = "THOUGHT: look\n\n```bash\nls\n```"
    rows = [
        {"instance_id": "z-1", "exit_status": "Submitted", "messages": [msg("system", "You are a helpful assistant."), msg("user", "Task: fix bug."),
                                                                        msg("assistant", action), msg("user", "Observation: a.py")]},  # fmt: skip
        {"instance_id": "z-2", "exit_status": "incomplete", "messages": []},
        {"instance_id": "z-3", "exit_status": "incomplete", "messages": [msg("user", "  "), msg("assistant", None)]},
        {"instance_id": "z-4", "exit_status": None, "messages": [msg("user", "Hi"), msg("assistant", "Hello")]},
    ]
    texts = {
        "z-1": blocks(("system", "You are a helpful assistant."), ("user", "Task: fix bug."), ("assistant", action), ("user", "Observation: a.py")),
        "z-4": blocks(("user", "Hi"), ("assistant", "Hello")),
    }

    def check(frame: Any) -> None:
        assert dict(zip(frame["source_id"], frame["exit_status"], strict=True)) == {"z-1": "Submitted", "z-4": None}

    return FixtureCase(
        files={"data/train-00000-of-00002.parquet": parquet(rows[:2]), "data/train-00001-of-00002.parquet": parquet(rows[2:])},
        rows=2, texts=texts, all_texts=list(texts.values()),
        bad_rows={"missing_messages": 1, "empty_conversation": 1}, columns=("exit_status",), check=check,
    )  # fmt: skip


# --------------------------------------------------------------------------- chat


@register_fixture("gpt-oss-rollouts")
def gpt_oss(source: Any) -> FixtureCase:
    numina = [
        {"id": "n-1", "user_content": "What is 2+2?", "assistant_thinking": "Add two and two.", "assistant_content": "4"},
        {"id": "n-2", "user_content": "Name a prime.", "assistant_thinking": "", "assistant_content": "7"},
        {"id": "n-3", "user_content": "Unanswered?", "assistant_thinking": "hmm", "assistant_content": None},
    ]
    wildchat: list[Any] = [
        b'{"id": "w-1", "user_content": "Traduis \xab bonjour \xbb", "assistant_thinking": null, "assistant_content": "hello"}',
        {"id": "w-2", "assistant_content": "orphan answer"},
    ]
    ultrachat = [{"id": "u-1", "user_content": "Tell me a fact.", "assistant_thinking": "Pick one.", "assistant_content": "Honey never spoils."}]
    texts = {
        "n-1": blocks(("user", "What is 2+2?"), ("thinking", "Add two and two."), ("assistant", "4")),
        "n-2": blocks(("user", "Name a prime."), ("assistant", "7")),
        "w-1": blocks(("user", "Traduis \ufffd bonjour \ufffd"), ("assistant", "hello")),
        "u-1": blocks(("user", "Tell me a fact."), ("thinking", "Pick one."), ("assistant", "Honey never spoils.")),
    }
    return FixtureCase(
        files={
            "NuminaMath-CoT/train.jsonl": json_lines(numina),
            "WildChat-1M/train.jsonl": json_lines(wildchat),
            "ultrachat_200k/train_sft.jsonl": json_lines(ultrachat),
            "MATH-500/test.jsonl": json_lines([{"id": "decoy", "user_content": "DECOY", "assistant_content": "DECOY"}]),
        },
        rows=4, texts=texts, all_texts=list(texts.values()),
        bad_rows={"missing_user_or_assistant": 2, "invalid_utf8_repaired": 1},
    )  # fmt: skip


@register_fixture("numinamath-1.5")
def numinamath(source: Any) -> FixtureCase:
    def row(problem: Any, solution: Any, p_ok: str = "Yes", s_ok: str = "Yes", **extra: Any) -> dict[str, Any]:
        base = {"problem": problem, "solution": solution, "answer": "", "problem_type": "Algebra", "question_type": "math-word-problem",
                "problem_is_valid": p_ok, "solution_is_valid": s_ok, "source": "olympiads", "synthetic": False}  # fmt: skip
        return base | extra

    rows = [
        row("Find x if 2x = 6.", "x = 3.", answer="3"),
        row("Bad problem.", "Whatever.", p_ok="No"),
        row("Good problem.", "Half a solution.", s_ok="Incomplete"),
        row("No solution here.", ""),
        row("  Compute 1+1.  ", "\n2\n", source="synthetic_math", synthetic=True),
    ]
    first = blocks(("user", "Find x if 2x = 6."), ("assistant", "x = 3."))
    second = blocks(("user", "Compute 1+1."), ("assistant", "2"))

    def check(frame: Any) -> None:
        by_text = {r["text"]: r for r in frame.to_dicts()}
        assert by_text[first]["problem_hash"] == hashlib.sha256(b"Find x if 2x = 6.").hexdigest()
        assert (by_text[first]["numina_source"], by_text[first]["answer"], by_text[first]["synthetic"]) == ("olympiads", "3", False)
        assert (by_text[second]["numina_source"], by_text[second]["synthetic"]) == ("synthetic_math", True)

    return FixtureCase(
        files={"data/train-00000-of-00001.parquet": parquet(rows), "data/test-00000-of-00001.parquet": parquet([row("DECOY", "DECOY")])},
        rows=2, all_texts=[first, second],
        bad_rows={"invalid_problem_or_solution": 2, "missing_problem_or_solution": 1},
        columns=("problem_hash", "numina_source", "answer", "problem_type", "question_type", "synthetic"), check=check,
    )  # fmt: skip


@register_fixture("numinamath-tir")
def numinamath_tir(source: Any) -> FixtureCase:
    tir = "```python\nprint(3*7)\n```\n```output\n21\n```\nThe answer is 21."
    rows = [
        {"problem": "What is 3*7?", "solution": tir, "messages": [msg("user", "What is 3*7?"), msg("assistant", tir)]},
        {"problem": "Is 9 prime?", "solution": "No.", "messages": [msg("system", "Think step by step."), msg("user", "Is 9 prime?"), msg("assistant", "No, 9 = 3*3.")]},
        {"problem": "Empty?", "solution": "", "messages": [msg("user", "Empty answer?"), msg("assistant", "")]},
        {"problem": "Story", "solution": "", "messages": [msg("narrator", "Once upon a time")]},
        {"problem": "None", "solution": "", "messages": []},
    ]
    texts = [
        blocks(("user", "What is 3*7?"), ("assistant", tir)),
        blocks(("system", "Think step by step."), ("user", "Is 9 prime?"), ("assistant", "No, 9 = 3*3.")),
    ]
    return FixtureCase(
        files={"data/train-00000-of-00001.parquet": parquet(rows)},
        rows=2, all_texts=texts, bad_rows={"malformed_messages": 2, "missing_messages": 1},
    )  # fmt: skip


@register_fixture("superior-reasoning")
def superior_reasoning(source: Any) -> FixtureCase:
    stage1 = [
        {"id": "s1", "input": "Prove that 1 is odd.", "output": "<think>\nIt is 2*0+1.\n</think>\n\n1 = 2*0 + 1, so it is odd."},
        {"id": "s2", "input": "Empty?", "output": "<think></think>"},
    ]
    stage2: list[Any] = [
        {"id": "s3", "input": "Say hi.", "output": "hi"},
        {"id": "s4", "input": None, "output": "orphan"},
        b'{"id": "s5", ',
    ]
    texts = {
        "s1": blocks(("user", "Prove that 1 is odd."), ("assistant", "It is 2*0+1.\n\n\n1 = 2*0 + 1, so it is odd.")),
        "s3": blocks(("user", "Say hi."), ("assistant", "hi")),
    }
    prefix = "Superior-Reasoning-SFT-gpt-oss-120b"
    return FixtureCase(
        files={f"{prefix}-stage1-train-data.jsonl": json_lines(stage1), f"{prefix}-stage2-train-data.jsonl": json_lines(stage2),
               f"{prefix}-stage3-eval-data.jsonl": json_lines([{"id": "decoy", "input": "DECOY", "output": "DECOY"}])},  # fmt: skip
        rows=2, texts=texts, all_texts=list(texts.values()), bad_rows={"missing_input_or_output": 2, "bad_json": 1},
    )  # fmt: skip


@register_fixture("synthetic-1")
def synthetic1(source: Any) -> FixtureCase:
    def row(rid: str, prompt: str, response: str, score: float | None) -> dict[str, Any]:
        return {"response_id": rid, "problem_id": f"p-{rid}", "task_type": "verifiable_math", "prompt": prompt,
                "llm_response": response, "score": score}  # fmt: skip

    rows = [
        row("r1", "Compute 2+3.", "<think>2+3=5</think>\nThe answer is 5.", 1.0),
        row("r2", "P2", "R2", 0.85),
        row("r3", "P3", "R3", 0.5),
        row("r4", "P4", "R4", 0.1),
        row("r5", "P5", "R5", None),
        row("r6", "P6", "R6", 0.2),
        row("r7", "", "R7", 1.0),
        row("r8", "P8", "<think></think>  ", 1.0),
    ]
    texts = {
        "r1": "Compute 2+3.\n\nGrade: correct\n\n2+3=5\nThe answer is 5.",
        "r2": "P2\n\nGrade: mostly correct\n\nR2",
        "r3": "P3\n\nGrade: partially correct\n\nR3",
        "r4": "P4\n\nGrade: incorrect\n\nR4",
        "r5": "P5\n\nGrade: unscored\n\nR5",
        "r6": "P6\n\nGrade: mostly incorrect\n\nR6",
    }
    return FixtureCase(
        files={"data/train-00000-of-00001.parquet": parquet(rows)},
        rows=6, texts=texts, all_texts=list(texts.values()), bad_rows={"missing_prompt_or_response": 2},
        columns=("task_type", "problem_id", "score"),
    )  # fmt: skip
