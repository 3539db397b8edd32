"""The eval registry: packaged entries, validation messages, pins and their lock."""

from __future__ import annotations

import json

import pytest

from marin_assets.catalog.evals import (
    EvalLock,
    EvalRegistryError,
    HuggingFaceProvider,
    LocalFileProvider,
    WebArchiveProvider,
    default_evals_path,
    load_evals,
    load_lock,
    lock_path_for,
    resolve_pins,
    write_lock,
)

AA_INDEX = {
    "gdpval_aa_v2": 220, "tau3_banking": 97, "terminal_bench_v2_1": 89, "scicode": 291, "aa_lcr": 100,
    "aa_omniscience": 600, "hle": 2500, "gpqa_diamond": 198, "critpt": 70,
}
COMMON_REPOS = {
    "cais/mmlu", "TIGER-Lab/MMLU-Pro", "openai/gsm8k", "Rowan/hellaswag", "allenai/ai2_arc",
    "openai/openai_humaneval", "google-research-datasets/mbpp", "truthfulqa/truthful_qa", "allenai/winogrande",
    "ybisk/piqa", "google/boolq",
}
SHA_A, SHA_B = "a" * 40, "b" * 40


def write(tmp_path, body: str, name: str = "evals.toml"):
    path = tmp_path / name
    path.write_text("version = 1\n" + body)
    return path


HF_ENTRY = """
[[eval]]
name = "{name}"
mandatory = {mandatory}
rows = 10
fields = ["question"]
provider = {{ kind = "huggingface", repo = "{repo}", split = "test", revision = "{revision}" }}
"""


def hf(name="one", repo="org/one", revision="main", mandatory="true"):
    return HF_ENTRY.format(name=name, repo=repo, revision=revision, mandatory=mandatory)


# ----------------------------------------------------------------------------- the packaged registry


def test_packaged_registry_holds_the_mandatory_index_and_common_sets():
    registry = load_evals()
    assert registry.expected_rows() == AA_INDEX
    assert sum(registry.expected_rows().values()) == 4165
    assert all(s.group == "aa-index-v4.1.1" for s in registry.mandatory)
    common = [s for s in registry.sets if s.group == "common"]
    assert {s.provider.repo for s in common if isinstance(s.provider, HuggingFaceProvider)} == COMMON_REPOS
    assert not any(s.mandatory for s in common)


def test_packaged_registry_includes_the_lm_eval_leaf_tasks_with_marins_rules():
    registry = load_evals()
    lmh = [s for s in registry.sets if s.group == "lm-eval"]
    names = {s.name for s in lmh}
    assert len(lmh) > 500 and not any(s.mandatory for s in lmh)
    assert {"lmh_commonsense_qa", "lmh_openbookqa", "lmh_social_iqa", "lmh_triviaqa", "lmh_drop"} <= names
    assert any(n.startswith("lmh_bbh_") for n in names) and any(n.startswith("lmh_agieval_") for n in names)
    assert not any(n.startswith(("lmh_code2text", "lmh_jsonschema_bench", "lmh_lambada", "lmh_wikitext",
                                 "lmh_swde", "lmh_realtoxicityprompts")) for n in names)
    assert all(s.fields == ("*",) and "passage" in s.passage_fields for s in lmh)
    assert registry.get("lmh_commonsense_qa").provider.split == "validation"  # the task names no test split
    assert registry.lock_path.endswith("evals.lock.json")
    load_lock(registry.lock_path)  # the committed lock is valid


def test_packaged_registry_excludes_passages_and_image_bytes():
    registry = load_evals()
    assert "passage" not in registry.get("boolq").fields and "passage" in registry.get("boolq").passage_fields
    assert not {"ctx", "ctx_a", "ctx_b"} & set(registry.get("hellaswag").fields)
    assert "image" not in registry.get("hle").fields
    gpqa = registry.get("gpqa_diamond")
    assert len(gpqa.fields) == 5 and gpqa.provider.config == "gpqa_diamond"


def test_another_registry_file_and_local_paths_are_relative_to_it(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    path = write(tmp_path / "sub", """
[[eval]]
name = "demo_qa"
group = "local"
mandatory = true
rows = 8
fields = ["question", "answer"]
provider = { kind = "local", path = "../data/demo.jsonl" }
""")
    monkeypatch.setenv("MARIN_EVALS", str(path))  # read by the Dagster resource, never by the catalog layer
    assert default_evals_path() != path
    registry = load_evals(path)
    provider = registry.get("demo_qa").provider
    assert isinstance(provider, LocalFileProvider) and provider.format == "jsonl"
    assert provider.path == str((tmp_path / "data" / "demo.jsonl").resolve())
    assert registry.lock_path == str(tmp_path / "sub" / "evals.lock.json")


def test_missing_registry_file_names_the_env_var(tmp_path, monkeypatch):
    from marin_assets.defs.resources import MarinResource  # the setting lives in the Dagster resource

    monkeypatch.setenv("MARIN_EVALS", str(tmp_path / "nope.toml"))
    with pytest.raises(EvalRegistryError, match=r"nope\.toml.*MARIN_EVALS"):
        MarinResource().evals()
    with pytest.raises(EvalRegistryError, match=r"nope\.toml' does not exist$"):
        MarinResource(evals_path=str(tmp_path / "nope.toml")).evals()


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("body", "entry", "field"),
    [
        (hf().replace("rows = 10\n", ""), "one", "rows"),
        (hf().replace('kind = "huggingface"', 'kind = "ftp"'), "one", "provider.kind"),
        (hf(repo="not a repo"), "one", "provider.repo"),
        (hf().replace('split = "test", ', ""), "one", "provider.split"),
        (hf().replace('fields = ["question"]', "fields = []"), "one", "fields"),
        (hf().replace("rows = 10", "rows = 10\nsplits = 3"), "one", "splits"),
        (hf(name="Bad-Name"), "Bad-Name", "name"),
        (hf() + hf(repo="org/two"), "one", "name"),
        (hf().replace('fields = ["question"]', 'fields = ["question"]\npassage_fields = ["question"]'), "one",
         "fields"),
        ('\n[[eval]]\nname = "w"\nmandatory = false\nfields = ["q"]\n'
         'provider = { kind = "web", url = "https://x.org/a.zip" }\n', "w", "provider.member"),
        ('\n[[eval]]\nname = "w"\nmandatory = false\nfields = ["q"]\n'
         'provider = { kind = "web", url = "https://x.org/a.json", sha256 = "xyz" }\n', "w", "provider.sha256"),
    ],
)
def test_errors_name_entry_and_field(tmp_path, body, entry, field):
    path = write(tmp_path, body)
    with pytest.raises(EvalRegistryError) as err:
        load_evals(path)
    assert err.value.field == field and err.value.entry == entry
    assert repr(field) in str(err.value) and str(path) in str(err.value)


def test_web_and_local_providers_parse(tmp_path):
    registry = load_evals(write(tmp_path, """
[[eval]]
name = "tau"
mandatory = true
rows = 97
fields = ["user_scenario"]
provider = { kind = "web", url = "https://example.org/tasks.json", sha256 = "" }
[[eval]]
name = "tb"
mandatory = true
rows = 89
fields = ["instruction.md"]
provider = { kind = "web", url = "https://example.org/v2.1.zip", row_dirs = "*/*" }
"""))
    tau, tb = registry.get("tau").provider, registry.get("tb").provider
    assert isinstance(tau, WebArchiveProvider) and tau.format == "json"
    assert isinstance(tb, WebArchiveProvider) and tb.format == "zip" and tb.row_dirs == "*/*"


# ----------------------------------------------------------------------------- pins and the lock


class Resolver:
    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def __call__(self, repo, branch):
        self.calls.append((repo, branch))
        return self.answers[(repo, branch)]


def test_branches_resolve_once_into_the_lock_and_builds_read_the_lock(tmp_path):
    path = write(tmp_path, hf() + hf(name="two", repo="org/one") + hf(name="three", repo="org/three",
                                                                       revision="c" * 40))
    registry = load_evals(path)
    with pytest.raises(EvalRegistryError) as err:
        registry.revision("one")
    assert err.value.entry == "one" and err.value.field == "provider.revision" and "marin-assets evals lock" in str(err.value)
    assert registry.revision("three") == "c" * 40  # a commit pin needs no lock

    resolver = Resolver({("org/one", "main"): SHA_A})
    lock = resolve_pins(registry, resolver)
    assert resolver.calls == [("org/one", "main")]  # two sets share one repo@branch
    write_lock(lock, lock_path_for(path))
    assert json.loads((tmp_path / "evals.lock.json").read_text())["revisions"] == {"org/one@main": SHA_A}

    reloaded = load_evals(path)
    assert reloaded.revision("one") == reloaded.revision("two") == SHA_A
    # later builds reuse the lock: the branch moved upstream, the pin does not
    moved = Resolver({("org/one", "main"): SHA_B})
    assert resolve_pins(reloaded, moved).revisions == {"org/one@main": SHA_A} and moved.calls == []
    assert resolve_pins(reloaded, moved, refresh=True).revisions == {"org/one@main": SHA_B}


def test_stale_lock_entries_are_dropped_and_bad_answers_refused(tmp_path):
    path = write(tmp_path, hf())
    write_lock(EvalLock(revisions={"org/one@main": SHA_A, "org/gone@main": SHA_B}), lock_path_for(path))
    registry = load_evals(path)
    assert resolve_pins(registry, Resolver({})).revisions == {"org/one@main": SHA_A}
    with pytest.raises(EvalRegistryError, match=r"'one'.*not a 40-hex commit"):
        resolve_pins(registry, lambda repo, branch: "main", refresh=True)


def test_archive_hashes_come_from_registry_or_lock(tmp_path):
    path = write(tmp_path, """
[[eval]]
name = "tau"
mandatory = true
rows = 97
fields = ["user_scenario"]
provider = { kind = "web", url = "https://example.org/tasks.json" }
""")
    registry = load_evals(path)
    with pytest.raises(EvalRegistryError, match=r"'tau'.*'provider.sha256'"):
        registry.archive_sha256("tau")
    lock = resolve_pins(registry, Resolver({}), archive_hasher=lambda url: "d" * 64)
    write_lock(lock, lock_path_for(path))
    assert load_evals(path).archive_sha256("tau") == "d" * 64


def test_corrupt_lock_is_reported(tmp_path):
    path = write(tmp_path, hf())
    lock_path_for(path).write_text(json.dumps({"version": 1, "revisions": {"org/one@main": "main"}}))
    with pytest.raises(EvalRegistryError, match=r"revisions\.org/one@main"):
        load_evals(path)
