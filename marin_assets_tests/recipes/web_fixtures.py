"""Provider files for the web, API, pre-staged and bucket sources, served by ``loopback`` and
``hub_bucket`` so the real provider code runs against them.

The builders return files in each provider's own format with awkward rows on purpose:
missing fields, empty records, invalid UTF-8, huge whitespace runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

from marin_assets_tests.recipes import FixtureCase, register_fixture
from marin_assets_tests.recipes.hub_bucket import BucketFile, xet_hash
from marin_assets_tests.recipes.loopback import jsonl, tar_gz, zip_bytes, zstd

# --------------------------------------------------------------------------- HPLT v3.0

HPLT_ORIGIN = "https://data.hplt-project.org"
HPLT_DIR = "/hplt/three/sorted/eng_Latn"
WIDE = "wide00016"


def _hplt(doc_id: str, text: str, crawl: str | None = WIDE, registers: dict[str, float] | None = None, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"id": doc_id, "text": text, "u": f"https://example.org/{doc_id}", "ts": "2024-05-01T10:00:00Z",
                           "doc_scores": [9.1, 0.8], "web-register": registers if registers is not None else {"IN": 0.7, "ne": 0.6, "MT": 0.01, "ds": 0.0}}  # fmt: skip
    if crawl is not None:
        row["crawl_id"] = crawl
    return row | extra


SPACES = " " * 300
HPLT_SHARDS: dict[str, list[dict[str, Any] | bytes]] = {
    # tier 10: every row not rejected is kept
    "10_1.jsonl.zst": [
        _hplt("h-keep", "A field report on river otters.\n\nThey returned in 2023."),
        _hplt("h-cc", "Common Crawl page.", crawl="CC-MAIN-2024-10"),
        _hplt("h-pii", "Call me at 555 0100.", crawl="survey3", pii=[[11, 19]]),
        _hplt("h-mt", "Machine translated words.", registers={"MT": 0.25, "IN": 0.6}),
        _hplt("h-sell", "Buy the best shoes now.", registers={"IN": 0.5, "ds": 0.2}),
    ],
    "10_2.jsonl.zst": [
        _hplt("h-legal", "Terms of service apply.", registers={"IN": 0.8, "lt": 0.9, "ne": 0.1}),
        _hplt("h-ip", "Our product is the best.", registers={"IP": 0.9, "ob": 0.1}),
        _hplt("h-ip-news", "A press release with news.", crawl="survey3", registers={"IP": 0.9, "ne": 0.3}),
        _hplt("h-nocrawl", "No crawl id here.", crawl=None),
        _hplt("h-empty", "   \n\t "),
        b"",
    ],
    "10_3.jsonl.zst": [
        _hplt("h-space", "Before" + SPACES + "after."),
        # invalid UTF-8 inside a JSON string: normalize repairs it and counts the row
        b'{"id": "h-latin1", "text": "caf\xe9 au lait", "crawl_id": "wide00016", "web-register": {"IN": 0.7, "ne": 0.6}}',
        _hplt("h-empty-object", "{}"),
        b"{}",
    ],
    # tier 5: kept only for a prose sub-register, or a good top-level register with MT < 0.15
    "5_1.jsonl.zst": [
        _hplt("h5-news", "Local news from the valley.", registers={"NA": 0.6, "ne": 0.7, "MT": 0.0}),
        _hplt("h5-howto", "How to fold a paper boat.", registers={"HI": 0.8, "MT": 0.1}),
        _hplt("h5-howto-mt", "How to fold, translated.", registers={"HI": 0.8, "MT": 0.16}),
        _hplt("h5-fiction", "An informational page on fiction.", registers={"IN": 0.8, "fi": 0.6}),
        {"id": "h5-noreg", "text": "No registers at all.", "crawl_id": WIDE},
    ],
}
HPLT_KEPT = {
    "h-keep": "A field report on river otters.\n\nThey returned in 2023.",
    "h-ip-news": "A press release with news.",
    "h-space": "Before" + " " * 128 + "after.",
    "h-latin1": "caf\ufffd au lait",
    "h-empty-object": "{}",
    "h5-news": "Local news from the valley.",
    "h5-howto": "How to fold a paper boat.",
}
HPLT_DROPPED = {"common_crawl": 1, "pii": 1, "machine_translated": 1, "selling": 1, "legal_terms": 1, "persuasion": 1,
                "missing_crawl_id": 2, "low_register": 3, "invalid_utf8_repaired": 1}  # fmt: skip


def hplt_files() -> dict[str, bytes]:
    return {f"{HPLT_DIR}/{name}": zstd(jsonl(rows)) for name, rows in HPLT_SHARDS.items()}


# --------------------------------------------------------------------------- MASSIVE

MASSIVE_ORIGIN = "https://amazon-massive-nlu-dataset.s3.amazonaws.com"
MASSIVE_PATH = "/massive/amazon-massive-dataset-1.1.tar.gz"


def _utterance(locale: str, massive_id: str, partition: str, intent: str, utt: str, annot: str, scenario: str = "alarm") -> dict[str, Any]:
    return {"id": massive_id, "locale": locale, "partition": partition, "scenario": scenario, "intent": intent, "utt": utt,
            "annot_utt": annot, "worker_id": "8", "slot_method": [{"slot": "time", "method": "translation"}],
            "judgments": [{"worker_id": "8", "intent_score": 1, "slots_score": 1, "grammar_score": 4}]}  # fmt: skip


MASSIVE_ROWS: dict[str, list[dict[str, Any] | bytes]] = {
    "en-US": [
        _utterance("en-US", "1", "train", "alarm_set", "wake me up at five am this week", "wake me up at [time : five am] [date : this week]"),
        _utterance("en-US", "2", "dev", "transport_query", "trains from virginia to california",
                   "trains from [place_name : virginia] to [place_name : california]", "transport"),
        _utterance("en-US", "3", "test", "general_greet", "hello there", "hello there", "general"),
        _utterance("en-US", "4", "train", "alarm_snooze", "snooze it", "snooze it"),
        _utterance("en-US", "5", "train", "alarm_set", "wake me at five", "wake me at [time : five"),
        _utterance("en-US", "6", "train", "alarm_set", "", ""),
        {"id": "7", "locale": "en-US", "partition": "train", "intent": "alarm_query"},
    ],
    "de-DE": [
        _utterance("de-DE", "1", "train", "alarm_set", "weck mich um fünf uhr" + SPACES + "bitte", "weck mich um [time : fünf uhr]" + SPACES + "bitte"),
        b'{"id": "2", "locale": "de-DE", "partition": "test", "scenario": "weather", "intent": "weather_query", "utt": "wetter in m\xfcnchen", "annot_utt": "wetter in [place_name : m\xfcnchen]"}',
    ],
}
MASSIVE_DROPPED = {"unknown_intent": 1, "malformed_annotation": 1, "missing_utterance": 2, "invalid_utf8_repaired": 1}


def massive_tarball() -> bytes:
    members = {f"1.1/data/{locale}.jsonl": jsonl(rows) for locale, rows in MASSIVE_ROWS.items()}
    members["1.1/LICENSE"] = b"Creative Commons Attribution 4.0 International\n"
    return tar_gz(members)


# --------------------------------------------------------------------------- NSF awards

NSF_API_ORIGIN = "https://api.nsf.gov"
NSF_S3_ORIGIN = "https://nsf-awards.s3.us-gov-west-1.amazonaws.com"
PRESIGNED_SECRET = "X-Amz-Credential=AKIAFAKEFIXTURE12345%2Fus&X-Amz-Signature=0f1e2d3c4b5a69788796a5b4c3d2e1f0"


def _award(awd_id: str, title: str | None, abstract: str | None, **extra: Any) -> dict[str, Any]:
    award: dict[str, Any] = {"awd_id": awd_id, "awd_eff_date": "2019-09-01", "awd_exp_date": "2022-08-31", "awd_amount": 249_871.0,
                             "dir_abbr": "CSE", "org_dir_long_name": "Directorate for Computer and Information Science and Engineering",
                             "div_abbr": "CCF", "org_div_long_name": "Division of Computing and Communication Foundations",
                             "pi": [{"pi_first_name": "Ada", "pi_last_name": "Lovelace"}]}  # fmt: skip
    if title is not None:
        award["awd_titl_txt"] = title
    if abstract is not None:
        award["awd_abstract_narration"] = abstract
    return award | extra


NSF_YEARS: dict[int, dict[str, bytes | None]] = {
    2019: {
        "2019/": None,
        "2019/1900001.json": json.dumps(_award("1900001", "CAREER: Fast Sorting", "This project studies sorting networks.")).encode(),
        "2019/1900002.json": json.dumps(_award("1900002", "Workshop Travel Support", None)).encode(),
        "2019/1900003.json": json.dumps(_award("1900003", "Collaborative Research: Rivers", "   ")).encode(),
        "2019/1900004.json": b'{"awd_id": "1900004", "awd_titl_txt": "Truncated',
        "2019/1900005.json": b'{"awd_id": "1900005", "awd_titl_txt": "Caf\xe9 Chemistry", "awd_abstract_narration": "Studies of caf\xe9ine."}',
        "2019/1900006.json": json.dumps(_award("1900006", None, "An award whose title is missing.")).encode(),
        "2019/README.txt": b"not an award",
    },
    2020: {
        "2020/2000001.json": json.dumps(_award("2000001", "Ocean Sensing", "Buoys measure" + SPACES + "waves.", awd_amount=None)).encode(),
    },
}
NSF_KEPT = {
    "1900001": "CAREER: Fast Sorting\n\nThis project studies sorting networks.",
    "1900005": "Caf\ufffd Chemistry\n\nStudies of caf\ufffdine.",
    "1900006": "An award whose title is missing.",
    "2000001": "Ocean Sensing\n\nBuoys measure" + " " * 128 + "waves.",
}
NSF_DROPPED = {"missing_abstract": 2, "unparseable_award": 1, "invalid_utf8_repaired": 1}


def nsf_listing(years: Sequence[int]) -> bytes:
    files = [{"fileName": f"{y}.zip", "downloadUrl": f"{NSF_S3_ORIGIN}/awards/{y}.zip?{PRESIGNED_SECRET}", "size": 0} for y in years]
    files.append({"fileName": "README.txt", "downloadUrl": f"{NSF_S3_ORIGIN}/awards/README.txt?{PRESIGNED_SECRET}"})
    return json.dumps({"files": files}).encode()


# --------------------------------------------------------------------------- docx corpus

DOCX_API_ORIGIN = "https://api.docxcorp.us"
DOCX_ORIGIN = "https://docxcorp.us"


def docx_id(n: int) -> str:
    return hashlib.sha256(f"docx-{n}".encode()).hexdigest()


DOCX_TEXTS: dict[str, bytes | None] = {
    docx_id(1): "Quarterly report\n\nRevenue grew by 4%.".encode(),
    docx_id(2): None,  # listed, but the site answers 404
    docx_id(3): b"  \n\t ",
    docx_id(4): b"R\xe9sum\xe9 of J. Doe",
    docx_id(5): ("Meeting notes" + SPACES + "end.").encode(),
}
DOCX_KEPT = {
    docx_id(1): "Quarterly report\n\nRevenue grew by 4%.",
    docx_id(4): "R\ufffdsum\ufffd of J. Doe",
    docx_id(5): "Meeting notes" + " " * 128 + "end.",
}
DOCX_DROPPED = {"document_not_found": 1, "document_empty": 1, "invalid_utf8_repaired": 1}


def docx_manifest() -> bytes:
    lines = [f"{DOCX_ORIGIN}/documents/{doc}.docx" for doc in DOCX_TEXTS]
    lines += [f"{DOCX_ORIGIN}/documents/{docx_id(1)}.docx", "not a document url", ""]
    return ("\n".join(lines) + "\n").encode()


# --------------------------------------------------------------------------- GitHub Actions logs


def spec_partition(path: str) -> str:
    """The split of a log: keyed BLAKE2b of ``ghalogs:<path>`` into 10,000 buckets (1/1/1/97)."""
    digest = hashlib.blake2b(f"ghalogs:{path}".encode(), digest_size=8, person=b"diag-log-v1").digest()
    bucket = int.from_bytes(digest, "big") % 10_000
    return "holdout" if bucket < 100 else "dev" if bucket < 200 else "test" if bucket < 300 else "train"


def log_name(partition: str, start: int = 0) -> str:
    """The first ``github_run_logs/acme/app/<n>/job.txt`` (n >= start) in ``partition``."""
    n = start
    while spec_partition(f"github_run_logs/acme/app/{n}/job.txt") != partition:
        n += 1
    return f"github_run_logs/acme/app/{n}/job.txt"


# Credentials in the shapes CI logs leak them; none may survive sanitization.
SECRETS = {
    "aws_access_key": "AKIAIOSFODNN7EXAMPLE",
    "aws_session_key": "ASIAY34FZKBOKMUTVV7A",
    "aws_secret_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "github_pat_classic": "ghp_R2D2C3POr2d2c3poR2D2C3POr2d2c3po1234",
    "github_app_token": "ghs_16C7e42F292c6912E7710c838347Ae178B4a",
    "github_fine_grained": "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
    "hf_token": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "bearer": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "bearer_opaque": "ya29.a0AfH6SMBx7Qz-opaque-token",
    "url_password": "hunter2-s3cr3t",
    "private_key_body": "MIIEowIBAAKCAQEA75UPJpH1kxdNLRy0Lr1bW6A9",
    "password_value": "Tr0ub4dor&3",
    "cli_password": "correcthorsebattery",
    "slack": "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "google_api_key": "AIzaSyA1234567890abcdefghijklmnopqrstuv",
}
SECRET_LOG = f"""Run aws configure
export AWS_ACCESS_KEY_ID={SECRETS['aws_access_key']}
export AWS_SESSION_ACCESS={SECRETS['aws_session_key']}
aws_secret_access_key = {SECRETS['aws_secret_key']}
git remote set-url origin https://{SECRETS['github_pat_classic']}@github.com/acme/app.git
GITHUB_TOKEN: {SECRETS['github_app_token']}
using {SECRETS['github_fine_grained']} for the release
huggingface-cli login --token {SECRETS['hf_token']}
curl -H "Authorization: Bearer {SECRETS['bearer']}" https://api.example.com/v1
curl -H 'authorization: bearer {SECRETS['bearer_opaque']}' https://api.example.com/v2
pip install --index-url https://deploy:{SECRETS['url_password']}@pypi.corp.example/simple app
-----BEGIN OPENSSH PRIVATE KEY-----
{SECRETS['private_key_body']}
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW
-----END OPENSSH PRIVATE KEY-----
DB_PASSWORD="{SECRETS['password_value']}"
mysql --password {SECRETS['cli_password']} -h db
SLACK_WEBHOOK_TOKEN {SECRETS['slack']}
maps key {SECRETS['google_api_key']}
Author: Jane Doe <jane.doe@example.com>
/home/jdoe42/work/app/build.sh: line 3: permission denied
jdoe42 retried the job; ping jane
"""
PEOPLE = ("jane.doe@example.com", "jdoe42", "Jane", "jane")
CLEAN_LOG = "Run make test\nok: 12 passed\nDone in /home/runner/work/app/app"
EMAIL_LOG = "Commit by Alice Smith <alice.smith@corp.example>\nalice.smith approved the change"
EMAIL_LOG_SANITIZED = "Commit by <USER_0> <USER_0> <<USER_0_EMAIL>>\n<USER_0> approved the change"


def ghalogs_members() -> dict[str, bytes | None]:
    train = [log_name("train", i * 10) for i in range(5)]
    names = dict.fromkeys(train)
    assert len(names) == 5, "train log names must differ"
    return {
        "github_run_logs/": None,
        train[0]: SECRET_LOG.encode(),
        train[1]: ("  \n" + CLEAN_LOG + "\n\n").encode(),
        train[2]: EMAIL_LOG.encode(),
        train[3]: b"Compiling caf\xe9.c\nwarning: unused variable",
        train[4]: b"PK\x03\x04\x14\x00\x00\x00binary artifact",
        log_name("train", 1000): b"   \n  ",
        log_name("dev"): b"dev log line",
        log_name("test"): b"test log line",
        log_name("holdout"): b"held out log line",
    }


GHALOGS_DROPPED = {"binary_member": 1, "empty_log": 1, "partition_dev": 1, "partition_test": 1, "partition_holdout": 1,
                   "invalid_utf8_repaired": 1}  # fmt: skip


BIO_ROWS = {
    "data/part-000.jsonl.zst": [
        {"id": "P69905", "text": "MVLSPADKTNVKAAWGKVGAHAGEYGAEALERMFLSFPTTKTYFPHF\n\nFunction: involved in oxygen transport."},
        {"id": "empty", "text": ""},
        {"id": "spaces", "text": "ATGGCC" + SPACES + "TAA"},
    ],
    "data/part-001.jsonl.zst": [
        {"id": "Q9Y2X3", "text": "ATGCGTACGTTAGC -> AUGCGUACGUUAGC -> MRT*"},
        {"text": "A record without an id."},
    ],
}
BIO_KEPT = {
    "P69905": "MVLSPADKTNVKAAWGKVGAHAGEYGAEALERMFLSFPTTKTYFPHF\n\nFunction: involved in oxygen transport.",
    "spaces": "ATGGCC" + " " * 128 + "TAA",
    "Q9Y2X3": "ATGCGTACGTTAGC -> AUGCGUACGUUAGC -> MRT*",
    None: "A record without an id.",
}


def bio_files() -> list[BucketFile]:
    files = [BucketFile(path, zstd(jsonl(rows))) for path, rows in BIO_ROWS.items()]
    files.append(BucketFile("data/notes.txt", b"not selected by the glob"))
    files.append(BucketFile("README.md", b"# biocorpus"))
    return files


# --------------------------------------------------------------------------- registered cases
#
# The cases below are registered in the recipe fixture registry (``covered_sources``). Their
# files are not Hub repos: ``PLACEMENTS`` says where the harness in ``test_web_sources`` puts
# them (served on the loopback server, staged under MARIN_PREFIX, or held by the bucket API)
# and which catalog edits scale the entry down to the fixture.


@dataclasses.dataclass(frozen=True)
class Placement:
    where: str  # "served": server paths | "staged": paths under MARIN_PREFIX | "bucket": bucket paths
    edit: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # catalog edit for the fixture


HPLT_EDIT = {"provider": {"allow": ["5_*.jsonl.zst", "10_*.jsonl.zst"], "exclude": ["5_[2-9]*.jsonl.zst", "5_1?*.jsonl.zst"], "expected_shards": 4}}
GHALOGS_ARCHIVE = "raw/diagnostic_logs/ghalogs/zenodo-14796970/zenodo.org/records/14796970/files/github_run_logs.zip"


def _column_values(frame: Any, column: str) -> dict[Any, Any]:
    return dict(zip(frame["source_id"].to_list(), frame[column].to_list(), strict=True))


def check_hplt(frame: Any) -> None:
    tiers = _column_values(frame, "hplt_wds_tier")
    assert tiers["h5-news"] == 5 and tiers["h-keep"] == 10
    assert _column_values(frame, "hplt_crawl_id")["h-keep"] == WIDE


@register_fixture("hplt_v3")
def hplt_case(source: Any) -> FixtureCase:
    return FixtureCase(files=hplt_files(), rows=len(HPLT_KEPT), texts=HPLT_KEPT, bad_rows=HPLT_DROPPED,
                       counters={"empty_dropped": 1, "whitespace_compacted": 1},
                       columns=("hplt_wds_tier", "hplt_crawl_id", "hplt_url", "hplt_web_register"), check=check_hplt)  # fmt: skip


def check_massive(frame: Any) -> None:
    from marin_assets.core.ingest.transforms.web_sources import tool_selection

    rows = {r["source_id"]: r for r in frame.iter_rows(named=True)}
    assert set(rows) == {"en-US/1/train", "en-US/2/validation", "en-US/3/test", "de-DE/1/train", "de-DE/2/test"}
    tools_line, request, call = rows["en-US/2/validation"]["text"].split("\n")
    assert request == "Request: trains from virginia to california"
    assert json.loads(call.removeprefix("tool_call: ")) == {
        "type": "function_call", "call_id": "call_en-US_2", "name": "transport_query",
        "arguments": json.dumps({"place_name": ["virginia", "california"]}),
    }  # fmt: skip
    tools = json.loads(tools_line.removeprefix("Tools: "))
    names = [t["name"] for t in tools]
    assert 21 <= len(tools) <= 61 and len(set(names)) == len(names) and "transport_query" in names
    gold = tools[names.index("transport_query")]
    assert gold["type"] == "function" and gold["parameters"]["properties"]["place_name"]["type"] == "array"
    assert names == tool_selection("transport_query", "en-US/2/validation")  # seeded: the same list every run
    greet = rows["en-US/3/test"]["text"].split("\n")
    assert greet[1] == "Request: hello there" and json.loads(json.loads(greet[2].removeprefix("tool_call: "))["arguments"]) == {}
    assert rows["de-DE/1/train"]["text"].split("\n")[1] == "Request: weck mich um fünf uhr" + " " * 128 + "bitte"
    german_call = json.loads(rows["de-DE/2/test"]["text"].split("\n")[2].removeprefix("tool_call: "))
    assert german_call["arguments"] == json.dumps({"place_name": ["m\ufffdnchen"]}, ensure_ascii=False)
    assert {r["split"] for r in rows.values()} == {"train", "validation", "test"}


@register_fixture("massive_function_calling")
def massive_case(source: Any) -> FixtureCase:
    return FixtureCase(files={MASSIVE_PATH: massive_tarball()}, rows=5, bad_rows=MASSIVE_DROPPED,
                       counters={"whitespace_compacted": 1}, columns=("locale", "split", "intent"), check=check_massive)  # fmt: skip


def check_nsf(frame: Any) -> None:
    amounts = _column_values(frame, "awd_amount")
    assert amounts["1900001"] == 249_871.0 and amounts["2000001"] is None
    assert _column_values(frame, "div_abbr")["1900001"] == "CCF"


@register_fixture("nsf_awards")
def nsf_case(source: Any) -> FixtureCase:
    files = {"/nsf-api/services/v2/s3/list-files": nsf_listing((2019, 2020))}
    files |= {f"/nsf-s3/awards/{year}.zip": zip_bytes(members) for year, members in NSF_YEARS.items()}
    return FixtureCase(files=files, rows=len(NSF_KEPT), texts=NSF_KEPT, bad_rows=NSF_DROPPED,
                       counters={"whitespace_compacted": 1}, columns=("awd_amount", "awd_titl_txt", "year"), check=check_nsf)  # fmt: skip


def check_docx(frame: Any) -> None:
    doc = docx_id(1)
    assert _column_values(frame, "url")[doc] == f"{DOCX_ORIGIN}/extracted/{doc}.txt"
    assert set(frame["language"].to_list()) == {"en"} and set(frame["source"].to_list()) == {"superdoc-dev/docx-corpus"}


@register_fixture("docx-corpus/en")
def docx_case(source: Any) -> FixtureCase:
    files = {"/docx-api/manifest": docx_manifest()}
    files |= {f"/docx/extracted/{doc}.txt": text for doc, text in DOCX_TEXTS.items() if text is not None}
    return FixtureCase(files=files, rows=len(DOCX_KEPT), texts=DOCX_KEPT, bad_rows=DOCX_DROPPED,
                       columns=("url", "raw_url", "source", "language"), check=check_docx)  # fmt: skip


def ghalogs_train_names() -> list[str]:
    return [name for name, data in ghalogs_members().items() if data and spec_partition(name) == "train"]


def check_ghalogs(frame: Any) -> None:
    everything = "\n".join(frame["text"].to_list())
    for kind, secret in SECRETS.items():
        assert secret not in everything, kind
    secret_log = frame.filter(frame["archive_path"] == ghalogs_train_names()[0])["text"].item()
    for person in PEOPLE:
        assert person not in secret_log, person
    for marker in ("<REDACTED_AWS_ACCESS_KEY>", "<REDACTED_AWS_SECRET_KEY>", "<REDACTED_GITHUB_TOKEN>", "<REDACTED_HF_TOKEN>",
                   "<REDACTED_TOKEN>", "<REDACTED_PASSWORD>", "<REDACTED_PRIVATE_KEY>", "<REDACTED_SECRET>"):  # fmt: skip
        assert marker in secret_log, marker
    assert set(frame["partition"].to_list()) == {"train"}


@register_fixture("ghalogs/public")
def ghalogs_case(source: Any) -> FixtureCase:
    train = ghalogs_train_names()

    def sid(name: str) -> str:
        return hashlib.sha256(f"ghalogs:{name}".encode()).hexdigest()

    known = {sid(train[1]): CLEAN_LOG, sid(train[2]): EMAIL_LOG_SANITIZED, sid(train[3]): "Compiling caf\ufffd.c\nwarning: unused variable"}
    return FixtureCase(files={GHALOGS_ARCHIVE: zip_bytes(ghalogs_members())}, rows=4, texts=known, bad_rows=GHALOGS_DROPPED,
                       columns=("archive_path", "partition"), check=check_ghalogs)  # fmt: skip


def code_shard(rows: list[dict[str, Any]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("sha1_git", pa.binary()), ("sha1", pa.binary()), ("content", pa.binary()), ("present", pa.bool_())])
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), buf, compression="zstd")
    return buf.getvalue()


CODE_SHARDS = {
    "part-00000.parquet": [
        {"sha1_git": bytes.fromhex("aa" * 20), "sha1": b"x", "content": b"def main():\n    return 0\n", "present": True},
        {"sha1_git": bytes.fromhex("bb" * 20), "sha1": b"y", "content": None, "present": False},
    ],
    "part-00001.parquet": [{"sha1_git": bytes.fromhex("cc" * 20), "sha1": b"z", "content": b"s = 'caf\xe9'\n", "present": True}],
    "part-00002.parquet": [{"sha1_git": bytes.fromhex("dd" * 20), "sha1": b"w", "content": b"x = 1" + b" " * 300 + b"# end", "present": True}],
}


@register_fixture("nemotron_code_v1/content", "nemotron_code_v2/content")
def code_content_case(source: Any) -> FixtureCase:
    return FixtureCase(
        files={f"{source.provider.staged_path}/{name}": code_shard(rows) for name, rows in CODE_SHARDS.items()},
        rows=3,
        texts={"aa" * 20: "def main():\n    return 0\n", "cc" * 20: "s = 'caf\ufffd'\n", "dd" * 20: "x = 1" + " " * 128 + "# end"},
        bad_rows={"content_missing": 1, "invalid_utf8_repaired": 1},
        counters={"whitespace_compacted": 1},
        absent_columns=("content", "sha1_git", "present"),
    )


FOCUS_SHARDS = {
    "outputs/main/shard-0000.parquet": [
        {"source_id": "urn:uuid:5b0e6f5c-0001", "text": "Main text of a focused page.", "url": "https://example.org/a"},
        {"source_id": "urn:uuid:5b0e6f5c-0002", "text": "", "url": "https://example.org/empty"},
    ],
    "outputs/main/shard-0001.parquet": [
        {"source_id": "urn:uuid:5b0e6f5c-0003", "text": "Main text of a focused page.", "url": "https://example.org/a-again"},
        {"source_id": "urn:uuid:5b0e6f5c-0004", "text": "Another page" + SPACES + "ends.", "url": None},
    ],
}


@register_fixture("common-crawl-focus-2026-22")
def focus_case(source: Any) -> FixtureCase:
    import polars as pl

    def shard(rows: list[dict[str, Any]]) -> bytes:
        buf = io.BytesIO()
        pl.DataFrame(rows, schema={"source_id": pl.Utf8, "text": pl.Utf8, "url": pl.Utf8}).write_parquet(buf)
        return buf.getvalue()

    files = {f"{source.provider.staged_path}/{name}": shard(rows) for name, rows in FOCUS_SHARDS.items()}
    files[f"{source.provider.staged_path}/outputs/logs/run.txt"] = b"extraction log, not a shard"
    return FixtureCase(files=files, rows=2,
                       texts={"urn:uuid:5b0e6f5c-0001": "Main text of a focused page.",
                              "urn:uuid:5b0e6f5c-0004": "Another page" + " " * 128 + "ends."},
                       counters={"empty_dropped": 1, "duplicates": 1, "whitespace_compacted": 1}, columns=("url",))  # fmt: skip


@register_fixture("biocorpus")
def biocorpus_case(source: Any) -> FixtureCase:
    return FixtureCase(files={f.path: f.data for f in bio_files()}, rows=len(BIO_KEPT), texts=BIO_KEPT,
                       counters={"empty_dropped": 1, "whitespace_compacted": 1})  # fmt: skip


def bucket_fingerprint(files: Mapping[str, bytes], selected: Sequence[str]) -> str:
    """The snapshot pin of ``selected``: sha256 of ``path\\tsize\\txet hash`` lines by path."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        lines = "".join(f"{p}\t{len(files[p])}\t{xet_hash(files[p], scratch)}\n" for p in sorted(selected))
    return hashlib.sha256(lines.encode()).hexdigest()


def placements() -> dict[str, Placement]:
    """How each registered web/API/staged/bucket case is presented to the assets."""
    bio = {f.path: f.data for f in bio_files()}
    return {
        "hplt_v3": Placement("served", HPLT_EDIT),
        "massive_function_calling": Placement("served", {"provider": {"expected_shards": 2}}),
        "nsf_awards": Placement("served", {"provider": {"revision": "2019-2021"}}),
        "docx-corpus/en": Placement("served", {"provider": {"sha256": hashlib.sha256(docx_manifest()).hexdigest()}}),
        "ghalogs/public": Placement("staged"),
        "nemotron_code_v1/content": Placement("staged", {"provider": {"expected_shards": 3}}),
        "nemotron_code_v2/content": Placement("staged", {"provider": {"expected_shards": 3}}),
        "common-crawl-focus-2026-22": Placement("staged", {"provider": {"expected_shards": 2}}),
        "biocorpus": Placement("bucket", {"provider": {"sha256": bucket_fingerprint(bio, list(BIO_ROWS))}}),
    }
