"""Global fuzzy dedup as a chain of shuffles; every step is a list of per-partition tasks.

Nodes are documents, ``node = slot << 40 | row``: ``slot`` is a number per source kept from
run to run and ``row`` the document's row within its source (shards in basename order) when
the source was first mapped. A source whose buckets changed keeps its slot, and each of its
documents that is still there (same id, same buckets) keeps its node; added documents get rows
past the source's previous ones. So the labels (smallest node) of clusters stay the same, and
when no clustered document is gone the previous components can only merge.

1. map, per minhash shard: bucket records ``(key = hash(band, bucket), node)`` and the shard's
   node table (``id``, ``chars``, ``node``, bucket ``digest``). Stored under ``cache/<source>/<fingerprint>``: a source
   whose buckets did not change keeps its map output (that is the stored per-partition index
   an incremental run joins a changed source against);
2. edges, per key range (``records_per_task``): star edges of every shared bucket;
3. connected components (:mod:`marin_assets.core.dedup.components`): label = smallest node of the component.
   Incremental (2-3b): edges only of the buckets that hold an added document (their records
   found by one scan of the map files), one union-find of the previous labels over them, and the
   previous label files rewritten with that remap (fresh labels compacted into one small file);
   members, plan and verify then see the touched clusters only and carry the others over;
4. members, per group of ``shards_per_map`` minhash shards: their labelled nodes, keyed by
   hash(label);
5. plan, per label range: which clusters must be verified: all, or, incrementally, those whose
   members (source, id) are not exactly those of the previous run's cluster with the same
   label (ids hash the text, so an equal member set has an equal verdict); their members are
   requested by node;
6. gather, per group of normalized shards that have requested rows: those rows' text, keyed
   by label;

Every step after the components writes block files (:func:`marin_assets.core.dedup.shuffle.write_blocks`) cut at
its readers' ranges, known before it runs: labels, touched rows and requests (keyed by node)
at the cuts of the shard groups' node ranges; member files at equal label-key ranges (as many
as verify partitions expected from the clustered documents); gathered texts at the verify
partitions, but big clusters' texts, which stay sorted Parquet read batch by batch. So each
task reads its own rows of every file, not a row group of each.
7. verify, per label range: the rule on each requested cluster (reading only its members'
   texts), the previous verdict for every other cluster; removal rows keyed by id;
8. removals, per id range, and publish, per group of sources (each range read once for the
   group): ``<out>/<source>/removed.parquet``.

No task reads more than ``FuzzyScale.max_inputs_per_task`` files: where a step's readers would
read more of the step before, merge tasks combine those files first, cut as their readers
expect (:mod:`marin_assets.core.dedup.fanin`); a task's many inputs are named by its step's
manifest in storage, not listed in its spec (:mod:`marin_assets.core.dedup.manifest`). A
component round's key range past its row bound (a heavy centre) runs as slices
(:mod:`marin_assets.core.dedup.star_rounds`). Verification keeps a cluster's retained n-grams
within ``verify_index_bytes`` (:mod:`marin_assets.core.dedup.retained`).

Counters for the metadata (removed documents and characters per source, the cluster-size
histogram, example pairs) come from what the tasks return; nothing re-reads the corpus.

One module per step: :mod:`.map`, :mod:`.edges`, :mod:`.added` and :mod:`.merge` (the
incremental planner and components), :mod:`.members`, :mod:`.plan`, :mod:`.gather`,
:mod:`.verify`, :mod:`.publish`; :mod:`.clusters` holds what plan and verify share,
:mod:`.layout` the files, schemas and task sizes, and :mod:`.driver` runs the steps in order.
"""

from marin_assets.core.dedup.fuzzy.driver import find_fuzzy_duplicates
from marin_assets.core.dedup.fuzzy.layout import FuzzyScale

__all__ = ["FuzzyScale", "find_fuzzy_duplicates"]
