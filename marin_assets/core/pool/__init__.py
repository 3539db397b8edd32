"""The curated pool: each document's tokens (counted once), each source's surviving documents
filed under its sampling group, and the sampling groups' documents, tokens and default weights.

May import: runtime, embed, ingest (the tokenizer's pinned download).
"""
