"""Catalog layer: the source registry as data (``sources.toml``) and its typed loader.

Never imports dagster; the Dagster wiring reads the catalog through ``load_catalog``.
"""

from marin_assets.catalog.sources import (
    PROVIDER_KINDS,
    Catalog,
    CatalogError,
    Provider,
    Source,
    default_catalog_path,
    format_sources_table,
    load_catalog,
    parse_catalog,
)

__all__ = [
    "PROVIDER_KINDS",
    "Catalog",
    "CatalogError",
    "Provider",
    "Source",
    "default_catalog_path",
    "format_sources_table",
    "load_catalog",
    "parse_catalog",
]
