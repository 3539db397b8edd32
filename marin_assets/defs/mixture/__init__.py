"""Mixture search: studies, proxy runs, surrogates and optimized weights (assets, partitions,
the ``mixture_studies`` sensor); their jobs are the study phases of ``core.specs.PHASES``."""
