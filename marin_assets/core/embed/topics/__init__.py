"""Topics: 40 clusters of the document embeddings, each with a readable label.

A global model is trained once on a sample of all sources, then every document is assigned
shard by shard.

Training, in order:

1. **Sample** ``sample_size`` rows (10M) across sources in proportion to their row counts
   (largest-remainder rounding). A source with at most 1,000 rows contributes one row, its
   proportional share at production scale. Rows are drawn at random within each shard with a
   generator seeded from ``sha256(f"{seed}:{source}:{shard basename}")``, so a source's draw
   does not depend on the others, nor on where the data lives. When the corpus has no more rows
   than ``sample_size`` the sample is the whole corpus. Tasks draw it; the step never holds it.
2. **Fine k-means**: spherical FAISS k-means with many centroids (5,000; 20 iterations, best
   of 3 runs) on a source-stratified training subset of at most 512 rows per centroid.
   Many fine centroids first, because a direct k = 40 k-means lets a few dense regions grab
   most centroids and leaves tiny topics.
3. **Weights**: every sample row goes to its nearest fine centroid; the counts are the weights.
4. **Coarsening** the fine centroids into 40 topics by weighted divisive spherical 2-means
   (split the highest-loss cluster, best of 10 restarts, then repair so every cluster keeps at
   least 1% of the total weight), keeping the best of seeds 42/43/44, followed by
   hill-climbing that moves single fine centroids between topics while the total resultant
   norm grows and the 1% floor holds. Loss of a cluster = sum of weights - norm of the weighted
   sum of its unit vectors (a weighted cosine distance).
5. **Labels**: the top c-TF-IDF terms (1-2-grams, English stop-words removed) of each topic
   over a random subset of sample texts plus the documents nearest the topic's centroid, and
   500-character excerpts of those nearest documents.

Steps 2-4 and the choice of step 5's rows are one task (``fit_topics``) that reads the sample's
parts and holds the sample (10^7 x 1024 float16: 19 GiB, and the float32 training subset: 10 GiB),
reserving ``fit_memory_bytes`` and ``threads`` CPUs (its FAISS threads); the step then holds only the 10^5 label rows
(where each came from, its topic), reads their texts by tasks and computes the labels.

Small corpora (the demo): when the sample has no more rows than ``k_fine``, the sample vectors
themselves serve as fine centroids (weight 1 each: k-means cannot be finer than one centroid per
row, and with a handful of rows per centroid it is noisy). With fewer than
``min_points_per_fine`` (4) rows per fine centroid, k_fine becomes ``n_sample // 4`` (and the
rows again when that is below the number of topics). The number of topics becomes
``min(n_topics, n_sample)``; the coarsening stops early, and says so in ``n_topics``, when the
1% floor leaves no cluster that can be split further. Fine centroids left empty by the final assignment carry no weight
and are dropped (counted in the stats) rather than failing: on small samples k-means can leave
one empty.

FAISS k-means is run single-threaded by default because it is not bit-stable across thread
counts or machines; a trained model is copied, not recomputed, to reproduce it elsewhere.

One module per step: :mod:`.sampling` (1), :mod:`.kmeans` (2-3), :mod:`.coarsening` (4),
:mod:`.labels` (5), :mod:`.fit` (steps 2-4 and the choice of step 5's rows as one task),
:mod:`.training` (the steps in order) and :mod:`.assignment` (per shard); :mod:`.model` holds
the model and its files, :mod:`.layout` the parameters, file names and task sizes.
"""

from marin_assets.core.embed.topics.assignment import (
    AssignParams,
    _cached_topic_model,
    assign_topics_shard,
    topic_labels,
)
from marin_assets.core.embed.topics.coarsening import (
    cluster_loss,
    coarsen,
    divisive_split,
    hill_climb,
    split_in_two,
    total_loss,
)
from marin_assets.core.embed.topics.fit import (
    FitParams,
    effective_sizes,
    fit_fine_topics,
    fit_topics,
    float32_rows,
    read_fit,
    training_rows,
)
from marin_assets.core.embed.topics.kmeans import (
    nearest_centroids,
    spherical_kmeans,
)
from marin_assets.core.embed.topics.labels import (
    LabelRows,
    TextParams,
    _read_texts,
    choose_label_rows,
    concat_text_parts,
    ctfidf_terms,
    read_texts,
    short_label,
    topic_labels_of,
)
from marin_assets.core.embed.topics.layout import (
    FINE_CENTROIDS,
    FINE_TO_TOPIC,
    FINE_WEIGHTS,
    LABEL_ROWS,
    SourceShards,
    TOPICS_JSON,
    TRAIN_STATS_JSON,
    TopicParams,
)
from marin_assets.core.embed.topics.model import (
    TopicLabel,
    TopicModel,
    load_topic_arrays,
    load_topic_model,
    save_topic_arrays,
    save_topic_model,
)
from marin_assets.core.embed.topics.sampling import (
    EmbeddingSample,
    SampleParams,
    SamplePlan,
    concat_sample_parts,
    draw_sample,
    float32_batches,
    largest_remainder,
    load_sample_parts,
    plan_sample,
    read_rows,
    sample_embeddings,
    sample_shards,
    shard_seed,
    source_quotas,
)
from marin_assets.core.embed.topics.training import (
    train_topic_model,
)

__all__ = [
    "AssignParams",
    "EmbeddingSample",
    "FINE_CENTROIDS",
    "FINE_TO_TOPIC",
    "FINE_WEIGHTS",
    "FitParams",
    "LABEL_ROWS",
    "LabelRows",
    "SampleParams",
    "SamplePlan",
    "SourceShards",
    "TOPICS_JSON",
    "TRAIN_STATS_JSON",
    "TextParams",
    "TopicLabel",
    "TopicModel",
    "TopicParams",
    "_cached_topic_model",
    "_read_texts",
    "assign_topics_shard",
    "choose_label_rows",
    "cluster_loss",
    "coarsen",
    "concat_sample_parts",
    "concat_text_parts",
    "ctfidf_terms",
    "divisive_split",
    "draw_sample",
    "effective_sizes",
    "fit_fine_topics",
    "fit_topics",
    "float32_batches",
    "float32_rows",
    "hill_climb",
    "largest_remainder",
    "load_sample_parts",
    "load_topic_arrays",
    "load_topic_model",
    "nearest_centroids",
    "plan_sample",
    "read_fit",
    "read_rows",
    "read_texts",
    "sample_embeddings",
    "sample_shards",
    "save_topic_arrays",
    "save_topic_model",
    "shard_seed",
    "short_label",
    "source_quotas",
    "spherical_kmeans",
    "split_in_two",
    "topic_labels",
    "topic_labels_of",
    "total_loss",
    "train_topic_model",
    "training_rows",
]
