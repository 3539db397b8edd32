"""The four kinds of failure every error of the project belongs to.

Each error class of the project derives from one of these, so callers, messages and tests can
ask what kind of problem it is without knowing the module that raised it:

* ``BadInput``: data the pipeline was given cannot be used as it is (a corrupt or mislabelled
  file, rows that do not parse, a stage input that is missing); the message names the source,
  the file and the fix.
* ``ProviderRefused``: a provider said no or is gone (401/403, a withdrawn revision, a host
  that does not resolve, retries that ran out); rerunning later or fixing access helps.
* ``IntegrityFailure``: bytes or paths a provider sent are not what it promised (size or hash
  mismatch, a listing that names a path outside its destination); never trusted, never stored.
* ``ConfigurationError``: the catalog, a setting or a recipe is wrong; fix it, then rerun.
"""

from __future__ import annotations


class MarinError(Exception):
    """Root of the project's errors."""


class BadInput(MarinError):
    """Input data that cannot be used as it is."""


class ProviderRefused(MarinError):
    """A provider refused, withdrew or could not serve what was asked."""


class IntegrityFailure(MarinError):
    """What a provider sent does not match what it promised, or would escape its destination."""


class ConfigurationError(MarinError):
    """The catalog, a setting or a recipe is wrong."""


class CorruptOutput(IntegrityFailure):
    """A published file whose bytes differ from those its stage wrote (a flipped bit, a cut-off file)."""


KINDS = (BadInput, ProviderRefused, IntegrityFailure, ConfigurationError)

# A server that serves only part of the catalog (the local demo Hub) says so on every 404, in
# this header: which sources it serves and how to get the others.
NOT_SERVED_HEADER = "X-Marin-Not-Served"


class NotServedHere(ProviderRefused):
    """The endpoint serves only some sources, and not this one: not a gone pin, a wrong endpoint."""


def not_served_here(headers, what: str) -> NotServedHere | None:
    """``NotServedHere`` when a 404's ``headers`` carry the server's note on what it serves."""
    note = headers.get(NOT_SERVED_HEADER) if headers is not None else None
    return NotServedHere(f"{what} is not served by this endpoint: {note}") if note else None


def kind_of(error: BaseException) -> str:
    """``bad_input``, ``provider_refused``, ``integrity`` or ``configuration`` (``other`` if none)."""
    names = {IntegrityFailure: "integrity", BadInput: "bad_input", ConfigurationError: "configuration",
             ProviderRefused: "provider_refused"}  # most specific first: a corrupt download is integrity  # fmt: skip
    for base, name in names.items():
        if isinstance(error, base):
            return name
    return "other"
