"""Deduplication: MinHash LSH buckets per document, then global exact and fuzzy dedup as
shuffles through storage (connected components, verification), written as sparse removal lists
per source.

May import: runtime.
"""
