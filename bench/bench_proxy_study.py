"""End to end: mixture studies through the Dagster assets, trained by the language-model proxy
as Ray tasks on a local cluster the bench starts (2 CPUs), on real text assembled on this machine.

The pool (nothing downloaded) has five kinds of text, each a topic of the sampling groups in
two bands: ``python`` (this repository's Python source), ``markdown`` (this repository's docs
and the installed packages' Markdown), ``locale`` (the system's locale definitions),
``manual`` (manual pages) and ``sums`` (worked sums the bench generates). A file is cut into
documents of at most 2,048 bytes; a file whose id hash is 0 modulo 10 is held out whole, never
trained on. Two studies over it, the same swarm settings, a real Dagster instance:

* **matched**: the eval set is held-out ``python`` documents; one group family matches it, and
  nothing in the study knows which. PASS where the gates publish the optimized mixture and
  validation at both larger sizes of the ladder measures a gain whose interval lies above 0.
* **pool**: the eval set is held-out documents of every kind in proportion to its bytes,
  which token-proportional sampling already serves: PASS where consumers end on
  token-proportional, refused by the gates or, where the gates publish a candidate, by
  validation at the larger sizes not confirming its gain.

Each study: 24 proxy mixtures plus 4 replicate runs at the proxy size, each one Dagster run
(``mixture_proxies``) submitting one Ray task; validation trains the candidate and
token-proportional with 3 seeds each at the ladder's two larger sizes. It prints the sizes
(parameters), tokens per run, the verdicts, the measured gain and interval per size, and the
wall and CPU time (this process and the Ray cluster's processes), held to 90 minutes.

``python -m bench.bench_proxy_study`` exits 1 when a goal misses. ``BENCH_QUICK=1``: fewer
tokens per run (a smoke run, not the study of record).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pathlib
import sys
import tempfile
import time
from typing import Any

import numpy as np
import polars as pl

from bench.harness import absolute_goal, exit_status, pick

REPO = pathlib.Path(__file__).resolve().parent.parent
DOC_BYTES = 2_048
HOLDOUT_MOD = 10
EVAL_BYTES = 65_536
KINDS = ("python", "markdown", "locale", "manual", "sums")
KIND_BYTES = {"python": 500_000, "markdown": 600_000, "locale": 500_000, "manual": 400_000, "sums": 300_000}
MATCHED = "python"
TIME_LIMIT_S = 90 * 60


# --------------------------------------------------------------------------- the pool


def _files(kind: str) -> list[pathlib.Path]:
    if kind == "python":
        return sorted(p for p in (REPO / "marin_assets").rglob("*.py"))
    if kind == "markdown":
        return sorted(REPO.glob("docs/*.md")) + [REPO / "README.md"] + sorted(pathlib.Path("/usr/share/doc").rglob("*.md*"))
    if kind == "locale":
        return sorted(pathlib.Path("/usr/share/i18n/locales").glob("*"))
    if kind == "manual":
        return sorted(pathlib.Path("/usr/share/man/man1").glob("*.gz"))
    return []


def _read(path: pathlib.Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError):
            return ""
    return data.decode("utf-8", errors="replace")


def _sums(seed: int = 0) -> list[str]:
    """Worked sums in words and digits: a kind of text no installed file holds."""
    rng = np.random.default_rng(seed)
    items = []
    for _ in range(4_000):
        a, b, c = (int(x) for x in rng.integers(2, 999, 3))
        items.append(f"Question: a crate holds {a} bolts and {b} more arrive, then {c} are used. How many are left?\n"
                     f"Answer: {a} + {b} = {a + b}; {a + b} - {c} = {a + b - c}. There are {a + b - c} bolts left.\n")
    return ["".join(items[i : i + 40]) for i in range(0, len(items), 40)]


def kind_documents(kind: str) -> list[tuple[str, str]]:
    """(id, text) pieces of one kind, up to its size; a file's pieces share the id's first 8 hex
    characters, so holding out by id holds out whole files."""
    texts = [(f"sums/{i}", t) for i, t in enumerate(_sums())] if kind == "sums" else ((str(p), _read(p)) for p in _files(kind))
    docs, size = [], 0
    for name, text in texts:
        head = hashlib.sha256(name.encode()).hexdigest()[:8]
        for start in range(0, len(text), DOC_BYTES):
            piece = text[start : start + DOC_BYTES]
            if len(piece) >= 200:
                docs.append((head + hashlib.sha256(f"{name}#{start}".encode()).hexdigest()[:24], piece))
                size += len(piece.encode())
            if size >= KIND_BYTES[kind]:
                return docs
    if not docs:
        raise SystemExit(f"bench_proxy_study: no {kind} text found on this machine")
    return docs


def held_out(doc_id: str) -> bool:
    return int(doc_id[:8], 16) % HOLDOUT_MOD == 0


def write_pool(root: str) -> tuple[dict[str, int], dict[str, list[tuple[str, str]]]]:
    """The kinds as pool files (topic = kind, band = a hash of the piece) and the current
    ``sampling_groups`` output over them; bytes per group and the documents per kind."""
    import pyarrow as pa

    from marin_assets.core.pool.groups import sampling_groups, write_sampling_groups
    from marin_assets.core.runtime import storage
    from marin_assets.core.specs import SAMPLING_GROUPS

    kinds = {k: kind_documents(k) for k in KINDS}
    files, rows = {}, []
    for topic, (kind, docs) in enumerate(kinds.items()):
        for band in range(2):
            chosen = [(i, t) for i, t in docs if int(i[8:16], 16) % 2 == band]
            group = f"c{topic:02d}q{band}"
            frame = pl.DataFrame({"id": [i for i, _ in chosen], "text": [t for _, t in chosen], "source": [kind] * len(chosen),
                                  "tokens": [len(t.encode()) for _, t in chosen]})  # the proxy's tokens are bytes
            uri = storage.join(root, "pool", kind, "bench", group, "part-0.parquet")
            storage.write_parquet(frame, uri)
            files[group] = uri
            rows.append((group, kind, len(chosen), int(frame["tokens"].sum())))
    counts = pl.DataFrame(rows, schema={"group": pl.Utf8, "source": pl.Utf8, "documents": pl.Int64, "tokens": pl.Int64}, orient="row")
    result = sampling_groups(counts, dict(enumerate(KINDS)))
    layout = storage.Layout(root)
    out = SAMPLING_GROUPS.output_uri(layout, None, "bench")
    write_sampling_groups(result, out)
    storage.write_parquet(pa.table({"group": list(files), "source": [r[1] for r in rows], "file": list(files.values())}), storage.join(out, "pool_files.parquet"))
    storage.write_manifest(out, {"stage": "sampling_groups", "fingerprint": "bench", "stats": result.summary})
    storage.publish_current(SAMPLING_GROUPS.group_uri(layout), "bench", out)
    return {g: t for g, _, _, t in rows}, kinds


def write_eval_set(path: str, domain: str, docs: list[tuple[str, str]]) -> int:
    """Held-out documents as an eval set (JSON lines of ``domain`` and ``text``), in an order
    drawn from their ids, so the scored first bytes are a sample of them all."""
    rows = sorted((hashlib.sha256(i.encode()).hexdigest(), t) for i, t in docs if held_out(i))
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        handle.writelines(json.dumps({"domain": domain, "text": t}) + "\n" for _, t in rows)
    return sum(len(t.encode()) for _, t in rows)


def proportional_heldout(kinds: dict[str, list[tuple[str, str]]]) -> dict[str, list[tuple[str, str]]]:
    """Held-out documents of every kind in proportion to the kinds' bytes in the pool (files are
    held out whole, so the held-out text alone is not in proportion), at most ``EVAL_BYTES``."""
    held = {k: sorted((hashlib.sha256(i.encode()).hexdigest(), i, t) for i, t in docs if held_out(i)) for k, docs in kinds.items()}
    size = {k: sum(len(t.encode()) for _, t in docs) for k, docs in kinds.items()}
    share = {k: v / sum(size.values()) for k, v in size.items()}
    total = min(EVAL_BYTES, *(sum(len(t.encode()) for _, _, t in held[k]) / share[k] for k in kinds))  # the scarcest kind sets the size
    out = {}
    for kind, rows in held.items():
        out[kind], taken = [], 0
        for _, i, t in rows:
            data = t.encode()[: max(0, int(total * share[kind]) - taken)]
            if not data:
                break
            out[kind].append((i, data.decode("utf-8", errors="ignore")))
            taken += len(data)
    return out


# --------------------------------------------------------------------------- the study


def study_params(name: str, pool_tokens: int, proxy_budget: int) -> Any:
    """A study whose full run sees the pool once (token-proportional: every group one epoch),
    proxies of ``proxy_budget`` bytes on a ladder of ~0.1M, ~0.45M and ~1.1M parameters."""
    from marin_assets.core.mixture import swarm as ms
    from marin_assets.core.mixture.lm_params import LMProxyParams, ModelSize

    ladder = (ModelSize("proxy", 2, 64, 4), ModelSize("v1", 2, 128, 4), ModelSize("v2", 4, 144, 4))
    return ms.StudyParams(
        name=name, target_budget=float(pool_tokens), proxy_budget=float(proxy_budget), n_runs=24, seed=0, phases=(ms.TrainingPhase("main", 1.0),),
        seq_len=128, search_candidates=8_000, search_rounds=4, validation_seeds=3, job_retries=1,
        proxy=ms.ProxyTrainerParams(holdout_mod=HOLDOUT_MOD, eval_set="eval.jsonl", max_eval_bytes_per_domain=EVAL_BYTES),
        # the recipe measured repeatable at this budget (256 steps of 8 x 128 bytes: replicate noise sd 0.014 on the
        # matched study); the default (16 x 128 at 3e-3) is set for 1M-token proxies and halves the steps here
        lm=LMProxyParams(ladder=ladder, eval_bytes_per_domain=EVAL_BYTES, device="cpu", batch_size=8, learning_rate=1e-3),
    )


def _metadata(result: Any, asset: str) -> dict[str, Any]:
    for mat in result.asset_materializations_for_node(asset):
        return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    return {}


def run_study(defs: Any, instance: Any, params: Any) -> dict[str, Any]:
    """Propose, train every proxy (one Dagster run each), fit and publish, and validate: the jobs
    a sensor and the daemon would start, on the same instance."""
    from marin_assets.defs.partitions import add_study, proxy_run_key

    add_study(instance, params.name)
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}

    def job(name: str, key: Any) -> Any:
        result = defs.resolve_job_def(name).execute_in_process(partition_key=key, instance=instance, run_config=quiet, raise_on_error=False)
        if not result.success:
            raise SystemExit(f"bench_proxy_study: {name} [{key}] failed: {result.all_node_events[-1].message if result.all_node_events else ''}")
        return result

    print(_metadata(job("mixture_proposal", params.name), "mixture_swarm")["summary"].replace("```", "").strip("\n"), flush=True)
    started, targets, trainers = time.perf_counter(), [], set()
    for run in params.run_ids():
        meta = _metadata(job("mixture_proxies", proxy_run_key(params.name, run)), "proxy_results")
        targets.append(meta["target_value"])
        trainers.add(meta["trainer"])
    print(f"  {len(targets)} proxies trained with {', '.join(sorted(trainers))} in {time.perf_counter() - started:.0f} s; "
          f"macro_bpb {min(targets):.4f} .. {max(targets):.4f}", flush=True)
    fitted = job("mixture_fit", params.name)
    out = {"model": _metadata(fitted, "mixture_model"), "weights": _metadata(fitted, "mixture_weights"), "trainers": trainers}
    for meta in (out["model"], out["weights"]):
        print(str(meta.get("summary", "")).replace("```", "").strip("\n"), flush=True)
    out["validation"] = _metadata(job("mixture_validate", params.name), "mixture_validation")
    print(str(out["validation"].get("summary", "")).replace("```", "").strip("\n"), flush=True)
    return out


def family_share(root: str, study: str, topic: int) -> tuple[float, float]:
    """The matched family's weight in the published mixture and under token-proportional."""
    from marin_assets.core.mixture import swarm as ms
    from marin_assets.core.runtime import storage

    out = storage.read_current(storage.join(ms.study_dir(root, study), "weights"))["uri"]
    table = pl.from_arrow(storage.read_parquet(storage.join(out, "weights.parquet"))).filter(pl.col("topic") == topic)
    return float(table["weight"].sum()), float(table["proportional_weight"].sum())


def gains_per_size(root: str, study: str) -> dict[str, dict[str, float]]:
    from marin_assets.core.mixture import swarm as ms
    from marin_assets.core.runtime import storage

    uri = storage.read_current(storage.join(ms.study_dir(root, study), "validation"))["uri"]
    return {size: at["measured_gain"] for size, at in storage.read_manifest(uri)["stats"]["sizes"].items()}


def tree_cpu_seconds() -> float:
    """CPU seconds of this process and every process under it (the Ray cluster it started and
    its workers, with their reaped children), read from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    parents, times = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = sum(int(x) for x in fields[11:15]) / tick
    tree, frontier = {os.getpid()}, [os.getpid()]
    while frontier:
        pid = frontier.pop()
        children = [p for p, pp in parents.items() if pp == pid and p not in tree]
        tree.update(children)
        frontier += children
    return sum(times.get(p, 0.0) for p in tree)


def main() -> int:
    proxy_budget = pick(262_144, 65_536)  # 256 or 64 steps of 8 x 128 bytes
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-proxy-study-") as work:
        root, home = os.path.join(work, "data"), os.path.join(work, "home")
        os.makedirs(home)
        pathlib.Path(home, "dagster.yaml").write_text("telemetry:\n  enabled: false\n")  # a real instance, stored in the folder
        import ray

        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # a cluster on this machine, this process's
        try:
            os.environ.update({"MARIN_PREFIX": root, "DAGSTER_HOME": home, "MARIN_RAY_ADDRESS": ray.get_runtime_context().gcs_address})
            return measure(root, proxy_budget, started)
        finally:
            ray.shutdown()


def measure(root: str, proxy_budget: int, started: float) -> int:
    import dagster as dg

    from marin_assets.core.mixture import lm_proxy
    from marin_assets.core.mixture import swarm as ms
    from marin_assets.definitions import defs

    group_tokens, kinds = write_pool(root)
    pool_tokens = sum(group_tokens.values())
    matched, pool = study_params("matched", pool_tokens, proxy_budget), study_params("pool", pool_tokens, proxy_budget)
    heldout = proportional_heldout(kinds)
    eval_bytes = {
        "matched": write_eval_set(os.path.join(ms.study_dir(root, "matched"), "eval.jsonl"), MATCHED, kinds[MATCHED]),
        "pool": write_eval_set(os.path.join(ms.study_dir(root, "pool"), "eval.jsonl"), "pool", [d for docs in heldout.values() for d in docs]),
    }
    print(f"  pool: {', '.join(f'{g} {t:,}' for g, t in group_tokens.items())} bytes ({pool_tokens:,}); kinds {', '.join(f'c{i:02d} {k}' for i, k in enumerate(KINDS))}; "
          f"held-out eval text: matched ({MATCHED}) {eval_bytes['matched']:,} bytes, pool {eval_bytes['pool']:,} (scored: up to the first {EVAL_BYTES:,} of each)", flush=True)
    kind_tokens = {k: sum(t for g, t in group_tokens.items() if g.startswith(f"c{i:02d}")) for i, k in enumerate(KINDS)}
    print("  pool eval set by kind (the pool's share): " + ", ".join(
        f"{k} {sum(len(t.encode()) for _, t in docs) / eval_bytes['pool']:.1%} ({kind_tokens[k] / pool_tokens:.1%})" for k, docs in heldout.items()), flush=True)
    lm = matched.lm
    sizes = {s.name: lm_proxy.parameter_count(s, lm.context) for s in lm.ladder}
    steps = round(proxy_budget / (lm.batch_size * lm.context))
    print(f"  ladder: {', '.join(f'{n} {p / 1e6:.2f}M parameters' for n, p in sizes.items())}; proxies at {lm.size}, validation at {', '.join(matched.sizes_to_validate())}; "
          f"{proxy_budget:,} tokens (bytes) per run, {steps} steps of {lm.batch_size} x {lm.context}; lr {lm.learning_rate:g}; "
          f"{len(matched.run_ids())} proxies per study ({matched.n_runs} mixtures + replicates), {matched.validation_seeds} seeds per mixture and size; "
          f"Ray at {os.environ['MARIN_RAY_ADDRESS']}", flush=True)
    for params in (matched, pool):
        ms.write_study(root, params)
    with dg.DagsterInstance.get() as instance:
        print(f"\n  == study 'matched' (eval: held-out {MATCHED}) ==", flush=True)
        found = run_study(defs, instance, matched)
        share, prop = family_share(root, "matched", KINDS.index(MATCHED))
        gains = gains_per_size(root, "matched")
        print(f"  the {MATCHED} family's weight: published {share:.3f} against token-proportional {prop:.3f}", flush=True)
        print("\n  == study 'pool' (eval: held-out pool text, proportional) ==", flush=True)
        refused = run_study(defs, instance, pool)
    wall, cpu = time.perf_counter() - started, tree_cpu_seconds()
    lm_ran = found["trainers"] | refused["trainers"] == {ms.LM_TRAINER}
    print(f"\n  wall {wall:.0f} s, CPU {cpu:.0f} s (this process and the Ray cluster's); trainer {', '.join(sorted(found['trainers'] | refused['trainers']))}", flush=True)
    shown = "; ".join(f"{s}: gain {g['mean']:.4f} (90% interval {g['low']:.4f} .. {g['high']:.4f})" for s, g in gains.items())
    passed = [
        absolute_goal("matched eval set: the optimized mixture published and validated at both larger sizes (interval above 0)",
                      f"published {found['weights']['published']}; {shown}; {found['validation'].get('verdict', '')[:60]}",
                      found["weights"]["published"] == "optimized" and bool(found["validation"].get("validated")) and len(gains) == 2
                      and all(g["low"] > 0 for g in gains.values())),
        absolute_goal("pool's own held-out text as the eval set: refused (consumers train on token-proportional)",
                      f"gates published {refused['weights']['published']}; validation: {refused['validation'].get('verdict', '')[:200]}; "
                      f"consumers train on {refused['validation'].get('published')}", refused["validation"].get("published") == "proportional"),
        absolute_goal(f"the language-model proxy trained >= 24 proxies per study within {TIME_LIMIT_S // 60} minutes",
                      f"{len(matched.run_ids())} proxies per study, {wall / 60:.1f} min wall, {cpu / 60:.1f} CPU min", lm_ran and wall < TIME_LIMIT_S),
    ]
    return 0 if all(passed) else 1


if __name__ == "__main__":
    sys.exit(exit_status(main()))
