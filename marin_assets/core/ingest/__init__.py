"""Ingest: from a catalog entry to canonical Parquet. Providers (the Hub client, buckets, web,
API, pre-staged) copy pinned files under ``raw/``; formats and family transforms read them;
normalize writes id-sorted shards. Also pin drift and the recipe status of catalog entries.

May import: runtime, catalog.
"""
