"""The fuzzy dedup rule computed the plain way, in one process: every pair of documents that
share a bucket is an edge, components by scipy, every cluster checked member by member
against every retained member. Tests and the scale benchmark compare the sharded step to it."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np
import pyarrow.compute as pc
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from marin_assets.core.dedup.decisions import FuzzyDedupParams, ngram_sets, verify_cluster_pairwise
from marin_assets.core.runtime import storage


def reference_fuzzy_removals(
    buckets: Mapping[str, Sequence[str]], normalized: Mapping[str, Sequence[str]], exempt: Collection[str], params: FuzzyDedupParams = FuzzyDedupParams()
) -> dict[str, set[tuple[str, str, str]]]:
    """Per source: {(removed id, representative source, representative id)}."""
    docs: list[tuple[str, str, str]] = []  # (source, id, text)
    keys: list[np.ndarray] = []
    nodes: list[np.ndarray] = []
    for source in sorted(buckets):
        for b_uri, n_uri in zip(sorted(buckets[source], key=storage.basename), sorted(normalized[source], key=storage.basename)):
            table = storage.read_parquet(b_uri, columns=["id", "buckets"])
            text = storage.read_parquet(n_uri, columns=["id", "text"])
            assert table.column("id").to_pylist() == text.column("id").to_pylist()
            base = len(docs)
            docs.extend((source, i, t or "") for i, t in zip(text.column("id").to_pylist(), text.column("text").to_pylist()))
            col = table.column("buckets").combine_chunks()
            lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
            values = pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(np.uint64)
            band = np.concatenate([np.arange(n) for n in lengths]) if len(lengths) else np.zeros(0, np.int64)
            keys.append(values * np.uint64(64) + band.astype(np.uint64))  # (bucket, band) as one value
            nodes.append(base + np.repeat(np.arange(len(lengths)), lengths))
    key, node = np.concatenate(keys), np.concatenate(nodes)
    order = np.lexsort((node, key))
    key, node = key[order], node[order]
    same = np.flatnonzero(key[1:] == key[:-1])
    n = len(docs)
    graph = coo_matrix((np.ones(same.size), (node[same], node[same + 1])), shape=(n, n))
    _, label = connected_components(graph.tocsr(), directed=False)
    out: dict[str, set[tuple[str, str, str]]] = {s: set() for s in buckets}
    clusters: dict[int, list[int]] = {}
    for i, c in enumerate(label.tolist()):
        clusters.setdefault(c, []).append(i)
    for members in clusters.values():
        if len(members) < 2:
            continue
        members.sort(key=lambda i: (-len(docs[i][2]), docs[i][0], docs[i][1]))
        texts = [docs[i][2][: params.max_chars_per_doc] for i in members]
        grams = ngram_sets(texts, params.ngram_size, params.max_chars_per_doc)
        verdict = verify_cluster_pairwise([len(docs[i][2]) for i in members], grams, [docs[i][0] in exempt for i in members], params)
        for r in verdict.removals:
            d, rep = docs[members[r.index]], docs[members[r.representative]]
            out[d[0]].add((d[1], rep[0], rep[1]))
    return out
