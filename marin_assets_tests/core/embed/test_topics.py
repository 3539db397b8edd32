"""Topics: sampling, coarsening with the 1% floor, labels and assignment (real offline model)."""

from __future__ import annotations

import dataclasses

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from marin_assets.core.embed import embeddings as embed
from marin_assets.core.embed import topics
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.integrity import text_ids

DOMAINS: dict[str, list[str]] = {
    "code": [
        "The function returns a list of integers; call sorted() on the result before you return it from the module.",
        "Define a Python class with an __init__ method, then import it in the test module and call each method.",
        "This JavaScript function fetches JSON from the API endpoint and returns a promise with the parsed object.",
        "Compile the program with gcc, fix the segmentation fault in the pointer loop and run the unit tests again.",
        "Use a Python dictionary to cache the function results, so the recursive call returns in constant time.",
        "The variable is declared inside the loop, so the compiler reports an error when the function returns it.",
        "Refactor the class: extract the parsing code into a function and add a type annotation to each argument.",
        "Git rebase rewrote the commit history; push the branch again and open a pull request for code review.",
        "The SQL query in our Python script joins two tables; the function returns the rows and the code logs any error.",
        "Install the package with pip, import the module in Python and call its main function from the command line.",
    ],
    "cooking": [
        "Preheat the oven to 180 degrees, cream the butter with sugar, then fold in the flour and bake the cake.",
        "Chop two onions and a clove of garlic, fry them in olive oil, add the tomatoes and simmer the sauce.",
        "For the bread dough, mix flour, yeast, salt and warm water, knead for ten minutes and let it rise.",
        "Season the chicken with salt and pepper, roast it in the oven and baste it with butter every twenty minutes.",
        "Whisk the eggs with sugar, add melted butter and flour, pour the batter into the tin and bake the cookies.",
        "This soup recipe needs carrots, onions, celery and stock; simmer the vegetables until tender, then blend.",
        "Boil the pasta in salted water, toss it with garlic, olive oil and grated parmesan cheese and serve warm.",
        "Marinate the beef in soy sauce and ginger, then stir fry it with peppers in a very hot wok for the dinner.",
        "Spread the pastry in the dish, fill it with sliced apples, cinnamon and sugar and bake the pie until golden.",
        "Melt the chocolate with butter, stir in sugar and eggs, add flour and bake the brownies for half an hour.",
    ],
    "law": [
        "The court held that the contract was void because the defendant lacked capacity when he signed it.",
        "The plaintiff filed a motion for summary judgment, arguing that no genuine dispute of material fact existed.",
        "Under the statute, the landlord must give the tenant thirty days written notice before terminating the lease.",
        "The appellate court reversed the conviction, finding that the trial judge improperly admitted the evidence.",
        "The defendant breached the contract by failing to deliver the goods, and the plaintiff sued for damages.",
        "The Supreme Court ruled that the statute violated the constitutional right to due process of law.",
        "The jury found the defendant liable for negligence and the court awarded the plaintiff compensatory damages.",
        "A valid contract requires an offer, acceptance and consideration; the court found no consideration here.",
        "The attorney argued that the search warrant was invalid, so the court should suppress the evidence.",
        "The tenant appealed the eviction judgment, claiming the landlord failed to comply with the statute.",
    ],
    "mathematics": [
        "Let f be a continuous function on a closed interval; by the theorem, f attains its maximum and minimum.",
        "We prove the theorem by induction on n: the base case holds, and the inductive step follows from the lemma.",
        "Every finite group of prime order is cyclic, as follows from Lagrange's theorem on the order of subgroups.",
        "Theorem: the eigenvalues of a real symmetric matrix are real. Proof: apply the lemma to the quadratic form.",
        "The integral of the function over the interval equals the limit of Riemann sums as the partition refines.",
        "Suppose the sequence converges; then it is bounded, and the proof of the theorem follows from the lemma.",
        "The derivative of the polynomial vanishes at a double root, so the proof reduces to a lemma on polynomials.",
        "A prime number has exactly two divisors; Euclid's proof shows there are infinitely many prime numbers.",
        "The matrix is invertible if and only if its determinant is nonzero, which proves the theorem for linear maps.",
        "Let X be a compact metric space; every sequence in X has a convergent subsequence, by the theorem above.",
    ],
    "sport": [
        "The striker scored twice in the second half and the team won the league title on the final day of the season.",
        "The tennis champion won the final in straight sets after breaking her opponent's serve in the first game.",
        "The goalkeeper saved a penalty in the last minute, and the team held on to win the cup match one nil.",
        "The marathon runner set a new course record, finishing the race two minutes ahead of the defending champion.",
        "The coach made three substitutions at half time and the team came back to win the match in extra time.",
        "The basketball team won the championship after the point guard scored thirty points in the final game.",
        "The cyclist won the mountain stage of the race and took the leader's jersey from the defending champion.",
        "The fans cheered as the home team scored a late goal to win the derby and climb to the top of the league.",
        "The batsman scored a century as the cricket team won the test match and the series against the champions.",
        "The season ended with the team winning the league; their captain scored the decisive goal in the final match.",
    ],
    "medicine": [
        "Patients with type 2 diabetes were randomized to metformin or placebo, and the primary outcome was blood glucose.",
        "The patient presented with chest pain and shortness of breath; the ECG showed signs of myocardial infarction.",
        "The clinical trial found that the vaccine reduced hospital admissions for influenza among elderly patients.",
        "Hypertension is treated with diet, exercise and drugs such as ACE inhibitors to lower the patient's blood pressure.",
        "The doctor prescribed antibiotics for the bacterial infection and asked the patient to return if the fever persisted.",
        "In this cohort of patients, the dose of the drug was adjusted for kidney function to avoid toxic side effects.",
        "Symptoms of the disease include fever, cough and fatigue; diagnosis is confirmed with a blood test in the clinic.",
        "The surgeon removed the tumour, and the patient received chemotherapy to reduce the risk of cancer recurrence.",
        "Asthma patients use an inhaler with corticosteroids to reduce inflammation of the airways and prevent attacks.",
        "The randomized clinical trial measured mortality in patients with heart failure treated with the new drug.",
    ],
}

DOMAIN_WORDS = {
    "code": {"function", "python", "returns", "module", "class", "code", "call", "import", "compiler", "return", "method"},
    "cooking": {"butter", "flour", "oven", "sugar", "bake", "olive", "oil", "garlic", "recipe", "sauce", "eggs", "onions"},
    "law": {"court", "plaintiff", "defendant", "contract", "statute", "judgment", "law", "evidence", "landlord", "tenant"},
    "mathematics": {"theorem", "proof", "lemma", "function", "matrix", "sequence", "prime", "interval", "polynomial"},
    "sport": {"team", "won", "scored", "champion", "league", "match", "final", "goal", "race", "season", "win"},
    "medicine": {"patients", "patient", "trial", "drug", "clinical", "blood", "disease", "fever", "cancer", "dose"},
}


# --------------------------------------------------------------------------- pure pieces


def _doc_id(prefix: str, i: int) -> str:
    return hashlib.md5(f"{prefix}:{i}".encode()).hexdigest()  # 32 hex chars, like the real ids


def test_largest_remainder_rounding_and_caps():
    assert topics.largest_remainder(10, [1, 1, 1]) == [4, 3, 3]
    assert topics.largest_remainder(7, [5, 3, 2]) == [4, 2, 1]  # 3.5/2.1/1.4: leftover unit to the 0.5
    assert topics.largest_remainder(10, [10, 10, 1], caps=[2, 100, 100]) == [2, 7, 1]
    assert topics.largest_remainder(50, [1, 1], caps=[3, 4]) == [3, 4]
    shares = topics.largest_remainder(1_000, [3, 7, 0, 11, 13])
    assert sum(shares) == 1_000 and shares[2] == 0


def test_source_quotas_are_proportional_with_one_row_for_small_sources():
    counts = {"big": 600_000, "mid": 300_000, "tiny": 1_000, "tinier": 7, "other": 100_000}
    quotas = topics.source_quotas(counts, 10_000)
    assert quotas["tiny"] == quotas["tinier"] == 1
    assert sum(quotas.values()) == 10_000
    assert quotas["big"] == pytest.approx(2 * quotas["mid"], abs=1)
    assert quotas["mid"] == pytest.approx(3 * quotas["other"], abs=1)
    # a sample as large as the corpus is the corpus
    assert topics.source_quotas(counts, 10_000_000) == counts


def _write_vectors(uri: str, vectors: np.ndarray, prefix: str) -> list[str]:
    ids = [_doc_id(prefix, i) for i in range(len(vectors))]
    table, _ = embed.embeddings_table(ids, vectors, embed.EmbedParams(encoder=embed.offline_encoder_params()))
    storage.write_parquet(table, uri)
    return ids


def _random_sources(root: str, sizes: dict[str, list[int]], dim: int = 16) -> list[topics.SourceShards]:
    rng = np.random.default_rng(7)
    out = []
    for source, shard_sizes in sizes.items():
        uris = []
        for i, n in enumerate(shard_sizes):
            uri = storage.join(root, source, storage.shard_name(i, len(shard_sizes)))
            _write_vectors(uri, rng.normal(size=(n, dim)).astype(np.float32), f"{source}{i}")
            uris.append(uri)
        out.append(topics.SourceShards(source, tuple(uris)))
    return out


def test_sample_follows_quotas_and_per_shard_seeds(tmp_path):
    sizes = {"web": [1500, 1500], "books": [1200], "small": [300]}
    sources = _random_sources(str(tmp_path / "a"), sizes)
    params = topics.TopicParams(sample_size=900)
    sample = topics.sample_embeddings(sources, params)
    per_source = {s.source: int((sample.source == i).sum()) for i, s in enumerate(sources)}
    assert per_source == {"web": 642, "books": 257, "small": 1}  # 899 x 3000/4200 = 642.14, x 1200/4200 = 256.86
    assert len(np.unique(sample.ids)) == len(sample) == 900
    assert np.allclose(np.linalg.norm(sample.vectors.astype(np.float32), axis=1), 1, atol=2e-3)

    # the same data under another root draws the same rows; another seed draws other rows
    moved = topics.sample_embeddings(_random_sources(str(tmp_path / "b"), sizes), params)
    assert np.array_equal(moved.ids, sample.ids)
    reseeded = topics.sample_embeddings(sources, topics.TopicParams(sample_size=900, seed=43))
    assert not np.array_equal(reseeded.ids, sample.ids)
    assert np.array_equal(np.sort(reseeded.source), np.sort(sample.source))

    train = topics.training_rows(sample.source, 30, seed=42)
    assert len(train) == 30 and set(sample.source[train].tolist()) == {0, 1, 2}


def test_the_sample_drawn_by_tasks_with_counted_rows_is_the_same_and_reads_no_footer(tmp_path, monkeypatch):
    from marin_assets.core.runtime.runner import ShardRunner

    sizes = {"web": [700, 800, 600], "books": [1200], "small": [300, 250]}
    sources = _random_sources(str(tmp_path / "a"), sizes)
    params = topics.TopicParams(sample_size=900)
    whole = topics.sample_embeddings(sources, params)
    counted = [dataclasses.replace(s, rows=tuple(sizes[s.source])) for s in sources]
    kinds: list[int] = []

    class Counting(ShardRunner):
        def map(self, tasks, on_done=None):
            kinds.append(len(tasks))
            return super().map(tasks, on_done)

    monkeypatch.setattr(topics.layout, "SHARDS_PER_SAMPLE_TASK", 2)
    monkeypatch.setattr(topics.layout, "PARTS_PER_COMBINE_TASK", 2)
    monkeypatch.setattr(storage, "parquet_num_rows", lambda uri: pytest.fail(f"read the footer of {uri}"))
    work = tmp_path / "work"
    by_tasks = topics.sample_embeddings(counted, params, Counting(), str(work))
    assert kinds == [3, 2] and not work.exists()  # 6 shards by 3 tasks, their parts put together by 2
    for field in ("vectors", "ids", "source", "shard", "row"):
        assert np.array_equal(getattr(by_tasks, field), getattr(whole, field)), field


def _lopsided(heavy_weight: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    dim, k = 24, 400
    directions = rng.normal(size=(5, dim))
    centroids = directions[rng.integers(0, 5, k)] + 0.5 * rng.normal(size=(k, dim))
    centroids = (centroids / np.linalg.norm(centroids, axis=1, keepdims=True)).astype(np.float32)
    weights = rng.integers(1, 20, k).astype(np.float64)
    weights[:10] = heavy_weight  # ten fine centroids hold a large share of the weight
    return centroids, weights


def test_coarsening_keeps_every_topic_above_one_percent_of_lopsided_weight():
    centroids, weights = _lopsided(200.0)
    lookup, info = topics.coarsen(centroids, weights, 40, topics.TopicParams(split_restarts=4))

    topic_weight = np.bincount(lookup, weights=weights, minlength=40)
    assert lookup.max() + 1 == 40 and lookup.dtype == np.int16
    assert topic_weight.min() >= 0.01 * weights.sum()
    assert np.all(np.diff(topic_weight) <= 1e-9)  # numbered by decreasing weight
    assert info["coarsen_seed"] in (42, 43, 44)
    assert info["loss"] <= info["split_loss"] + 1e-9  # hill-climbing never makes it worse
    assert np.isclose(info["loss"], topics.total_loss(centroids, weights, lookup))


def test_coarsening_stops_short_rather_than_break_the_floor():
    # ten centroids hold ~84% of the weight: the light rest cannot fill 30 more topics of 1%
    centroids, weights = _lopsided(2_000.0)
    lookup, _ = topics.coarsen(centroids, weights, 40, topics.TopicParams(split_restarts=4, coarsen_seeds=(42,)))
    n_topics = int(lookup.max()) + 1
    assert 10 < n_topics < 40
    assert np.bincount(lookup, weights=weights).min() >= 0.01 * weights.sum()


def test_hill_climbing_moves_a_misplaced_centroid_but_respects_the_floor():
    east, north = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    centroids = np.array([east, east, north, north, east], dtype=np.float32)
    weights = np.array([10.0, 10.0, 10.0, 10.0, 1.0])
    labels = np.array([0, 0, 1, 1, 1])  # the last "east" centroid sits in the north topic
    moved, moves = topics.hill_climb(centroids, weights, labels, min_weight=0.0, max_sweeps=10)
    assert moves == 1 and moved.tolist() == [0, 0, 1, 1, 0]
    stuck, moves = topics.hill_climb(centroids, weights, labels, min_weight=20.5, max_sweeps=10)
    assert moves == 0 and stuck.tolist() == labels.tolist()


# --------------------------------------------------------------------------- acceptance (real model)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """Two sources of domain texts, normalized and embedded with the bundled model (once)."""
    root = tmp_path_factory.mktemp("topics")
    params = embed.EmbedParams(encoder=embed.offline_encoder_params())
    rows = [(domain, text) for domain, texts in DOMAINS.items() for text in texts]
    order = np.random.default_rng(0).permutation(len(rows))
    halves = {"forum": order[: len(rows) // 2], "papers": order[len(rows) // 2 :]}
    sources, domain_of = [], {}
    for source, members in halves.items():
        norm_uris, emb_uris = [], []
        for shard, part in enumerate(np.array_split(np.sort(members), 2)):
            name = storage.shard_name(shard, 2)
            texts = [rows[int(i)][1] for i in part]
            ids = text_ids(texts)  # as normalize makes them (embed_shard checks them)
            domain_of.update({doc_id: rows[int(i)][0] for doc_id, i in zip(ids, part)})
            norm_uri = str(root / "normalized" / source / name)
            storage.write_parquet(pa.table({"id": ids, "text": texts, "source_id": ids}), norm_uri)
            emb_uri = str(root / "embeddings" / source / name)
            embed.embed_shard([norm_uri], emb_uri, params)
            norm_uris.append(norm_uri)
            emb_uris.append(emb_uri)
        sources.append(topics.SourceShards(source, tuple(emb_uris), tuple(norm_uris)))
    return {"root": root, "sources": sources, "domain_of": domain_of}


def _train(corpus: dict, name: str, **overrides) -> tuple[topics.TopicModel, dict]:
    uri = str(corpus["root"] / "models" / name)
    stats = topics.train_topic_model(corpus["sources"], uri, topics.TopicParams(**overrides))
    return topics.load_topic_model(uri), stats


def _assign_all(corpus: dict, model_uri: str) -> dict[str, int]:
    topic_of = {}
    for src in corpus["sources"]:
        for uri in src.embeddings:
            out = uri.replace("/embeddings/", "/topics/" + storage.basename(model_uri) + "/")
            topics.assign_topics_shard([uri], out, topics.AssignParams(model_uri))
            table = storage.read_parquet(out)
            topic_of.update(zip(table.column("id").to_pylist(), table.column("topic").to_pylist()))
    return topic_of


def test_domains_land_in_different_topics_and_labels_name_them(corpus):
    model, stats = _train(corpus, "six", n_topics=6)
    # 60 documents, fewer than k_fine: the documents themselves are the fine centroids
    assert model.n_topics == 6 and stats["k_fine"] == 60 and stats["fine_centroids_are_rows"]
    topic_of = _assign_all(corpus, str(corpus["root"] / "models" / "six"))
    by_domain: dict[str, list[int]] = {}
    for doc_id, topic in topic_of.items():
        by_domain.setdefault(corpus["domain_of"][doc_id], []).append(topic)
    majority = {d: np.bincount(t).argmax() for d, t in by_domain.items()}
    assert len(set(majority.values())) == 6, majority
    for domain, assigned in by_domain.items():
        assert sum(t == majority[domain] for t in assigned) >= 9, (domain, assigned)
        label = model.topics[majority[domain]]
        words = {w for term in label.terms for w in term.split()}
        assert words & DOMAIN_WORDS[domain], (domain, label.terms)
        assert label.label and len(label.excerpts) == 5 and all(len(e) <= 500 for e in label.excerpts)


def test_small_corpus_gets_forty_topics_each_above_one_percent(corpus):
    model, stats = _train(corpus, "forty")
    assert stats["fine_centroids_are_rows"] and stats["k_fine"] == 60
    assert model.n_topics == 40 and stats["sample_rows"] == 60
    fractions = np.array([t.weight_fraction for t in model.topics])
    assert fractions.min() >= 0.01 and np.isclose(fractions.sum(), 1.0)
    topic_of = _assign_all(corpus, str(corpus["root"] / "models" / "forty"))
    assert set(topic_of.values()) == set(range(40))


def test_the_fit_runs_faiss_on_the_threads_it_reserves_and_refits_the_same_model(corpus, monkeypatch):
    """At its full sample the fit uses ``threads`` (recorded in topics.json); two fits with the same
    settings give identical models (k-means, assignment and coarsening with 2 threads)."""
    import faiss

    seen: list[int] = []
    real = topics.fit.spherical_kmeans

    def recording(*args, **kwargs):
        seen.append(faiss.omp_get_max_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(topics.fit, "spherical_kmeans", recording)
    settings = {"n_topics": 6, "k_fine": 20, "sample_size": 60, "threads": 2}
    (a, _), (b, _) = _train(corpus, "threads-a", **settings), _train(corpus, "threads-b", **settings)
    assert seen == [2, 2] and a.meta["params"]["threads"] == 2
    assert np.array_equal(a.fine_centroids, b.fine_centroids) and np.array_equal(a.fine_to_topic, b.fine_to_topic)
    assert np.array_equal(a.fine_weights, b.fine_weights)
    # a sample of a sixth of sample_size: a sixth of the threads (at least 1), and its record says so
    small, _ = _train(corpus, "threads-small", **{**settings, "sample_size": 360, "threads": 12})
    assert seen[-1] == 2 and small.meta["params"]["threads"] == 2


@pytest.mark.system
def test_kmeans_with_several_threads_repeats_itself():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((8, 64))[rng.integers(0, 8, 20_000)] + rng.standard_normal((20_000, 64))).astype(np.float32)
    runs = [topics.kmeans.spherical_kmeans(x, 40, iterations=10, restarts=2, seed=7, threads=2) for _ in range(2)]
    assert np.array_equal(runs[0], runs[1])


def test_training_is_deterministic_for_a_seed(corpus):
    # k_fine=20 < 60 rows: FAISS k-means with 60 // 4 = 15 fine centroids, then coarsening
    a, stats_a = _train(corpus, "again-a", n_topics=6, k_fine=20)
    b, stats_b = _train(corpus, "again-b", n_topics=6, k_fine=20)
    assert stats_a["k_fine"] == 15 and not stats_a["fine_centroids_are_rows"]
    assert np.array_equal(a.fine_centroids, b.fine_centroids)
    assert np.array_equal(a.fine_to_topic, b.fine_to_topic)
    assert [t.label for t in a.topics] == [t.label for t in b.topics]
    assert stats_a["loss"] == stats_b["loss"]


def test_assignment_writes_nearest_fine_centroid_distance_and_topic(corpus):
    model, _ = _train(corpus, "direct", n_topics=6, method="direct")
    assert model.n_topics == 6 and len(model.fine_centroids) == 6
    uri = corpus["sources"][0].embeddings[0]
    out = str(corpus["root"] / "assign" / storage.basename(uri))
    stats = topics.assign_topics_shard([uri], out, topics.AssignParams(str(corpus["root"] / "models" / "direct")))
    table = storage.read_parquet(out)
    assert table.schema.names == ["id", "fine_cluster", "distance", "topic"]
    types = [table.schema.field(c).type for c in ("fine_cluster", "distance", "topic")]
    assert types == [pa.int32(), pa.float32(), pa.int16()]
    ids, vectors = embed.load_embeddings([uri])
    assert table.column("id").to_pylist() == ids
    squared = ((vectors[:, None, :] - model.fine_centroids[None, :, :]) ** 2).sum(axis=2)
    fine = table.column("fine_cluster").to_numpy()
    assert np.array_equal(fine, squared.argmin(axis=1))
    assert np.allclose(table.column("distance").to_numpy(), squared.min(axis=1), atol=1e-4)
    assert np.array_equal(table.column("topic").to_numpy(), model.fine_to_topic[fine])
    assert sum(stats["topic_rows"]) == stats["rows"] == len(ids)


def test_label_texts_are_read_by_tasks_and_checked_against_the_embeddings(corpus, tmp_path, monkeypatch):
    from marin_assets.core.runtime.runner import ShardRunner

    sample = topics.sample_embeddings(corpus["sources"], topics.TopicParams())
    kinds: list[int] = []

    class Counting(ShardRunner):
        def map(self, tasks, on_done=None):
            kinds.append(len(tasks))
            return super().map(tasks, on_done)

    monkeypatch.setattr(topics.layout, "SHARDS_PER_SAMPLE_TASK", 1)
    monkeypatch.setattr(topics.layout, "PARTS_PER_COMBINE_TASK", 3)
    rows = np.arange(0, len(sample), 2)
    texts = topics._read_texts(sample, rows, 40, Counting(), str(tmp_path / "work"))
    assert kinds == [4, 2] and not (tmp_path / "work").exists()  # a task per shard, their 4 parts put together by 2
    expected = {}
    for r in rows:
        _, _, text_uri = sample.shards[int(sample.shard[r])]
        table = storage.read_parquet(text_uri)
        expected[int(r)] = table.column("text")[int(sample.row[r])].as_py()[:40]
    assert texts == expected

    stale = dataclasses.replace(sample, ids=sample.ids[::-1].copy())
    with pytest.raises(ValueError, match="embeddings are stale"):
        topics._read_texts(stale, rows, 40, Counting(), str(tmp_path / "stale"))


def test_the_fit_is_one_task_with_its_reservation_that_alone_reads_the_sample(corpus):
    from marin_assets.core.runtime.runner import ShardRunner, TaskResources

    tasks: list = []
    loaded: list[int] = []

    class Recording(ShardRunner):
        def map(self, batch, on_done=None):
            tasks.extend(batch)
            return super().map(batch, on_done)

    real_load = topics.load_sample_parts

    def load(uris, n_rows):
        loaded.append(n_rows)
        return real_load(uris, n_rows)

    root = corpus["root"] / "models"
    small = topics.TopicParams(n_topics=6, k_fine=20, sample_size=60, fit_memory_bytes=3 << 30, threads=2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(topics.fit, "load_sample_parts", load)
        stats = topics.train_topic_model(corpus["sources"], str(root / "reserved"), small, Recording())
    fits = [t for t in tasks if t.fn is topics.fit_topics]
    assert len(fits) == 1 and fits[0].resources == TaskResources(cpus=2, memory_bytes=3 << 30)  # a full sample: as configured
    # a sample of a tenth of sample_size reserves a tenth, but at least 1 CPU and 1 GiB
    assert dataclasses.replace(small, sample_size=600, fit_memory_bytes=30 << 30).fit_reservation(60) == (1, 3 << 30)
    assert dataclasses.replace(small, sample_size=600).fit_reservation(60) == (1, 1 << 30)
    assert loaded == [60] and stats["sample_rows"] == 60  # the fit task read the sample; the step never did
    assert not (root / "reserved" / "_sample").exists() and not (root / "reserved" / "_fit").exists()

    # the memory reservation decides nothing: another one gives the same files, and is not in topics.json
    topics.train_topic_model(corpus["sources"], str(root / "default"), topics.TopicParams(n_topics=6, k_fine=20, sample_size=60, threads=2))
    for name in (topics.FINE_CENTROIDS, topics.FINE_TO_TOPIC, topics.FINE_WEIGHTS, topics.TOPICS_JSON):
        assert (root / "reserved" / name).read_bytes() == (root / "default" / name).read_bytes(), name
    assert "fit_memory_bytes" not in storage.read_json(str(root / "default" / topics.TOPICS_JSON))["params"]
