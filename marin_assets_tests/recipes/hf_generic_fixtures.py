"""Fixtures for every Hugging Face source on the generic recipe (text and id read as they are).

One builder serves them all: it writes a handful of rows in the source's own format and
text/id columns, at a path its file selection picks (inside its subset directory), plus
decoy files its recipe must not read: a sibling directory no catalog entry lists, paths its
exclude globs remove, and a README. Awkward rows: a blank text, a missing text, a duplicate
text, a whitespace run far past the cap, a row without an id, and for JSON lines a line with
invalid UTF-8 and a broken line.
"""

from __future__ import annotations

import posixpath
from typing import Any

from marin_assets.catalog.sources import load_catalog
from marin_assets.core.ingest import raw as ingest
from marin_assets.core.ingest.hub import select_paths
from marin_assets.core.ingest.normalize import input_format_of
from marin_assets_tests.recipes import FixtureCase, register_fixture
from marin_assets_tests.recipes.formats import RUN, encode, is_json

STEM = "part-00000"

def concrete_path(glob: str, ext: str, stem: str = STEM) -> str:
    """A file path that ``glob`` selects: ``**`` becomes one folder, ``*`` the stem."""
    path = glob.rstrip("/").replace("**", "train").replace("*", stem)
    return path if input_format_of(path) else f"{path}/{stem}.{ext}"


def own_paths(source: Any, ext: str) -> list[str]:
    """One path per allow glob (or one under the subset directory when there is no glob)."""
    provider = source.provider
    if provider.allow:
        return [concrete_path(g, ext) for g in provider.allow]
    base = provider.subdir or "data"
    return [f"{base}/{STEM}.{ext}"]


def decoy_paths(source: Any, ext: str) -> list[str]:
    provider = source.provider
    paths = ["README.md"]
    if provider.subdir:
        parent, leaf = posixpath.split(provider.subdir.rstrip("/"))
        paths.append(posixpath.join(parent, f"Unlisted-{leaf}", f"{STEM}.{ext}"))
    elif provider.allow:
        paths.append(f"unlisted/{STEM}.{ext}")
    paths.extend(concrete_path(g, ext) for g in provider.exclude)
    return paths


def _check_selection(source: Any, own: list[str], decoys: list[str]) -> None:
    """Fail early when the fixture paths do not exercise the catalog's selection as intended."""
    raw = {"uri": "memory://raw", "files": [{"path": p} for p in own + decoys]}
    chosen = [u.removeprefix("memory://raw/") for u in ingest.source_inputs(source, raw)]
    assert chosen == sorted(own), (source.name, chosen, own)
    assert select_paths(own, list(source.provider.allow) or None, list(source.provider.exclude) or None) == own


def generic_case(source: Any) -> FixtureCase:
    name, fmt = source.name, source.input_format
    ext = fmt
    field, id_field = source.text_field, source.id_field or "id"
    own, decoys = own_paths(source, ext), decoy_paths(source, ext)
    _check_selection(source, own, decoys)

    first = f"{name}: first document.\nIt has two lines."
    spaced = f"{name}: spaced" + " " * 300 + "out"
    no_id = f"{name}: a row without an id."
    expected: dict[str | None, str] = {
        f"{name}#1": first,
        f"{name}#2": f"{name}: spaced" + " " * RUN + "out",
        None: no_id,
    }

    def row(i: int, text: Any, **extra: Any) -> dict[str, Any]:
        r: dict[str, Any] = {id_field: f"{name}#{i}"}
        if text is not None:
            r[field] = text
        if fmt == "json.gz":  # Dolma layout
            r |= {"source": name, "added": "2024-06-01T00:00:00Z", "metadata": {"license": "cc-by-4.0", "row": i}}
        return r | {"meta": f"kept-{i}"} | extra

    rows: list[Any] = [
        row(1, first),
        row(2, spaced),
        row(3, "  \n\t  "),
        row(4, None),
        row(5, first),  # duplicate text: the first copy (#1) wins
        {field: no_id, "meta": "kept-none"},
    ]
    bad: dict[str, int] = {}
    if is_json(fmt):
        expected[f"{name}#6"] = f"caf\ufffd au lait from {name}"
        rows.append(f'{{"{id_field}": "{name}#6", "{field}": "caf'.encode() + b"\xe9" + f' au lait from {name}", "meta": "kept-6"}}'.encode())
        rows.append(f'{{"{id_field}": "{name}#7", "{field}": "cut off'.encode())
        bad = {"invalid_utf8_repaired": 1, "bad_json": 1}
    files = {own[0]: encode(fmt, rows)}
    for k, path in enumerate(own[1:], start=1):
        text = f"{name}: from selection glob {k + 1}."
        expected[f"{name}#9-{k}"] = text
        files[path] = encode(fmt, [{id_field: f"{name}#9-{k}", field: text, "meta": "kept-9"}])
    for path in decoys:
        files[path] = b"# decoy\n" if path.endswith(".md") else encode(fmt, [{id_field: "decoy", field: f"DECOY in {path}"}])
    return FixtureCase(
        files=files,
        rows=len(expected),
        texts=expected,
        all_texts=sorted(expected.values()),
        bad_rows=bad,
        counters={"empty_dropped": 2, "whitespace_compacted": 1, "duplicates": 1},
        columns=() if source.bare else ("meta",),
        absent_columns=("meta",) if source.bare else (),
    )


GENERIC_HF = [
    s.name
    for s in load_catalog()
    if s.provider.kind == "hf" and s.provider.repo_type != "bucket" and not s.transform
]
register_fixture(*GENERIC_HF)(generic_case)
