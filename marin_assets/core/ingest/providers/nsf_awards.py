"""NSF award records (``api`` kind, transform ``nsf_award_abstracts``).

The catalog url lists the per-year archives (JSON ``{"files": [{"fileName": "2020.zip",
"downloadUrl": <presigned link>}, ...]}``); the catalog revision names the years,
``"<first>-<last>"`` (``1960-2025``). Each year's zip of per-award JSON files is fetched
verified (length, every member's CRC) and stored as ``awards/<year>.jsonl.zst``, one row per
award: the ten award fields the recipe keeps (as strings), the member name, and
``parse_error`` for a file that is not a JSON object. Presigned links carry credentials in
their query string: they are never logged or stored.
"""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
import zlib
from typing import Any

import zstandard

from marin_assets.core.ingest.providers import ProviderAccess, http, rawcopy
from marin_assets.core.ingest.providers.rawcopy import Progress, ProviderError
from marin_assets.core.runtime import storage

AWARD_FIELDS = (
    "awd_id", "awd_titl_txt", "awd_abstract_narration", "awd_eff_date", "awd_exp_date", "awd_amount",
    "dir_abbr", "org_dir_long_name", "div_abbr", "org_div_long_name",
)  # fmt: skip
LIST_HEADERS = {"Accept": "application/json", "Origin": "https://www.nsf.gov", "Referer": "https://www.nsf.gov/"}
WORKERS = 4
MAX_AWARD_BYTES = 16 << 20  # one award's JSON is a few KB; a larger member is counted, not read
_YEARS = re.compile(r"^(\d{4})-(\d{4})$")


def year_range(source: Any) -> range | None:
    revision = source.provider.revision
    if not revision:
        return None
    match = _YEARS.match(revision)
    if not match or int(match.group(1)) > int(match.group(2)):
        raise ProviderError(f"source '{source.name}': revision {revision!r} must name the years as '<first>-<last>'; fix the catalog entry")
    return range(int(match.group(1)), int(match.group(2)) + 1)


def year_links(listing: Any, source_name: str) -> dict[int, str]:
    """Year -> presigned link of every ``<year>.zip`` in the listing."""
    files = listing.get("files") if isinstance(listing, dict) else None
    if not isinstance(files, list):
        raise ProviderError(f"source '{source_name}': the listing has no 'files' array; the API changed: update the provider")
    links = {}
    for entry in files:
        name = str(entry.get("fileName", "")) if isinstance(entry, dict) else ""
        stem = name.removesuffix(".zip")
        if name.endswith(".zip") and stem.isdigit() and entry.get("downloadUrl"):
            links[int(stem)] = str(entry["downloadUrl"])
    return links


def _as_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return str(value)


def award_row(name: str, content: bytes, year: int) -> dict[str, Any]:
    try:
        text, repaired = content.decode("utf-8"), False
    except UnicodeDecodeError:
        text, repaired = content.decode("utf-8", errors="replace"), True
    row: dict[str, Any] = {"award_file": name, "year": year, "utf8_repaired": repaired, "parse_error": None}
    try:
        award = json.loads(text)
    except ValueError as err:
        award, row["parse_error"] = {}, f"invalid JSON: {err.msg}"
    if not isinstance(award, dict):
        award, row["parse_error"] = {}, row["parse_error"] or "not a JSON object"
    return row | {field: _as_text(award.get(field)) for field in AWARD_FIELDS}


def _check_zip(body: Any, max_member_bytes: int | None = None) -> None:
    """Every member this provider reads passes its CRC check, read in pieces (a member over the limit is not read)."""
    limit = max_member_bytes or MAX_AWARD_BYTES
    try:
        with zipfile.ZipFile(body) as archive:
            for member in archive.infolist():
                if member.is_dir() or member.file_size > limit:
                    continue
                with archive.open(member) as handle:  # the CRC is checked at the member's end
                    while handle.read(1 << 20):
                        pass
    except zipfile.BadZipFile as err:
        if "CRC" in str(err):
            raise http.CorruptBody(f"a member fails its CRC check ({err})") from None
        raise http.CorruptBody(f"not a readable zip ({err})") from None
    except (OSError, EOFError, zlib.error) as err:
        raise http.CorruptBody(f"not a readable zip ({err})") from None


def _member_bytes(archive: zipfile.ZipFile, member: zipfile.ZipInfo, limit: int) -> bytes | None:
    """The member's bytes, or None when it holds more than ``limit`` (at most ``limit + 1`` bytes are inflated)."""
    if member.file_size > limit:
        return None
    with archive.open(member) as handle:
        content = handle.read(limit + 1)
    return None if len(content) > limit else content


def store_awards(local: str, year: int, out: Any, max_member_bytes: int | None = None) -> dict[str, int]:
    """Write one row per award file of the year's zip at ``local`` to ``out`` as zstd JSON lines; the counts.

    A member larger than ``max_member_bytes`` is not read: its row carries a ``parse_error`` naming
    its size and offset in the archive (counted as ``too_large``), so a zip bomb costs no memory.
    """
    limit = max_member_bytes or MAX_AWARD_BYTES
    counts = {"awards": 0, "parse_errors": 0, "utf8_repaired": 0, "too_large": 0}
    writer = zstandard.ZstdCompressor(level=3, write_checksum=True).stream_writer(out, closefd=False)
    with zipfile.ZipFile(local) as archive:
        for member in archive.infolist():
            if member.is_dir() or not member.filename.endswith(".json"):
                continue
            content = _member_bytes(archive, member, limit)
            if content is None:
                row = award_row(member.filename, b"", year) | {"parse_error": (
                    f"award file of {member.file_size} bytes at offset {member.header_offset} of the archive, over the "
                    f"{limit}-byte limit: not read")}  # fmt: skip
                counts["too_large"] += 1
            else:
                row = award_row(member.filename, content, year)
                counts["awards"] += 1
            counts["parse_errors"] += row["parse_error"] is not None
            counts["utf8_repaired"] += row["utf8_repaired"]
            writer.write(json.dumps(row, ensure_ascii=False).encode("utf-8") + b"\n")
    writer.flush(zstandard.FLUSH_FRAME)
    return counts


def fetch(source: Any, layout: storage.Layout, progress: Progress = None, *, access: ProviderAccess = ProviderAccess()) -> dict[str, Any]:
    p = source.provider
    years = year_range(source)
    fp = rawcopy.recipe_fingerprint("nsf_awards", source, fields=list(AWARD_FIELDS))
    uri = rawcopy.dest_uri(layout, rawcopy.url_key(p.url), p.revision, fp)
    if (stored := rawcopy.reused(uri)) is not None:
        return stored
    counters = http.FetchCounters()
    listing = http.fetch_json(p.url, what=f"source '{source.name}' year listing", policy=access.policy, mirrors=access.mirrors, headers=LIST_HEADERS, counters=counters)
    links = year_links(listing, source.name)
    wanted = sorted(links) if years is None else [y for y in years if y in links]
    missing = [] if years is None else [y for y in years if y not in links]
    if not wanted:
        raise ProviderError(f"source '{source.name}': the listing at {http.display_url(p.url)} offers no year of {p.revision or 'any'}; check the url and revision")
    if missing:
        rawcopy.say(progress, f"{source.name}: the listing offers no archive for {len(missing)} years: {', '.join(map(str, missing))}")
    copy = rawcopy.RawCopy(uri)
    done = copy.finished()
    paths = {year: f"awards/{year}.jsonl.zst" for year in wanted}

    def task(year: int, staging: str) -> dict[str, Any]:
        local = os.path.join(staging, f"{year}.zip")
        hint = "the presigned link may have expired: rerun raw_files (years already stored are kept)"
        try:
            with open(local, "w+b") as body:
                fetched = http.fetch_into(links[year], body, what=f"source '{source.name}' year {year}", policy=access.policy, mirrors=access.mirrors,
                                          validate=_check_zip, access_hint=hint, counters=counters)  # fmt: skip
            buffer = io.BytesIO()
            counts = store_awards(local, year, buffer)
            storage.write_bytes(storage.join(uri, paths[year]), buffer.getvalue())
        finally:
            if os.path.exists(local):
                os.remove(local)
        record = {"path": paths[year], "year": year, "size": len(buffer.getvalue()), "archive_size": fetched.size,
                  "archive_sha256": fetched.sha256, **counts}  # fmt: skip
        copy.mark(record)
        rawcopy.say(progress, f"{source.name}: stored {year} ({counts['awards']} awards)")
        return record

    todo = [y for y in wanted if paths[y] not in done]
    with rawcopy.staging_dir(access.staging_dir, "marin-nsf-") as staging:
        records, errors = rawcopy.run_tasks([lambda y=y: task(y, staging) for y in todo], WORKERS)
    rawcopy.raise_first(errors, what=f"source '{source.name}'", done=len(done) + len(records), total=len(wanted), uri=uri)
    by_path = done | {r["path"]: r for r in records}
    files = [by_path[paths[y]] for y in wanted]
    return copy.complete({
        "kind": "nsf_award_years",
        "source": source.name,
        "url": http.display_url(p.url),
        "revision": p.revision,
        "fingerprint": fp,
        "missing_years": missing,
        "files": files,
        "counters": {
            "files": len(files),
            "years_missing": len(missing),
            "awards": sum(f["awards"] for f in files),
            "parse_errors": sum(f["parse_errors"] for f in files),
            "too_large": sum(f.get("too_large", 0) for f in files),
            "bytes": sum(f["archive_size"] for f in files),
            "fetched": len(records),
            "reused": len(done),
            **counters.as_dict(),
        },
    })  # fmt: skip
