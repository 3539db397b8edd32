"""Decontamination: the eval sets of the registry, their 13-gram index with attribution, the
drop sets of common n-grams, and both marking rules per document.

May import: runtime, ingest (to fetch eval sets like provider files), catalog.
"""
