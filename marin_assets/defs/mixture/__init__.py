"""Mixture search: studies, proxy runs, surrogates, gated weights and their validation (assets,
partitions, the ``mixture_studies`` sensor); their jobs are the study phases of ``core.specs.PHASES``."""
