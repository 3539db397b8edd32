"""GitHub Actions run logs: redact secrets, pseudonymize people, keep the train partition.

Public CI logs leak credentials. Every log is first passed through ``REDACTIONS`` (private
key blocks, passwords in URLs, authorization headers and bearer tokens, GitHub, Hugging
Face, AWS, Slack, Google, OpenAI, Stripe, npm and PyPI tokens, JWTs, ``key = value``
secrets and ``--password value`` flags, internal bucket paths); the rules err on the side of
redacting too much. Then identities are pseudonymized per document: e-mail addresses, user
names before a redacted password in URLs, the user names in home directories (``/home/<name>``, ``/Users/<name>``, ``C:\\Users\\<name>``) and
every later mention of those names become ``<USER_n>`` (numbered in order of appearance).
Shared CI service accounts (``runner``, ``root`` ...) are not people and stay readable.

Each log's split key is ``ghalogs:<archive path>``; its source id is the key's sha256 and its
partition is fixed by a keyed BLAKE2b of the key: 97% train, 1% dev, 1% test, 1% held out
for evaluation. Only train rows are kept; the others are counted by partition.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping

import polars as pl

from marin_assets.core.ingest.transforms import register

# --------------------------------------------------------------------------- secrets

_KEY_WORDS = r"(?:api[_-]?key|access[_-]?key|secret|token|password|passwd|pwd|credentials?|auth[_-]?key|private[_-]?key)"
_PRIVATE_KEY_HEAD = r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
_PRIVATE_KEY_TAIL = r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"

# (pattern, replacement), applied in order: specific shapes first, generic key=value last.
REDACTIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(rf"{_PRIVATE_KEY_HEAD}(?:.*?{_PRIVATE_KEY_TAIL}|.*\Z)", re.S), "<REDACTED_PRIVATE_KEY>"),
    (re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^\s:/@]*):(?P<password>[^\s@/]+)@"), r"\g<scheme>\g<user>:<REDACTED_PASSWORD>@"),
    (re.compile(r"(?i)\b(?P<head>authorization\s*[:=]\s*[\"']?(?:bearer|token|basic|digest)\s+)[^\s\"',;]+"), r"\g<head><REDACTED_TOKEN>"),
    (re.compile(r"(?i)\b(?P<head>bearer\s+)[A-Za-z0-9._~+/-]{8,}=*"), r"\g<head><REDACTED_TOKEN>"),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}\b"), "<REDACTED_GITHUB_TOKEN>"),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}\b"), "<REDACTED_GITHUB_TOKEN>"),
    (re.compile(r"\b(?:hf|api_org)_[A-Za-z0-9]{30,}\b"), "<REDACTED_HF_TOKEN>"),
    (re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|ABIA|ACCA)[A-Z0-9]{16}\b"), "<REDACTED_AWS_ACCESS_KEY>"),
    (re.compile(r"(?i)(?P<head>\baws[_-]?secret[_-]?access[_-]?key[\"']?\s*[:=]\s*[\"']?)[A-Za-z0-9/+=]{40}"), r"\g<head><REDACTED_AWS_SECRET_KEY>"),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), "<REDACTED_SLACK_TOKEN>"),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), "<REDACTED_GOOGLE_API_KEY>"),
    (re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}"), "<REDACTED_API_KEY>"),
    (re.compile(r"\b[rs]k_live_[0-9A-Za-z]{16,}"), "<REDACTED_API_KEY>"),
    (re.compile(r"\bnpm_[A-Za-z0-9]{36}\b"), "<REDACTED_NPM_TOKEN>"),
    (re.compile(r"\bpypi-[A-Za-z0-9_-]{40,}"), "<REDACTED_PYPI_TOKEN>"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), "<REDACTED_JWT>"),
    (re.compile(rf"(?i)(?P<head>--?[a-z0-9-]*{_KEY_WORDS}[a-z0-9-]*(?:\s+|=))(?!<REDACTED)[^\s\"'<>-][^\s\"']{{3,}}"), r"\g<head><REDACTED_SECRET>"),
    (re.compile(rf"(?i)(?P<head>\b[A-Za-z0-9_.-]*{_KEY_WORDS}[A-Za-z0-9_.-]*[\"']?\s*[:=]\s*[\"']?)(?!<REDACTED)[^\s\"',;]{{6,}}"), r"\g<head><REDACTED_SECRET>"),
    (re.compile(r"\bgs://marin-[^\s)\"']+"), "gs://<REDACTED_INTERNAL_BUCKET>"),
)  # fmt: skip


def redact_secrets(text: str) -> str:
    for pattern, replacement in REDACTIONS:
        text = pattern.sub(replacement, text)
    return text


# --------------------------------------------------------------------------- identities

_EMAIL = re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")
_URL_USER = re.compile(r"(?<=://)(?P<name>[^\s:/@<>]+)(?=:<REDACTED_PASSWORD>@)")
_HOME = re.compile(r"(?P<prefix>(?<![A-Za-z0-9_.-])(?:/home/|/Users/|\b[A-Za-z]:\\Users\\))(?P<name>[^/\\\s:\"'<>]+)")
# Shared CI and system accounts: not people, and rewriting them would garble every log.
SERVICE_ACCOUNTS = frozenset({
    "runner", "runneradmin", "root", "admin", "administrator", "ubuntu", "vsts", "vssadministrator", "docker",
    "ec2-user", "jenkins", "circleci", "travis", "buildkite", "build", "builder", "github", "actions", "vagrant",
    "nobody", "user", "users", "default", "public", "shared", "git", "linuxbrew", "home", "runners", "work",
    "x-access-token", "oauth2", "token", "anonymous", "__token__",
})  # fmt: skip
MIN_NAME_LENGTH = 4


@dataclasses.dataclass
class _Pseudonyms:
    labels: dict[str, str] = dataclasses.field(default_factory=dict)  # casefolded identity -> <USER_n>
    names: dict[str, str] = dataclasses.field(default_factory=dict)  # name mention -> label

    def label(self, identity: str) -> str:
        key = identity.casefold()
        if key not in self.labels:
            self.labels[key] = f"<USER_{len(self.labels)}>"
        label = self.labels[key]
        for part in {identity, *re.split(r"[._+-]+", identity)}:
            if len(part) >= MIN_NAME_LENGTH and any(c.isalpha() for c in part) and part.casefold() not in SERVICE_ACCOUNTS:
                self.names.setdefault(part.casefold(), label)
        return label


def pseudonymize(text: str) -> str:
    """Replace e-mail addresses, home-directory user names and their mentions by ``<USER_n>``."""
    people = _Pseudonyms()

    def email(match: re.Match[str]) -> str:
        local = match.group(0).split("@", 1)[0]
        if local.casefold() in SERVICE_ACCOUNTS:
            return match.group(0)
        return people.label(local.split("+", 1)[-1]).replace(">", "_EMAIL>")

    def home(match: re.Match[str]) -> str:
        name = match.group("name")
        if name.casefold() in SERVICE_ACCOUNTS or name.startswith("<"):
            return match.group(0)
        return match.group("prefix") + people.label(name)

    text = _EMAIL.sub(email, text)
    text = _URL_USER.sub(lambda m: m.group(0) if m.group("name").casefold() in SERVICE_ACCOUNTS else people.label(m.group("name")), text)
    text = _HOME.sub(home, text)
    if people.names:
        alternatives = "|".join(re.escape(n) for n in sorted(people.names, key=len, reverse=True))
        mention = re.compile(rf"(?<![A-Za-z0-9_.@%+<-])(?:{alternatives})(?![A-Za-z0-9_.@%+>-])", re.IGNORECASE)
        text = mention.sub(lambda m: people.names[m.group(0).casefold()], text)
    return text


def sanitize_log(text: str) -> str:
    """Secrets redacted first (so a token in an address never survives), then people renamed."""
    return pseudonymize(redact_secrets(text))


# --------------------------------------------------------------------------- partitions

PARTITION_KEY = b"diag-log-v1"
PARTITION_BUCKETS = 10_000
# Buckets [0, 100) held out for evaluation, [100, 200) dev, [200, 300) test, the rest train.
PARTITION_BOUNDS = (("holdout", 100), ("dev", 200), ("test", 300))


def partition_of(split_key: str) -> str:
    digest = hashlib.blake2b(split_key.encode("utf-8"), digest_size=8, person=PARTITION_KEY).digest()
    bucket = int.from_bytes(digest, "big") % PARTITION_BUCKETS
    for name, bound in PARTITION_BOUNDS:
        if bucket < bound:
            return name
    return "train"


@register("ghalogs_sanitize")
def ghalogs_sanitize(frame: pl.DataFrame) -> tuple[pl.DataFrame, Mapping[str, int]]:
    counts: dict[str, int] = {}
    out: dict[str, list[str]] = {"text": [], "source_id": [], "archive_path": [], "partition": []}

    def drop(reason: str) -> None:
        counts[reason] = counts.get(reason, 0) + 1

    columns = [pl.col(c) if c in frame.columns else pl.lit(None) for c in ("archive_path", "text", "binary", "utf8_repaired", "too_large")]
    for path, text, binary, repaired, too_large in frame.select(columns).iter_rows():
        if not path:
            drop("missing_archive_path")
            continue
        if too_large:
            drop("too_large_member")
            continue
        if binary:
            drop("binary_member")
            continue
        text = (text or "").strip()
        if not text:
            drop("empty_log")
            continue
        split_key = f"ghalogs:{path}"
        partition = partition_of(split_key)
        if partition != "train":
            drop(f"partition_{partition}")
            continue
        if repaired:
            counts["invalid_utf8_repaired"] = counts.get("invalid_utf8_repaired", 0) + 1
        out["text"].append(sanitize_log(text))
        out["source_id"].append(hashlib.sha256(split_key.encode("utf-8")).hexdigest())
        out["archive_path"].append(path)
        out["partition"].append(partition)
    return pl.DataFrame(out, schema={k: pl.Utf8 for k in out}), counts
