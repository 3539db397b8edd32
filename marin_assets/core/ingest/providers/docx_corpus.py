"""Word documents with extracted text from docxcorp.us (``api`` kind, transform ``docx_corpus_records``).

The pin is the manifest: the catalog url answers one document URL per line
(``https://docxcorp.us/documents/<64-hex id>.docx``) and its sha256 must equal the catalog's.
The manifest is stored as ``manifest.txt``; each listed document's extracted text
(``<origin>/extracted/<id>.txt``) is fetched and stored in Parquet batches of
``BATCH_DOCS`` documents (``id``, ``text``, ``url``, ``raw_url``, ``source``, ``language``,
``status``, ``utf8_repaired``). A document the site no longer serves is kept as a row with
``status = "not_found"`` (the transform counts and drops it) rather than failing the source.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

import polars as pl

from marin_assets.core.ingest.hub import IntegrityError
from marin_assets.core.ingest.providers import ProviderAccess, http, rawcopy
from marin_assets.core.ingest.providers.rawcopy import Progress, ProviderError
from marin_assets.core.runtime import storage

DATASET = "superdoc-dev/docx-corpus"
BATCH_DOCS = 1000
WORKERS = 8
_DOCUMENT_URL = re.compile(r"^(?P<origin>https?://[^/\s]+)/documents/(?P<id>[0-9a-f]{64})\.docx$")


def parse_manifest(text: str) -> tuple[list[tuple[str, str, str]], dict[str, int]]:
    """``(id, raw_url, extracted_url)`` per unique document, in manifest order, and counters."""
    docs: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    counts = {"manifest_rows": 0, "duplicate_ids": 0, "invalid_manifest_lines": 0}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        counts["manifest_rows"] += 1
        match = _DOCUMENT_URL.match(line)
        if match is None:
            counts["invalid_manifest_lines"] += 1
            continue
        doc_id = match.group("id")
        if doc_id in seen:
            counts["duplicate_ids"] += 1
            continue
        seen.add(doc_id)
        docs.append((doc_id, line, f"{match.group('origin')}/extracted/{doc_id}.txt"))
    return docs, counts


def _document_row(doc: tuple[str, str, str], language: str, source_name: str, access: ProviderAccess,
                  counters: http.FetchCounters) -> dict[str, Any]:  # fmt: skip
    doc_id, raw_url, text_url = doc
    row = {"id": doc_id, "text": None, "url": text_url, "raw_url": raw_url, "source": DATASET, "language": language,
           "status": "ok", "utf8_repaired": False}  # fmt: skip
    try:
        body, _ = http.fetch_bytes(text_url, what=f"source '{source_name}' document {doc_id}", policy=access.policy,
                                   mirrors=access.mirrors, counters=counters)
    except http.ProviderGoneError:
        return row | {"status": "not_found"}
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = body.decode("utf-8", errors="replace")
        row["utf8_repaired"] = True
    return row | {"text": text, "status": "ok" if text.strip() else "empty"}


def fetch(source: Any, layout: storage.Layout, progress: Progress = None, *, access: ProviderAccess = ProviderAccess()) -> dict[str, Any]:
    p = source.provider
    language = (parse_qs(urlsplit(p.url).query).get("lang") or [""])[0]
    fp = rawcopy.recipe_fingerprint("docx_corpus", source, batch_docs=BATCH_DOCS)
    uri = rawcopy.dest_uri(layout, rawcopy.url_key(p.url) + "/" + (language or "all"), p.revision, fp)
    if (stored := rawcopy.reused(uri)) is not None:
        return stored
    counters = http.FetchCounters()
    copy = rawcopy.RawCopy(uri)
    try:
        manifest, fetched = http.fetch_bytes(p.url, what=f"source '{source.name}' manifest", policy=access.policy, mirrors=access.mirrors,
                                             expected_sha256=p.sha256 or None, counters=counters)  # fmt: skip
    except IntegrityError as err:
        raise ProviderError(
            f"source '{source.name}': the manifest served at {http.display_url(p.url)} does not match the pinned sha256 "
            f"{p.sha256} ({err}); if the corpus was updated on purpose, review the new manifest and set provider.sha256 "
            f"and provider.revision in the catalog"
        ) from None
    storage.write_bytes(storage.join(uri, "manifest.txt"), manifest)
    docs, manifest_counts = parse_manifest(manifest.decode("utf-8", errors="replace"))
    if not docs:
        raise ProviderError(f"source '{source.name}': the manifest at {http.display_url(p.url)} lists no document; check the url")
    batches = [docs[i : i + BATCH_DOCS] for i in range(0, len(docs), BATCH_DOCS)]
    paths = [f"texts/part-{i:05d}-of-{len(batches):05d}.parquet" for i in range(len(batches))]
    done = copy.finished()
    rawcopy.say(progress, f"{source.name}: {len(docs)} documents in {len(batches)} batches, {len(done)} batches already stored")

    def task(index: int) -> dict[str, Any]:
        rows = [_document_row(doc, language, source.name, access, counters) for doc in batches[index]]
        frame = pl.DataFrame(rows, schema={"id": pl.Utf8, "text": pl.Utf8, "url": pl.Utf8, "raw_url": pl.Utf8, "source": pl.Utf8,
                                           "language": pl.Utf8, "status": pl.Utf8, "utf8_repaired": pl.Boolean})  # fmt: skip
        storage.write_parquet(frame, storage.join(uri, paths[index]))
        statuses = frame["status"].value_counts()
        record = {"path": paths[index], "size": storage.size(storage.join(uri, paths[index])), "documents": frame.height,
                  **{f"status_{s}": int(n) for s, n in statuses.iter_rows()}}  # fmt: skip
        copy.mark(record)
        rawcopy.say(progress, f"{source.name}: stored {paths[index]}")
        return record

    todo = [i for i, path in enumerate(paths) if path not in done]
    records, errors = rawcopy.run_tasks([lambda i=i: task(i) for i in todo], WORKERS)
    rawcopy.raise_first(errors, what=f"source '{source.name}'", done=len(done) + len(records), total=len(paths), uri=uri)
    by_path = done | {r["path"]: r for r in records}
    files = [by_path[path] for path in paths]
    return copy.complete({
        "kind": "docx_corpus_texts",
        "source": source.name,
        "url": http.display_url(p.url),
        "revision": p.revision,
        "fingerprint": fp,
        "manifest": {"size": fetched.size, "sha256": fetched.sha256},
        "files": [{"path": "manifest.txt", "size": fetched.size, "sha256": fetched.sha256}, *files],
        "counters": {
            **manifest_counts,
            "documents": len(docs),
            "not_found": sum(f.get("status_not_found", 0) for f in files),
            "empty": sum(f.get("status_empty", 0) for f in files),
            "files": len(files),
            "fetched": len(records),
            "reused": len(done),
            **counters.as_dict(),
        },
    })  # fmt: skip
