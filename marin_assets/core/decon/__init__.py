"""Decontamination: the eval sets of the registry, their 13-gram index with attribution, the
drop sets of common n-grams, both marking rules per document, and the semantic tier (eval items
near a document's kept embedding).

May import: runtime, ingest (to fetch eval sets like provider files), embed (the pool's encoder, for the
semantic tier), catalog.
"""
