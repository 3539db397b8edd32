"""The ``web`` kind: plain HTTP(S) downloads and hand-staged web archives.

Several sources share the kind; each family's recipe is chosen by the entry's transform:

| transform | source | module |
|---|---|---|
| ``hplt_register_filter`` | hplt_v3 | ``providers.hplt`` |
| ``massive_function_calling`` | massive_function_calling | ``providers.massive`` |
| ``ghalogs_sanitize`` | ghalogs/public | ``providers.ghalogs`` (staged by hand) |

Base URLs are rewritten by ``MARIN_WEB_MIRROR`` (see ``providers.http``).
"""

from __future__ import annotations

from typing import Any

from marin_assets.core.ingest.providers import ProviderAccess, ghalogs, hplt, massive, register
from marin_assets.core.ingest.providers.rawcopy import Progress, ProviderError
from marin_assets.core.runtime import storage

RECIPES = {
    "hplt_register_filter": hplt.fetch,
    "massive_function_calling": massive.fetch,
    "ghalogs_sanitize": ghalogs.fetch,
}


@register("web")
def fetch(source: Any, layout: storage.Layout, progress: Progress = None, *, access: ProviderAccess = ProviderAccess()) -> dict[str, Any]:
    recipe = RECIPES.get(source.transform or "")
    if recipe is None:
        raise ProviderError(
            f"source '{source.name}': no web recipe for transform {source.transform!r} "
            f"(known: {', '.join(sorted(RECIPES))}); add one in marin_assets/core/ingest/providers/web.py"
        )
    return recipe(source, layout, progress, access=access)
