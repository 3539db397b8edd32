"""Decontamination: a planted benchmark (recall per kind of copy, false positives) for both rules,
and marking speed against a plain Python reference at the production index size.

Run: ``python bench/bench_decon.py`` (``--quick``: planted benchmark only, no speed rounds).

Planted benchmark: two eval sets. A question/answer set written here (synthetic sentences over a
made-up vocabulary: 60 rows with a question of 40-110 tokens and an answer of 22-60, every fifth
answer 8-18; 8 short rows of 6-11 tokens; rows 0-9 open with a shared 60-token licence
paragraph), and a code set shaped like a public code benchmark (80 standard-library functions
with a docstring of 20+ words and a 3-15 line body: prompt = signature and docstring, canonical
solution = body, from every third module). One source of documents holds copies of the
question/answer rows placed as: its own paragraph, inline inside a paragraph, reflowed, upper
case, full-width letters, zero-width characters inside words, ``> `` quoted, with line numbers,
1 token in 26 changed, inside a 5 MB page, repeated 20 times each (10 rows), the answer only
(inline) and the question only (reflowed); copies of the code rows whole, the solution only and the prompt
only (reflowed); clean near-misses (the row's words shuffled and a sentence that shares 8
tokens), documents holding only the licence paragraph, generated clean text, and real code
(windows of the other modules' source) and real prose (their docstrings). Each rule runs with
its own drop sets computed on that source, as in production. Goal: the default flag (either
rule) flags >= 95% of every kind and no negative document; answers and solutions under 20
tokens are printed without a goal.

Speed (on the shared harness, ``bench/harness.py``): documents per CPU second of
``mark_documents`` (each rule) against the reference (Marin's rule written plainly:
``str.split``, a Python set of 13-gram strings), both with the index padded to 21.78M n-grams
(the reference set padded with random integers, which cost what absent strings cost to look
up). Each run is its own child process, interleaved coverage / reference / marin over the
rounds, median and range (min..max) of the per-round ratios, each child's own peak memory
(VmHWM; it includes building the padded index or set). CPU time is the child's own, so the
ratio is per core and holds on a loaded machine; the load average is printed beside it.
Goal: >= 5x the reference per CPU second, both rules.

``--semantic`` runs the semantic tier's bench instead (``bench/bench_semantic.py``: reworded eval items).

``python -m bench --only decon`` (or ``make bench``) runs both parts; ``--planted`` runs only
the planted benchmark; ``BENCH_QUICK=1`` (``--quick``) runs one round.
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from bench import harness  # noqa: E402
from marin_assets.core.decon import rules as decon  # noqa: E402
from marin_assets.core.runtime import storage

N_DOCS = 8_000
N_EVAL_ROWS = 1_000
PLANT_RATE = 0.03
PRODUCTION_NGRAMS = 21_780_000
TARGET_RATIO = 5.0
RECALL_GOAL = 0.95
ROUNDS = 3
PARAMS = decon.DeconParams()
KINDS = ("paragraph", "inline", "reflowed", "upper_case", "full_width", "zero_width", "quoted", "line_numbers",
         "one_in_26_changed", "inside_5mb_page", "repeated_20x", "answer_only", "question_only", "code_whole_row",
         "code_solution_only", "code_prompt_only")
SHOWN = ("short_answer_only", "code_short_solution_only")  # copies under the field floor: printed, no goal
NEGATIVES = ("near_miss", "licence_only", "clean", "real_code", "real_prose")
RULE_COLUMNS = ("either", "coverage", "marin")
CODE_ROWS = 80
FIELD_FLOOR_TOKENS = PARAMS.field_min_features + PARAMS.ngram_tokens - 1  # a field this long can flag alone


# ----------------------------------------------------------------------------- the planted benchmark


def _vocabulary(rng: random.Random, size: int = 3000) -> list[str]:
    syllables = ["ka", "lo", "mi", "tre", "san", "vor", "pel", "du", "ri", "shan", "quo", "ne", "bal", "tis", "gor",
                 "fa", "wen", "li", "mor", "zu", "che", "pra", "do", "xi", "len"]
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))))
    return sorted(words)


def _sentence(rng: random.Random, vocab: list[str], n: int) -> str:
    words = [rng.choice(vocab) for _ in range(n)]
    words[0] = words[0].capitalize()
    out = []
    for i, w in enumerate(words):
        out.append(w + ("," if i % 9 == 8 and i < n - 1 else ""))
    return " ".join(out) + "."


def planted(seed: int = 7) -> tuple[list[decon.EvalRow], list[tuple[str, int, str]]]:
    """(eval rows, documents as (kind, eval row or -1, text)), all generated from ``seed``."""
    rng = random.Random(seed)
    vocab = _vocabulary(rng)
    licence = _sentence(rng, vocab, 60)
    eval_rows = []
    for i in range(60):  # question and answer; every fifth answer is under the field floor
        question = _sentence(rng, vocab, rng.randint(40, 110))
        question = licence + "\n\n" + question if i < 10 else question
        answer = _sentence(rng, vocab, rng.randint(8, 18) if i % 5 == 4 else rng.randint(22, 60))
        eval_rows.append(decon.EvalRow("planted", str(i), f"{question}\n\n{answer}",
                                       (("question", question), ("answer", answer))))
    eval_rows += [decon.EvalRow("planted", str(60 + i), _sentence(rng, vocab, rng.randint(6, 11))) for i in range(8)]
    long_ids = list(range(10, 60))
    short_ids = list(range(60, 68))

    def filler(n: int) -> str:
        return _sentence(rng, vocab, n)

    def lines(text: str, width: int = 9) -> list[str]:
        words = text.split()
        return [" ".join(words[k:k + width]) for k in range(0, len(words), width)]

    full = {c: chr(ord(c) + 0xFEE0) for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"}
    docs: list[tuple[str, int, str]] = []
    targets = long_ids[:40] + short_ids
    for r in targets:
        row = eval_rows[r][2]
        docs.append(("paragraph", r, f"{filler(40)}\n\n{row}\n\n{filler(30)}"))
        docs.append(("inline", r, f"{filler(40)} {row} {filler(60)}"))
        docs.append(("reflowed", r, filler(20) + "\n" + "\n".join(lines(row, 7)) + "\n" + filler(20)))
        docs.append(("upper_case", r, f"{filler(30)}\n\n{row.upper()}"))
        docs.append(("full_width", r, f"{filler(30)} {''.join(full.get(c, c) for c in row)} {filler(10)}"))
        docs.append(("zero_width", r, filler(30) + " " + " ".join(w[:len(w) // 2] + "\u200b" + w[len(w) // 2:]
                                                                   for w in row.split())))
        docs.append(("quoted", r, filler(30) + "\n" + "\n".join("> " + x for x in lines(row))))
        docs.append(("line_numbers", r, "\n".join(f"{k + 1:>3}  {x}" for k, x in enumerate(
            lines(filler(30)) + lines(row) + lines(filler(20))))))
        if r in long_ids:
            words = row.split()
            changed = [("zz" + w if k % 26 == 25 else w) for k, w in enumerate(words)]
            docs.append(("one_in_26_changed", r, f"{filler(30)} {' '.join(changed)} {filler(30)}"))
            shuffled = row.split()
            rng.shuffle(shuffled)
            near = " ".join(shuffled) + " " + " ".join(row.split()[:8]) + " " + filler(20)
            docs.append(("near_miss", -1, near))
            question, answer = (t for _, t in eval_rows[r].fields)
            short = len(answer.split()) < FIELD_FLOOR_TOKENS
            docs.append(("short_answer_only" if short else "answer_only", r,
                         f"{filler(40)} so the answer: {answer} {filler(30)}"))  # inline
            docs.append(("question_only", r, filler(20) + "\n" + "\n".join(lines(question, 6)) + "\n" + filler(20)))
    for r in long_ids[:4]:  # a 5 MB page with one copy in the middle
        body = []
        size = 0
        while size < 5_000_000:
            paragraph = filler(rng.randint(60, 200))
            body.append(paragraph)
            size += len(paragraph) + 2
        body.insert(len(body) // 2, eval_rows[r][2])
        docs.append(("inside_5mb_page", r, "\n\n".join(body)))
    for r in range(10, 20):  # 20 copies of each of 10 rows in the source
        for _ in range(20):
            docs.append(("repeated_20x", r, f"{filler(rng.randint(20, 80))}\n\n{eval_rows[r][2]}"))
    for _ in range(300):  # the licence paragraph alone, as boilerplate of many documents
        docs.append(("licence_only", -1, f"{filler(rng.randint(30, 90))}\n\n{licence}\n\n{filler(40)}"))
    for _ in range(2000):
        docs.append(("clean", -1, "\n\n".join(filler(rng.randint(30, 120)) for _ in range(rng.randint(1, 4)))))
    code_rows, code_docs = planted_code(rng, len(eval_rows))
    rng.shuffle(docs := docs + code_docs)
    return eval_rows + code_rows, docs


# ----------------------------------------------------------------------------- the code set and real text

def _stdlib_sources() -> list[tuple[str, str]]:
    """(module, source) of the standard library's top-level modules, sorted."""
    root = os.path.dirname(os.__file__)
    out = []
    for name in sorted(os.listdir(root)):
        if name.endswith(".py"):
            with open(os.path.join(root, name), encoding="utf-8") as handle:
                out.append((name[:-3], handle.read()))
    return out


def _functions(source: str) -> list[tuple[str, str, str]]:
    """(name, prompt, body) of each function with a docstring of 20+ words: the prompt is its
    signature and docstring, the body the rest (a code benchmark's prompt and canonical solution)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = source.splitlines(keepends=True)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and len((ast.get_docstring(node) or "").split()) >= 20 \
                and len(node.body) >= 2:
            doc_end = node.body[0].end_lineno
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out.append((node.name, "".join(lines[start - 1:doc_end]), "".join(lines[doc_end:node.end_lineno])))
    return out


def _line_windows(text: str) -> set[tuple[str, ...]]:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return {tuple(lines[k:k + 3]) for k in range(len(lines) - 2)}


def real_text(seed: int = 11) -> tuple[list[tuple[str, str, str]], list[str], list[str]]:
    """A code benchmark made of standard-library functions (every third module; a docstring of 20+
    words and a body of 3-15 lines, like a code benchmark's problems) and, from the other modules
    only, real code (windows of 30-120 source lines) and real prose (docstrings). A function with
    three consecutive lines also in another module is left out (the library has twins: bz2, lzma
    and gzip, _pyio and io): the other module holds a real copy of it, not a false positive."""
    rng = random.Random(seed)
    sources = _stdlib_sources()
    others = {w for k, (_, src) in enumerate(sources) if k % 3 for w in _line_windows(src)}
    functions = [f for k, (_, src) in enumerate(sources) if k % 3 == 0 for f in _functions(src)
                 if 3 <= f[2].count("\n") <= 15 and not _line_windows(f[1] + f[2]) & others]
    code, prose = [], []
    for k, (_, src) in enumerate(sources):
        if k % 3 == 0:
            continue
        lines = src.splitlines(keepends=True)
        at = 0
        while at < len(lines):
            size = rng.randint(30, 120)
            code.append("".join(lines[at:at + size]))
            at += size
        prose.extend(ast.get_docstring(n) or "" for n in ast.walk(ast.parse(src))
                     if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)))
    prose = [p for p in prose if len(p.split()) >= 20]
    return rng.sample(functions, CODE_ROWS), rng.sample(code, min(1500, len(code))), rng.sample(prose, 1000)


def planted_code(rng: random.Random, first_row: int) -> tuple[list[decon.EvalRow], list[tuple[str, int, str]]]:
    """Code eval rows (prompt, canonical_solution) and documents copying a whole row, only its
    solution or only its prompt (reflowed), beside real code and prose that copy nothing."""
    functions, code, prose = real_text()
    rows, docs = [], []
    for k, (name, prompt, body) in enumerate(functions):
        r = first_row + k
        rows.append(decon.EvalRow("planted_code", f"{name}/{k}", f"{prompt}\n\n{body}",
                                  (("prompt", prompt), ("canonical_solution", body))))
        around = rng.sample(code, 2)
        docs.append(("code_whole_row", r, f"{around[0]}\n\n{prompt}{body}\n\n{around[1]}"))
        short = len(decon.normalize_text(body).split()) < FIELD_FLOOR_TOKENS
        docs.append(("code_short_solution_only" if short else "code_solution_only", r,
                     f"Here is a solution that passes the tests:\n\n{body}\n\n{around[1]}"))
        reflowed = "\n".join(" ".join(prompt.split()[i:i + 6]) for i in range(0, len(prompt.split()), 6))
        docs.append(("code_prompt_only", r, f"{around[0]}\n\n{reflowed}\n\n"))
    docs += [("real_code", -1, c) for c in code] + [("real_prose", -1, p) for p in prose]
    return rows, docs


def run_planted(tmp: str) -> dict[str, dict[str, tuple[int, int]]]:
    """Per rule and the default flag (either): kind -> (flagged, documents), with each rule's drop
    sets computed on the source."""
    eval_rows, docs = planted()
    index_dir = storage.join(tmp, "index")
    decon.build_eval_index(eval_rows, index_dir, PARAMS, {"planted": sum(r.eval_set == "planted" for r in eval_rows)})
    shard = storage.join(tmp, "normalized", storage.shard_name(0, 1))
    storage.write_parquet(pa.table({"id": [f"{i:032x}" for i in range(len(docs))],
                                    "text": pa.array([d[2] for d in docs], pa.large_string())}), shard)
    params = decon.DeconParams(index_uri=index_dir)
    texts = pa.array([d[2] for d in docs], pa.large_string())
    flags = {}
    for rule in decon.RULES:
        freq = storage.join(tmp, f"{rule}_freq.parquet")
        decon.eval_ngram_frequencies([shard], freq, params, rule=rule)
        drop_uri = storage.join(tmp, f"{rule}_drop.parquet")
        decon.source_drop_set(freq, drop_uri, params)
        flags[rule] = decon.mark_documents(texts, decon.load_eval_index(index_dir, rule),
                                           decon.load_drop_set([drop_uri]), params, rule).contaminated
    flags[decon.EITHER] = flags["coverage"] | flags["marin"]
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for rule, flagged_docs in flags.items():
        per_kind: dict[str, list[int]] = {}
        for (kind, _, _), flagged in zip(docs, flagged_docs.tolist()):
            slot = per_kind.setdefault(kind, [0, 0])
            slot[0] += int(flagged)
            slot[1] += 1
        out[rule] = {k: (v[0], v[1]) for k, v in per_kind.items()}
    return out


def print_planted(result: dict[str, dict[str, tuple[int, int]]]) -> bool:
    """Recall per kind and false positives per negative set, for the default flag and each rule."""
    print(f"{'kind of copy':26s}" + "".join(f"{r if r != decon.EITHER else 'default (either)':>19s}"
                                            for r in RULE_COLUMNS))
    ok = True

    def line(kind: str, recall: bool) -> None:
        cells = []
        for rule in RULE_COLUMNS:
            flagged, total = result[rule].get(kind, (0, 0))
            cells.append(f"{flagged:>6d}/{total:<5d}" + (f" {flagged / max(total, 1):5.0%}" if recall else " " * 6))
        print(f"{kind:26s}" + "".join(f"{c:>19s}" for c in cells))

    for kind in KINDS:
        line(kind, True)
        flagged, total = result[decon.EITHER].get(kind, (0, 0))
        ok &= total > 0 and flagged >= RECALL_GOAL * total
    print(f"under the field floor (< {FIELD_FLOOR_TOKENS} tokens; not a goal):")
    for kind in SHOWN:
        line(kind, True)
    print("false positives (documents flagged):")
    for kind in NEGATIVES:
        line(kind, False)
        ok &= result[decon.EITHER].get(kind, (0, 0))[0] == 0
    default = result[decon.EITHER]
    lowest = min(default.get(k, (0, 1))[0] / max(default.get(k, (0, 1))[1], 1) for k in KINDS)
    false = sum(default.get(k, (0, 0))[0] for k in NEGATIVES)
    return harness.absolute_goal(f"the default flag (either rule) flags >= {RECALL_GOAL:.0%} of every kind of copy and "
                                 "no near-miss, licence-only, clean, real-code or real-prose document",
                                 f"lowest recall {lowest:.0%}, {false} false positives", ok)


# ----------------------------------------------------------------------------- speed (children)

def docstrings(limit: int = 14_000) -> list[str]:
    """Docstrings of the standard library, read with ``ast`` from its sources (nothing imported)."""
    root = os.path.dirname(os.__file__)
    seen: dict[str, None] = {}
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in ("site-packages", "test", "tests", "idle_test"))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            try:
                with open(os.path.join(directory, name), encoding="utf-8") as handle:
                    tree = ast.parse(handle.read())
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc and len(doc.split()) >= 20:
                        seen.setdefault(doc, None)
            if len(seen) >= limit:
                return list(seen)
    return list(seen)


def _as_fields(text: str) -> tuple[tuple[str, str], ...]:
    """A docstring as a question (its first paragraph) and an answer (the rest), when it has both."""
    head, _, rest = text.partition("\n\n")
    return (("question", head), ("answer", rest)) if rest.strip() else ()


def corpus(seed: int = 0) -> tuple[list[decon.EvalRow], list[str]]:
    pool = docstrings()
    rng = random.Random(seed)
    rng.shuffle(pool)
    eval_texts, page_texts = pool[:N_EVAL_ROWS], pool[N_EVAL_ROWS:]
    eval_rows = [decon.EvalRow("bench_eval", str(i), t, _as_fields(t)) for i, t in enumerate(eval_texts)]
    # Docstrings repeat each other (shared boilerplate, twin implementations); pages only use
    # those sharing no feature with the eval rows, so that matches come from planted copies.
    grams, _ = reference_index(eval_rows)
    page_texts = [t for t in page_texts if not any(f in grams for u in reference_units(t, True) for f in u)]
    pages = []
    for _ in range(N_DOCS):
        paragraphs = rng.sample(page_texts, rng.randint(2, 6))
        if rng.random() < PLANT_RATE:
            paragraphs.insert(rng.randint(0, len(paragraphs)), rng.choice(eval_texts))
        pages.append("\n\n".join(paragraphs))
    return eval_rows, pages


# ----------------------------------------------------------------------------- the reference

_PARAGRAPHS = re.compile(r"\n\s*\n")
_LETTER = re.compile(r"[^\W\d_]")


def reference_units(text: str, short_paragraphs: bool) -> list[list[str]]:
    paragraphs = [p.split() for p in _PARAGRAPHS.split(text)]
    paragraphs = [p for p in paragraphs if p]
    if not paragraphs:
        return []
    whole = max(len(p) for p in paragraphs) < 13
    if whole:
        paragraphs = [[t for p in paragraphs for t in p]]
    units = []
    for tokens in paragraphs:
        if len(tokens) >= 13:
            grams = [" ".join(tokens[i:i + 13]) for i in range(len(tokens) - 12)]
            units.append([g for g in grams if _LETTER.search(g)])
        elif 3 <= len(tokens) <= 12 and (short_paragraphs or whole):
            record = " ".join(tokens)
            units.append([record] if _LETTER.search(record) else [])
    return units


def reference_index(eval_rows) -> tuple[set[str], set[str]]:
    grams: set[str] = set()
    records: set[str] = set()
    for row in eval_rows:
        features = {f for unit in reference_units(row[2], False) for f in unit}
        grams |= features
        if len(features) == 1:
            records |= features
    return grams, records


def reference_mark(texts: list[str], grams: set[str], records: set[str]) -> tuple[list[bool], list[float]]:
    flags, overlaps = [], []
    for text in texts:
        best, flagged = 0.0, False
        for unit in reference_units(text, True):
            if not unit:
                continue
            hits = [g for g in unit if g in grams]
            overlap = len(hits) / len(unit)
            best = max(best, overlap)
            if hits and overlap >= 0.5 and (len(set(hits)) >= 2 or any(h in records for h in hits)):
                flagged = True
        flags.append(flagged)
        overlaps.append(best)
    return flags, overlaps


def _pad(index: "decon.EvalIndex", size: int) -> "decon.EvalIndex":
    rng = np.random.default_rng(1)
    padding = rng.integers(0, 2**63, max(size - index.size, 0), dtype=np.int64).astype(np.uint64) << 1
    return decon.EvalIndex(np.unique(np.concatenate([index.hashes, padding])), index.record_hashes,
                           index.attribution_hashes, index.attribution_rows, index.row_sets, index.row_ids,
                           index.row_excerpts, index.meta, index.row_features, index.short_prefix, index.row_fields)


def speed_case(which: str, corpus_file: str) -> dict:
    """One measured run (in a harness child): build, pad to production size, mark the speed corpus."""
    with open(corpus_file, encoding="utf-8") as handle:
        data = json.load(handle)
    eval_rows = [decon.EvalRow(s, r, t, tuple(tuple(f) for f in fields)) for s, r, t, fields in data["eval_rows"]]
    pages = data["pages"]
    texts = pa.array(pages, pa.large_string())
    if which == "reference":
        grams, records = reference_index(eval_rows)
        padded = set(np.random.default_rng(2).integers(0, 2**62, PRODUCTION_NGRAMS - len(grams)).tolist())
        padded.update(grams)
        with harness.timed(reset=False):  # the peak includes the padded set
            flags, _ = reference_mark(pages, padded, records)
        flagged = sum(flags)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            decon.build_eval_index(eval_rows, tmp, PARAMS, {})
            index = _pad(decon.load_eval_index(tmp, which), PRODUCTION_NGRAMS)
        decon.mark_documents(texts[:200], index, None, PARAMS, which)  # compile / warm the kernels
        with harness.timed(reset=False):  # the peak includes the padded index
            marks = decon.mark_documents(texts, index, None, PARAMS, which)
        flagged = int(marks.contaminated.sum())
    return {"items": len(pages), "flagged": flagged}


LABELS = {"coverage": "mark_documents rule=coverage", "reference": "reference (set of 13-gram strings)",
          "marin": "mark_documents rule=marin"}


def speed() -> bool:
    rounds = harness.pick(ROUNDS, 1)
    eval_rows, pages = corpus()
    with tempfile.TemporaryDirectory() as tmp:
        corpus_file = os.path.join(tmp, "corpus.json")
        with open(corpus_file, "w", encoding="utf-8") as handle:
            json.dump({"eval_rows": eval_rows, "pages": pages}, handle)
        cases = [harness.Case(LABELS[w], "bench.bench_decon:speed_case", {"which": w, "corpus_file": corpus_file},
                              env={"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"})
                 for w in ("coverage", "reference", "marin")]
        load = os.getloadavg()
        result = harness.compare(
            f"decon: marking at the production index size ({PRODUCTION_NGRAMS / 1e6:.2f}M n-grams), {len(pages):,} "
            f"documents, one core", cases, rounds=rounds, unit="docs", reference=LABELS["reference"])
    flagged = {w: sorted({r["flagged"] for r in result[LABELS[w]].runs}) for w in LABELS}
    print(f"  documents flagged: {', '.join(f'{w} {v}' for w, v in flagged.items())}; load average "
          f"{load[0]:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs")
    ok = True
    for w in ("coverage", "marin"):
        ok &= harness.speed_goal(LABELS[w], LABELS["reference"], TARGET_RATIO,
                                 f"rule={w} marking >= {TARGET_RATIO:g}x the plain-set reference, docs per CPU second",
                                 basis="cpu").check(result)
    return ok


def main() -> int:
    if "--semantic" in sys.argv:  # the semantic tier on the paraphrase fixture (bench_semantic)
        from bench import bench_semantic

        return bench_semantic.main()
    if "--quick" in sys.argv:
        os.environ["BENCH_QUICK"] = "1"
        harness.QUICK = True
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = run_planted(tmp)
        print(f"planted benchmark ({time.perf_counter() - start:.0f} s):")
    ok = print_planted(result)
    if "--planted" not in sys.argv:
        ok &= speed()
    return 0


if __name__ == "__main__":
    sys.exit(harness.exit_status(main()))
