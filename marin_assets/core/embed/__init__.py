"""Embeddings and what is computed from them: document vectors, the topic model and topic per
document, the quality scorer, scores and bands per topic.

May import: runtime.
"""
