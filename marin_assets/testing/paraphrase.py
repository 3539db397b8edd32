"""The paraphrase fixture: eval items reworded by hand, planted in documents, beside clean
documents found on the machine, for the semantic decontamination bench and tests.

Eval items live in ``paraphrase_fixture/{qa,math,code}.txt`` (prose questions and answers, math
word problems, code problems), each with a hand-written paraphrase of the whole row: reworded,
reordered, identifiers renamed, numbers written out. Each item carries its generation: 0 for
those files, then 1 to 5 for the fresh generations ``fresh_*.txt`` to ``fresh5_*.txt``, each
written later than the one before and without looking at the tier. The
newest generation present is the judged set, run through the tier once its rule is fixed; every
earlier one is tuning material (``split``). Documents are assembled at run time, never
committed: each paraphrase standalone and inside a long document of other text (man pages and
package documentation, or a standard-library module for code), and clean documents that copy
no item: standard-library functions, man pages, package documentation and generated math word
problems (same topics as the items, so precision means something).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import glob
import gzip
import os
import random
import re
import sysconfig
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from marin_assets.core.decon.params import EvalRow

FIXTURE = Path(__file__).with_name("paraphrase_fixture")
SETS = {"qa.txt": "fixture_qa", "math.txt": "fixture_math", "code.txt": "fixture_code"}
GENERATIONS = ("", "fresh_", "fresh2_", "fresh3_", "fresh4_", "fresh5_")  # file prefix of each generation, oldest first
PARAPHRASE = "paraphrase"
LONG_MIN_WORDS = 1_500  # a long document: this many words of other text around the item
LONG_OFFSET_WORDS = 400  # the item starts past the part a document's own embedding sees


@dataclasses.dataclass(frozen=True)
class Item:
    eval_set: str
    row_id: str
    fields: tuple[tuple[str, str], ...]
    paraphrase: str
    generation: int = 0  # index in GENERATIONS: 0 for the first files, k for the k-th fresh generation

    @property
    def text(self) -> str:
        return "\n\n".join(text for _, text in self.fields)

    def row(self) -> EvalRow:
        return EvalRow(self.eval_set, self.row_id, self.text, self.fields)


def _parse(path: Path, eval_set: str, generation: int) -> list[Item]:
    items, current, field = [], None, None
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        if line.startswith("#") and current is None:
            continue
        if line.startswith("=== "):
            current = {"id": line[4:].strip(), "fields": {}}
            items.append(current)
        elif line.startswith("--- "):
            field = line[4:].strip()
            current["fields"][field] = ""
        elif current is not None and field is not None:
            current["fields"][field] += line
    out = []
    for raw in items:
        fields = {k: v.strip("\n") for k, v in raw["fields"].items()}
        paraphrase = fields.pop(PARAPHRASE, "")
        out.append(Item(eval_set, raw["id"], tuple(fields.items()), paraphrase, generation))
    return out


def load_items(fixture: Path = FIXTURE) -> list[Item]:
    """Every item of the three sets, generation by generation, in file order (a generation whose
    files are absent is left out). Row ids must be unique within a set across generations: a
    flag is judged by the row it names."""
    items = [item for generation, prefix in enumerate(GENERATIONS) for name, eval_set in SETS.items()
             if (fixture / f"{prefix}{name}").exists()
             for item in _parse(fixture / f"{prefix}{name}", eval_set, generation)]
    seen = Counter((x.eval_set, x.row_id) for x in items)
    repeated = sorted(f"{s}:{r}" for (s, r), n in seen.items() if n > 1)
    if repeated:
        raise ValueError(f"paraphrase fixture {fixture}: row ids used twice within a set: {repeated}; "
                         "give each generation's rows ids of their own")
    return items


def split(items: Sequence[Item]) -> tuple[list[Item], list[Item], list[Item]]:
    """(calibration, held out, judged), fixed by the files. Judged: the newest generation present,
    run through the tier only once its rule is fixed; the goals are judged on it. Every earlier
    generation is tuning material: within each, even rows calibrate (the thresholds are set on
    them) and odd rows are held out (looked at while the rule was tuned, reported, not judged)."""
    newest = max((x.generation for x in items), default=0)
    tuning = [[x for x in items if x.generation == g] for g in range(newest)]
    return ([x for g in tuning for x in g[0::2]], [x for g in tuning for x in g[1::2]],
            [x for x in items if x.generation == newest])


# ----------------------------------------------------------------------------- text found on the machine


def _stdlib_files() -> list[str]:
    root = os.path.dirname(os.__file__)
    return sorted(glob.glob(os.path.join(root, "*.py")))


@functools.lru_cache(maxsize=1)
def _stdlib_trees() -> tuple[tuple[str, ast.Module], ...]:
    """(source, syntax tree) of the standard library's modules (tests left out), parsed once."""
    out = []
    for path in _stdlib_files():
        if "/test" in path or "idlelib" in path:
            continue
        try:
            source = Path(path).read_text(encoding="utf-8")
            out.append((source, ast.parse(source)))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
    return tuple(out)


def python_functions(limit: int, seed: int = 3) -> list[str]:
    """Standard-library functions of 4-40 lines (real code on the same topic as the code items)."""
    found = []
    for source, tree in _stdlib_trees():
        lines = source.splitlines(keepends=True)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and 4 <= node.end_lineno - node.lineno <= 40:
                found.append("".join(lines[node.lineno - 1:node.end_lineno]))
    return random.Random(seed).sample(found, min(limit, len(found)))


def python_modules(limit: int, seed: int = 4) -> list[str]:
    """Whole standard-library modules of at least ``LONG_MIN_WORDS`` words (hosts for code items)."""
    texts = []
    for path in _stdlib_files():
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if len(text.split()) >= LONG_MIN_WORDS:
            texts.append(text[:60_000])
    return random.Random(seed).sample(texts, min(limit, len(texts)))


def _first_texts(paths: list[str], read: Callable[[str], str], limit: int, seed: int, min_words: int, cap: int) -> list[str]:
    """The first ``limit`` texts of ``min_words`` words or more (cut to ``cap`` characters) among
    ``paths`` in an order fixed by ``seed``; a file that does not read as text is passed over."""
    random.Random(seed).shuffle(paths)
    texts = []
    for path in paths:
        try:
            text = read(path)
        except (UnicodeDecodeError, OSError):
            continue
        if len(text.split()) >= min_words:
            texts.append(text[:cap])
        if len(texts) >= limit:
            break
    return texts


def package_modules(limit: int, seed: int = 9) -> list[str]:
    """Installed packages' modules (not the standard library, whose modules host the planted
    code items) of at least ``LONG_MIN_WORDS`` words: long clean code, for the window look."""
    found = glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "*", "*.py"))
    paths = sorted(p for p in found if "/test" not in p)
    return _first_texts(paths, lambda p: Path(p).read_text(encoding="utf-8"), limit, seed, LONG_MIN_WORDS, 60_000)


_TROFF = [(re.compile(r"\\f[BIRP]|\\f\(..|\\s[-+]?\d|\\&|\\c"), ""), (re.compile(r"\\-"), "-"),
          (re.compile(r"\\\(.."), " "), (re.compile(r"\\[e\\]"), r"\\")]


def _man_text(path: str) -> str:
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as handle:
        raw = handle.read(200_000)
    out = []
    for line in raw.splitlines():
        if line.startswith((".\\\"", "'\\\"")):
            continue
        if line.startswith((".", "'")):
            parts = line.split(None, 1)
            if parts[0] in (".SH", ".SS", ".B", ".I", ".BR", ".IR", ".BI", ".IB", ".RB", ".RI", ".TP", ".IP") and len(parts) > 1:
                line = parts[1].replace('"', "")
            else:
                continue
        for pattern, repl in _TROFF:
            line = pattern.sub(repl, line)
        out.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()


def man_pages(limit: int, seed: int = 5, min_words: int = 150) -> list[str]:
    """Man pages as plain text (real prose about commands), ``min_words`` words or more."""
    paths = sorted(p for p in glob.glob("/usr/share/man/man[1-8]/*.gz") if "gcloud" not in p)
    return _first_texts(paths, _man_text, limit, seed, min_words, 40_000)


def package_docs(limit: int, seed: int = 6, min_words: int = 150) -> list[str]:
    """Package documentation on the machine (READMEs, changelogs, .md/.rst/.txt files)."""
    site = os.path.dirname(os.path.dirname(os.path.abspath(re.__file__)))  # where the standard library lives
    paths = sorted(set(glob.glob("/usr/share/doc/*/*.txt") + glob.glob("/usr/share/doc/*/README*")
                       + glob.glob("/usr/share/doc/*/*.md") + glob.glob(os.path.join(site, "*", "site-packages", "*", "*.md"))
                       + glob.glob(os.path.join(site, "*", "site-packages", "*", "*.rst"))))

    def read(path: str) -> str:  # a compressed or special file counts as no text
        return "" if path.endswith(".gz") or not os.path.isfile(path) else Path(path).read_text(encoding="utf-8")

    return _first_texts(paths, read, limit, seed, min_words, 40_000)


_NAMES = ["Aiko", "Bruno", "Chloe", "Dmitri", "Esme", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kofi", "Lucia",
          "Mateo", "Nadia", "Oscar", "Paula", "Quinn", "Rosa", "Sami", "Tariq", "Una", "Viktor", "Wen", "Yusuf"]
_TEMPLATES = [
    ("{n} buys {a} packs of stickers with {b} stickers in each pack and gives {c} stickers to a friend. How many "
     "stickers does {n} keep?", "{n} has {a} * {b} = {ab} stickers and keeps {ab} - {c} = {abc} stickers."),
    ("A bus carries {a} passengers. At the first stop {b} people get off and {c} get on. How many passengers are "
     "on the bus now?", "{a} - {b} + {c} = {amb_c} passengers are on the bus."),
    ("{n} saves {a} dollars every week. How many weeks does {n} need to save {ab} dollars for a bicycle?",
     "{ab} / {a} = {b} weeks."),
    ("A field is {a} metres long and {b} metres wide. What is its perimeter?",
     "The perimeter is 2 * ({a} + {b}) = {per} metres."),
    ("{n} runs {a} kilometres on Monday and {b} kilometres on Tuesday. How far does {n} run over the two days?",
     "{a} + {b} = {apb} kilometres."),
    ("A crate holds {a} bottles. How many bottles are in {b} crates, and how many crates are needed for {ab} "
     "bottles?", "{b} crates hold {a} * {b} = {ab} bottles, so {ab} bottles need {b} crates."),
    ("{n} is {a} years old and her brother is {b} years older. How old will her brother be in {c} years?",
     "He is {a} + {b} = {apb} now and will be {apb} + {c} = {apbc}."),
    ("A tap fills a bucket with {ab} litres in {b} minutes. How many litres flow out of the tap per minute?",
     "{ab} / {b} = {a} litres per minute."),
    ("A ticket costs {a} dollars for adults and {b} dollars for children. What do {c} adults and {c} children "
     "pay together?", "{c} * ({a} + {b}) = {cab} dollars."),
    ("{n} has {ab} marbles and shares them equally among {b} friends. How many marbles does each friend get?",
     "{ab} / {b} = {a} marbles each."),
    ("A shop sold {a} umbrellas on a rainy day and {b} fewer the next day. How many umbrellas did it sell over "
     "both days?", "The next day it sold {a} - {b} = {amb}, so {a} + {amb} = {two_days} in all."),
    ("A recipe uses {a} grams of sugar per cake. How much sugar is needed for {b} cakes, in grams?",
     "{a} * {b} = {ab} grams."),
]


def docstrings(limit: int, seed: int = 8, min_words: int = 60) -> list[str]:
    """Long docstrings of standard-library modules, classes and functions (prose about code)."""
    found = []
    for _, tree in _stdlib_trees():
        found += [d for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))
                  for d in [ast.get_docstring(n) or ""] if len(d.split()) >= min_words]
    return random.Random(seed).sample(found, min(limit, len(found)))


def math_word_problems(n: int, seed: int = 7) -> list[str]:
    """Generated word problems with worked answers (the math items' topic, none of their problems)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        question, answer = rng.choice(_TEMPLATES)
        a, b, c = rng.randint(12, 90), rng.randint(2, 11), rng.randint(2, 9)
        values = {"n": rng.choice(_NAMES), "a": a, "b": b, "c": c, "ab": a * b, "abc": a * b - c, "amb_c": a - b + c,
                  "per": 2 * (a + b), "apb": a + b, "apbc": a + b + c, "cab": c * (a + b), "amb": a - b,
                  "two_days": 2 * a - b}
        out.append(question.format(**values) + "\n" + answer.format(**values))
    return out


def clean_documents(per_kind: int = 700, seed: int = 0) -> list[tuple[str, str]]:
    """(kind, text) of documents that copy no item: ``code`` (standard-library functions),
    ``man`` (man pages), ``doc`` (package documentation), ``docstring`` (prose about code),
    ``math`` (generated word problems), ``module`` (long modules of installed packages)."""
    docs = [("code", t) for t in python_functions(per_kind, seed + 3)]
    docs += [("man", t) for t in man_pages(per_kind, seed + 5)]
    docs += [("doc", t) for t in package_docs(per_kind // 2, seed + 6)]
    docs += [("docstring", t) for t in docstrings(per_kind // 2, seed + 8)]
    docs += [("math", t) for t in math_word_problems(per_kind // 2, seed + 7)]
    docs += [("module", t) for t in package_modules(per_kind // 4, seed + 9)]
    return docs


def _plant(host: str, text: str, rng: random.Random) -> str:
    """``text`` as a paragraph of ``host``, starting past its first ``LONG_OFFSET_WORDS`` words."""
    paragraphs = host.split("\n\n")
    starts, seen = [], 0
    for k, paragraph in enumerate(paragraphs):
        if seen >= LONG_OFFSET_WORDS:
            starts.append(k)
        seen += len(paragraph.split())
    at = rng.choice(starts[: max(1, len(starts) // 2)]) if starts else len(paragraphs)
    return "\n\n".join(paragraphs[:at] + [text] + paragraphs[at:])


def planted_documents(items: Sequence[Item], seed: int = 1) -> list[tuple[str, Item, str]]:
    """(kind, item, text): each item's paraphrase ``standalone`` and ``long`` (inside a document
    of at least ``LONG_MIN_WORDS`` other words: a standard-library module for code, man pages and
    package documentation otherwise). Each generation is planted with a seed of its own, so
    adding one leaves the documents of the others as they were."""
    generations = sorted({x.generation for x in items})
    return [doc for g in generations for doc in _planted([x for x in items if x.generation == g], seed + 100 * g)]


def _planted(items: Sequence[Item], seed: int) -> list[tuple[str, Item, str]]:
    rng = random.Random(seed)
    prose = [t for t in man_pages(400, seed + 11, min_words=300) + package_docs(200, seed + 12, min_words=300)]
    modules = python_modules(len(items), seed + 13)
    out = []
    for k, item in enumerate(items):
        out.append(("standalone", item, item.paraphrase))
        if item.eval_set == "fixture_code" and modules:
            host = modules[k % len(modules)]
        else:
            host = ""
            while len(host.split()) < LONG_MIN_WORDS:
                host += rng.choice(prose) + "\n\n"
        out.append(("long", item, _plant(host.strip(), item.paraphrase, rng)))
    return out
