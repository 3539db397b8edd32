"""Mixture studies: the study spec and its swarm of proxy mixtures, proxy results (the built-in
trainer or an external one), surrogate fits and the optimized weights.

May import: runtime, pool.
"""
