"""Every error class of the project is one of four kinds that messages and callers rely on."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import marin_assets
from marin_assets import errors

CONTROL_FLOW = {"Retryable", "Skip"}  # caught where raised, never shown to an operator


def project_errors() -> list[type]:
    found = set()
    for info in pkgutil.walk_packages(marin_assets.__path__, "marin_assets."):
        if info.name.startswith(("marin_assets.demo", "marin_assets.testing")) or info.name.endswith(("hub_server", "__main__")):
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__.startswith("marin_assets") and cls.__module__ != "marin_assets.errors":
                found.add(cls)
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__name__}")


def test_every_error_class_has_one_of_the_four_kinds():
    classes = project_errors()
    assert len(classes) >= 25
    kindless = [f"{c.__module__}.{c.__name__}" for c in classes if c.__name__ not in CONTROL_FLOW and not issubclass(c, errors.KINDS)]
    assert kindless == []


def test_kinds_read_as_expected():
    from marin_assets.core.ingest import hub
    from marin_assets.core.ingest.providers import http
    from marin_assets.core.runtime import trust

    assert errors.kind_of(hub.IntegrityError("x")) == "integrity"
    assert errors.kind_of(trust.UnsafePathError("x")) == "integrity"
    assert errors.kind_of(http.ProviderGoneError("x")) == "provider_refused"
    assert errors.kind_of(hub.HubAuthError("x")) == "provider_refused"
    assert errors.kind_of(ValueError("x")) == "other"
