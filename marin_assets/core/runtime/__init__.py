"""Runtime: what every stage runs on. Storage under one root (layout, atomic writes,
manifests), the stage protocol (``StageSpec``, fingerprints, reuse) and the shard runner
(in-process, process pool, Ray), the one retry loop, path and credential trust, and the
helpers every compiled kernel needs (the four error kinds are ``marin_assets.errors``, below
every layer).

May import: nothing else of marin_assets (but ``marin_assets.errors``).
"""
