"""Code in context: whole repositories and pull requests serialized as one document each."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from marin_assets.core.ingest.transforms import register
from marin_assets.core.ingest.transforms.rendering import (
    Skip,
    as_list,
    bounded_batches,
    first_id,
    nonblank,
    per_row,
    reads_with,
    text_or_none,
)

# --------------------------------------------------------------------------- The Stack v3

SERIALIZATION = "repository_headers_directory_dfs_v1"


def directory_dfs_key(path: str) -> tuple[tuple[int, str], ...]:
    """Sort key for depth-first order with a directory's own files before its subdirectories.

    Each directory level sorts as (1, name) and the file name as (0, name), so within a
    directory files (0) come first, by name, then subdirectories (1) by name, recursively.
    """
    *directories, name = PurePosixPath(path).parts or ("",)
    return (*((1, d) for d in directories), (0, name))


@register("stack_v3_repository")
@reads_with(bounded_batches(64))
@per_row(("repo_path", "repo_id", "commit_id", "github_metadata", "num_files", "files"))
def stack_v3_repository(row: Mapping[str, Any]) -> dict[str, Any]:
    """One document per repository: ``Repository: <repo_path>``, then ``File: <path>`` blocks.

    Blocks are joined by a blank line; a block is the header line followed by the file
    content. Files follow ``directory_dfs_key`` order so a directory's files stay together.
    Files without string content are left out of the text but keep their metadata.
    ``file_metadata`` keeps every per-file field except the content (detected licences and
    licence type included), ``repo_id`` becomes ``source_id``. Drops ``missing_repo_path``
    and ``no_files`` (no file with content).
    """
    repo_path = nonblank(row.get("repo_path"))
    if repo_path is None:
        raise Skip("missing_repo_path")
    files = as_list(row.get("files"), "no_files", "malformed_files")
    if not all(isinstance(f, Mapping) and isinstance(f.get("file_path"), str) for f in files):
        raise Skip("malformed_files")
    ordered = sorted(files, key=lambda f: directory_dfs_key(f["file_path"]))
    blocks = [f"Repository: {repo_path}"]
    blocks.extend(f"File: {f['file_path']}\n{f['content']}" for f in ordered if isinstance(f.get("content"), str))
    if len(blocks) == 1:
        raise Skip("no_files")
    return {
        "text": "\n\n".join(blocks),
        "source_id": first_id(row, ("repo_id",)),
        "repo_path": repo_path,
        "commit_id": text_or_none(row.get("commit_id")),
        "num_files": row.get("num_files") if isinstance(row.get("num_files"), int) else len(files),
        "github_metadata": row.get("github_metadata") if isinstance(row.get("github_metadata"), Mapping) else None,
        "file_metadata": [{k: v for k, v in f.items() if k != "content"} for f in ordered],
        "serialization_format": SERIALIZATION,
    }


# --------------------------------------------------------------------------- daVinci-Dev ctx-native


def _issue_section(issue: Any) -> str | None:
    if not isinstance(issue, Mapping):
        return None
    title = nonblank(issue.get("title")) or ""
    parts = [f"# Related issue: {title}".rstrip()]
    if body := nonblank(issue.get("body")):
        parts.append(body)
    for comment in issue.get("comments") or []:
        if isinstance(comment, Mapping) and (text := nonblank(comment.get("body"))):
            parts.append(f"## Comment by {nonblank(comment.get('author')) or 'unknown'}\n{text}")
    return "\n\n".join(parts) if len(parts) > 1 or title else None


def _files_section(files: Any) -> str | None:
    blocks = []
    for f in files or []:
        if isinstance(f, Mapping) and (path := nonblank(f.get("path"))):
            blocks.append(f"## {path}\n```\n{text_or_none(f.get('content')) or ''}\n```")
    return "\n\n".join(["# Relevant files", *blocks]) if blocks else None


def _commits_section(commits: Any) -> str | None:
    blocks = []
    for commit in commits or []:
        if not isinstance(commit, Mapping):
            continue
        message = nonblank(commit.get("refined_message")) or nonblank(commit.get("message"))
        parts = [f"## Commit\n{message}"] if message else ["## Commit"]
        for diff in commit.get("diffs") or []:
            if isinstance(diff, Mapping) and (path := nonblank(diff.get("path"))):
                parts.append(f"### {path}\n```diff\n{text_or_none(diff.get('patch')) or ''}\n```")
        if len(parts) > 1 or message:
            blocks.append("\n\n".join(parts))
    return "\n\n".join(["# Commits", *blocks]) if blocks else None


@register("davinci_pr_markdown")
@reads_with(bounded_batches(256))
@per_row(("id", "pr_id", "repo_name", "repo_description", "title", "body", "related_issue", "pr_summary",
          "relevant_files", "commits"))  # fmt: skip
def davinci_pr_markdown(row: Mapping[str, Any]) -> dict[str, Any]:
    """A pull request with its context as Markdown sections, in reading order.

    ``# Repository`` (name, description), ``# Related issue: <title>`` (body, then
    ``## Comment by <author>`` per comment), ``# Pull request: <title>`` (body),
    ``# Summary`` (the LLM-written PR summary), ``# Relevant files`` (``## <path>`` and the
    file in a code fence), ``# Commits`` (``## Commit`` with the refined message, else the
    original, then ``### <path>`` and the diff in a ``diff`` fence). Empty sections are left
    out; sections are joined by a blank line. Drops ``missing_repo_or_title``.
    """
    repo, title = nonblank(row.get("repo_name")), nonblank(row.get("title"))
    if repo is None or title is None:
        raise Skip("missing_repo_or_title")
    head = f"# Repository\nName: {repo}"
    if description := nonblank(row.get("repo_description")):
        head += f"\nDescription: {description}"
    pull = f"# Pull request: {title}"
    if body := nonblank(row.get("body")):
        pull += f"\n\n{body}"
    summary = nonblank(row.get("pr_summary"))
    sections = [
        head,
        _issue_section(row.get("related_issue")),
        pull,
        f"# Summary\n{summary}" if summary else None,
        _files_section(row.get("relevant_files")),
        _commits_section(row.get("commits")),
    ]
    return {
        "text": "\n\n".join(s for s in sections if s),
        "source_id": first_id(row, ("id", "pr_id")),
        "repo_name": repo,
    }
