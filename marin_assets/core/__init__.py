"""Core layer: every computation, as plain functions over shards and URIs (no Dagster, no
environment reads), one package per part of the stage table.

* ``runtime``: storage, the stage protocol and its runner, retries, trust, errors, kernels;
* ``ingest``: providers and the Hub client to raw files, formats, transforms, normalize;
* ``dedup``: MinHash buckets, global exact and fuzzy deduplication;
* ``decon``: eval sets, the 13-gram index, drop sets and contamination marking;
* ``embed``: document embeddings, topics and quality scores and bands;
* ``pool``: the curated pool per source and the sampling groups;
* ``mixture``: mixture studies (swarm, proxy results, surrogate fits, weights);
* ``specs``: every stage as a ``StageSpec``, the one registry of stages.

Each package's docstring says which others it may import (its "May import:" line);
``marin_assets_tests/test_layers.py`` holds them to it.
"""
