"""The ``api`` kind: sources listed by a provider API (manifests, presigned listings).

Each family's recipe is chosen by the entry's transform:

| transform | source | module |
|---|---|---|
| ``docx_corpus_records`` | docx-corpus/en | ``providers.docx_corpus`` |
| ``nsf_award_abstracts`` | nsf_awards | ``providers.nsf_awards`` |

Base URLs (and the links the APIs answer) are rewritten by ``MARIN_WEB_MIRROR`` (see
``providers.http``).
"""

from __future__ import annotations

from typing import Any

from marin_assets.core.ingest.providers import ProviderAccess, docx_corpus, nsf_awards, register
from marin_assets.core.ingest.providers.rawcopy import Progress, ProviderError
from marin_assets.core.runtime import storage

RECIPES = {
    "docx_corpus_records": docx_corpus.fetch,
    "nsf_award_abstracts": nsf_awards.fetch,
}


@register("api")
def fetch(source: Any, layout: storage.Layout, progress: Progress = None, *, access: ProviderAccess = ProviderAccess()) -> dict[str, Any]:
    recipe = RECIPES.get(source.transform or "")
    if recipe is None:
        raise ProviderError(
            f"source '{source.name}': no api recipe for transform {source.transform!r} "
            f"(known: {', '.join(sorted(RECIPES))}); add one in marin_assets/core/ingest/providers/api.py"
        )
    return recipe(source, layout, progress, access=access)
