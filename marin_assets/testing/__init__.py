"""What tests and the demo need but the pipeline does not: the local Hub-compatible server
with fault injection (``hub_server``), served by ``marin-assets serve-hub``, and the paraphrase
fixture of the semantic decontamination bench and tests (``paraphrase``).

Not a pipeline stage: nothing under ``core``, ``catalog`` or ``defs`` imports it.
"""
