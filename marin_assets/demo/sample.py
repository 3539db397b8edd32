"""The bundled offline sample: a few catalog sources served by the local Hub server.

The sample reuses real catalog entries (their repo ids, pinned revisions, file layouts and
formats) and fills them with small, realistic text generated from the Python standard library
running this code: module and class documentation, source files, and prose built from
docstrings. It plants what the later stages must find: exact copies within and across
sources, near-duplicates made by editing a few words, and documents that copy eval items.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib
import inspect
import io
import json
import random
from collections.abc import Iterable

import polars as pl

# Catalog sources the demo materializes; each uses a different provider format.
DEMO_SOURCES = (
    "cp/peps",
    "cp/libretexts",
    "starcoder2/documentation",
    "dolma_code_prose",
    "eai-taxonomy-code-w-dclm",
)

_MODULES = (
    "abc argparse array ast asyncio base64 bisect calendar cmath codecs collections colorsys "
    "configparser contextlib copy csv dataclasses datetime decimal difflib dis email enum filecmp "
    "fileinput fnmatch fractions functools getopt gettext glob graphlib gzip hashlib heapq hmac html "
    "http imaplib inspect io ipaddress itertools json keyword linecache locale logging lzma mailbox "
    "math mimetypes numbers operator optparse os pathlib pickle pkgutil platform plistlib poplib "
    "pprint profile queue quopri random re reprlib sched secrets selectors shelve shlex shutil "
    "signal smtplib socket sqlite3 ssl stat statistics string struct subprocess symtable tarfile "
    "tempfile textwrap threading timeit tokenize trace traceback turtle types typing unittest "
    "urllib uuid warnings wave weakref webbrowser xml zipfile zipimport zlib"
).split()


@dataclasses.dataclass(frozen=True)
class SampleText:
    title: str
    text: str


def _modules() -> list[object]:
    found = []
    for name in _MODULES:
        try:
            found.append(importlib.import_module(name))
        except Exception:  # noqa: BLE001 - a stdlib module missing on this build is simply skipped
            continue
    return found


def module_docs(limit_chars: int = 6000) -> list[SampleText]:
    """One documentation page per module: its docstring plus its public members' docstrings."""
    pages = []
    for module in _modules():
        parts = [inspect.getdoc(module) or ""]
        for name, member in sorted(vars(module).items()):
            if name.startswith("_") or not (inspect.isclass(member) or inspect.isfunction(member)):
                continue
            doc = inspect.getdoc(member)
            if doc and getattr(member, "__module__", "") == module.__name__:
                parts.append(f"{name}\n\n{doc}")
        text = "\n\n".join(p for p in parts if p.strip())[:limit_chars]
        if len(text.split()) >= 40:
            pages.append(SampleText(module.__name__, text))
    return pages


def class_docs(limit_chars: int = 4000) -> list[SampleText]:
    """One page per documented public class, with its methods' docstrings."""
    pages = []
    for module in _modules():
        for name, member in sorted(vars(module).items()):
            if name.startswith("_") or not inspect.isclass(member) or member.__module__ != module.__name__:
                continue
            doc = inspect.getdoc(member) or ""
            methods = [
                f"{name}.{m}: {inspect.getdoc(f)}"
                for m, f in sorted(vars(member).items())
                if not m.startswith("_") and inspect.isfunction(f) and inspect.getdoc(f)
            ]
            text = "\n\n".join([doc, *methods])[:limit_chars]
            if len(text.split()) >= 30:
                pages.append(SampleText(f"{module.__name__}.{name}", text))
    return pages


def source_files(limit_chars: int = 8000) -> list[SampleText]:
    """Source code of pure-Python stdlib modules (a slice of each file)."""
    pages = []
    for module in _modules():
        try:
            code = inspect.getsource(module)
        except (OSError, TypeError):
            continue
        pages.append(SampleText(module.__name__, code[:limit_chars]))
    return pages


def edit_words(text: str, every: int, rng: random.Random) -> str:
    """A near-duplicate: replace one word in every ``every`` words, keeping line structure."""
    lines = text.split("\n")
    count = 0
    out = []
    for line in lines:
        words = line.split(" ")
        for i, word in enumerate(words):
            if word:
                count += 1
                if count % every == 0:
                    words[i] = rng.choice(["notably", "indeed", "moreover", "value", "object", "result"])
        out.append(" ".join(words))
    return "\n".join(out)


def _jsonl(records: Iterable[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _zstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=3).compress(data)


def _parquet(records: list[dict]) -> bytes:
    buf = io.BytesIO()
    pl.DataFrame(records).write_parquet(buf)
    return buf.getvalue()


def eval_copies(eval_items: list[dict], rng: random.Random) -> list[str]:
    """Pages that copy eval items: a verbatim copy and one embedded in a longer page."""
    pages = []
    for item in eval_items[:3]:
        question, answer = item["question"], item.get("answer", "")
        pages.append(f"Practice problem\n\n{question}\n\nAnswer: {answer}")
        pages.append(
            "Study notes from an online course forum. Several students asked about this one.\n\n"
            f"{question}\n\nThe accepted answer was {answer}. Remember to show your working "
            "and to check units before submitting the final result."
        )
    rng.shuffle(pages)
    return pages


def build_sample_files(eval_items: list[dict] | None = None, seed: int = 7) -> dict[str, dict[str, bytes]]:
    """Files per catalog source, in the provider's own layout and format."""
    rng = random.Random(seed)
    modules = module_docs()
    classes = class_docs()
    code = source_files()
    half = len(modules) // 2

    peps = [{"id": f"pep-{i:04d}", "text": m.text, "source": "peps", "metadata": {"title": m.title}} for i, m in enumerate(modules[:half])]
    # exact copy within the source (set aside by normalize) and empty rows (dropped and counted)
    peps.append(dict(peps[0], id="pep-dup"))
    peps.append({"id": "pep-empty", "text": "   \n  ", "source": "peps", "metadata": {"title": "blank"}})

    libre = [{"id": f"lt-{i:05d}", "text": c.text, "source": "libretexts", "metadata": {"title": c.title}} for i, c in enumerate(classes[: len(classes) // 2])]
    # cross-source exact copies and near-duplicates of the peps pages (one word in 20 changed)
    for j, page in enumerate(modules[:10]):
        libre.append({"id": f"lt-copy-{j}", "text": page.text, "source": "libretexts", "metadata": {"title": page.title}})
    for j, page in enumerate(modules[10:25]):
        libre.append({"id": f"lt-near-{j}", "text": edit_words(page.text, 20, rng), "source": "libretexts", "metadata": {"title": page.title}})

    docs = [{"id": f"doc-{i:05d}", "content": c.text, "repo": "python/cpython", "path": f"Doc/{c.title}.rst"} for i, c in enumerate(classes[len(classes) // 2 :])]
    docs += [{"id": f"doc-m{i:04d}", "content": m.text, "repo": "python/cpython", "path": f"Doc/library/{m.title}.rst"} for i, m in enumerate(modules[half:])]
    docs.append({"id": "doc-ws", "content": "Whitespace test" + " " * 5000 + "after a long run of spaces.", "repo": "python/cpython", "path": "Doc/ws.rst"})

    prose = [{"id": f"dcp-{i:05d}", "text": c.text, "metadata": {"module": c.title}} for i, c in enumerate(code[: len(code) // 2])]
    eai = [{"id": f"eai-{i:05d}", "text": c.text, "url": f"https://example.org/{c.title}"} for i, c in enumerate(code[len(code) // 2 :])]
    for j, text in enumerate(eval_copies(eval_items or [], rng)):
        eai.append({"id": f"eai-eval-{j}", "text": text, "url": f"https://forum.example.org/t/{j}"})

    return {
        "cp/peps": {"peps/peps-00000.json.gz": _gzip(_jsonl(peps))},
        "cp/libretexts": {
            "libretexts/part-00000.jsonl.gz": _gzip(_jsonl(libre[: len(libre) // 2])),
            "libretexts/part-00001.jsonl.gz": _gzip(_jsonl(libre[len(libre) // 2 :])),
        },
        "starcoder2/documentation": {"documentation/train-00000-of-00001.parquet": _parquet(docs)},
        "dolma_code_prose": {"dolma_code_prose/shard_0/0000.jsonl.zst": _zstd(_jsonl(prose))},
        "eai-taxonomy-code-w-dclm": {"data/train-00000-of-00001.parquet": _parquet(eai)},
    }
