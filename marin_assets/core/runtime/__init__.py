"""Runtime: what every stage runs on. Storage under one root (layout, atomic writes,
manifests), the stage protocol (``StageSpec``, fingerprints, reuse) and the shard runner
(in-process, process pool, Ray), the one retry loop, path and credential trust, the four
error kinds, and the helpers every compiled kernel needs.

May import: nothing else of marin_assets.
"""
