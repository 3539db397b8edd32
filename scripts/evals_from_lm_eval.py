"""Write ``marin_assets/catalog/evals_lm_eval.toml``: the best-effort eval sets, enumerated from the
lm-eval-harness task registry (the task YAML files of the installed ``lm_eval`` package).

Run: ``.venv/bin/python scripts/evals_from_lm_eval.py`` (offline; reads YAML only, imports no task).

What it does, following Marin's best-effort eval corpus:

* starts from the task bundles Marin evaluates (``BUNDLES``, the task names of Marin's
  ``experiments/evals/task_configs.py``), expands groups and tags to their leaf tasks;
* leaves out Marin's excluded tasks (``EXCLUDED``: code2text, jsonschema_bench, swde,
  realtoxicityprompts, wikitext, lambada and their cloze variants);
* picks the split by Marin's preference: test, then validation, then train;
* indexes every raw string field of a row (``fields = ["*"]``) except the passage fields
  Marin drops (``passage``, ``context``, ``ctx``, ...): passage-based tasks contribute their
  question and answers only. The ``doc_to_text`` / ``doc_to_target`` templates only add glue
  text around those fields, so they are not rendered;
* reads the dataset of tasks written as a Python class from its source (``DATASET_PATH``);
* skips leaves whose dataset the hand-written part of the registry already covers, and leaves
  whose data is not a Hub dataset repo (local JSON files, loading scripts): the file's header
  lists them with the reason.

Every entry pins ``revision = "main"``: ``marin-assets evals lock`` resolves it to a commit where
the Hub is reachable; until then the build reports the set as unavailable (non-blocking).
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "marin_assets" / "catalog" / "evals_lm_eval.toml"
REGISTRY = ROOT / "marin_assets" / "catalog" / "evals.toml"

BUNDLES = """
agieval_lsat_ar arc_easy arc_challenge boolq commonsense_qa copa hellaswag lambada_openai openbookqa piqa wsc273
winogrande mmlu leaderboard_mmlu_pro leaderboard_bbh leaderboard_gpqa leaderboard_musr leaderboard_ifeval
leaderboard_math_hard pubmedqa medmcqa headqa_en bbh_cot_fewshot gsm8k_cot nq_open triviaqa ifeval drop humaneval
minerva_math truthfulqa_mc2 anli_r1 anli_r2 anli_r3 babi bbh_zeroshot bbh_fewshot bbh_cot_zeroshot
copal_id_standard copal_id_colloquial logiqa logiqa2 logieval mastermind_24_easy mastermind_24_hard mastermind_35_easy
mastermind_35_hard mastermind_46_easy mastermind_46_hard social_iqa gsm8k arithmetic_1dc arithmetic_2da arithmetic_2dm
arithmetic_2ds arithmetic_3da arithmetic_3ds arithmetic_4da arithmetic_4ds arithmetic_5da arithmetic_5ds asdiv
hendrycks_math_algebra hendrycks_math_counting_and_prob hendrycks_math_geometry hendrycks_math_intermediate_algebra
hendrycks_math_num_theory hendrycks_math_prealgebra hendrycks_math_precalc mathqa coqa cola mnli mrpc qnli qqp rte sst2
wnli lambada_standard lambada_openai_cloze_yaml lambada_standard_cloze_yaml mutual mutual_plus race squad_completion
squadv2 swag wikitext code2text_go code2text_java code2text_javascript code2text_php code2text_python code2text_ruby
jsonschema_bench_easy jsonschema_bench_medium jsonschema_bench_hard careqa_en careqa_es med_concepts_qa medqa_4options
kormedmcqa_dentist kormedmcqa_doctor kormedmcqa_nurse kormedmcqa_pharm agieval cmmlu kmmlu mmlu_pro eq_bench ethics_cm
ethics_deontology ethics_justice ethics_utilitarianism ethics_virtue moral_stories histoires_morales bbq cabbq
crows_pairs_english_age crows_pairs_english_autre crows_pairs_english_disability crows_pairs_english_gender
crows_pairs_english_nationality crows_pairs_english_physical_appearance crows_pairs_english_race_color
crows_pairs_english_religion crows_pairs_english_sexual_orientation crows_pairs_english_socioeconomic
realtoxicityprompts simple_cooccurrence_bias toxigen winogender_all acp_areach_bool acp_app_bool acp_just_bool
acp_land_bool acp_prog_bool acp_reach_bool acp_val_bool acp_areach_mcq acp_app_mcq acp_just_mcq acp_land_mcq
acp_prog_mcq acp_reach_mcq acp_val_mcq mc_taco groundcocoa truthfulqa_mc1 truthfulqa_gen fda fld_default fld_star
haerae prost qa4mre_2011 qa4mre_2012 qa4mre_2013 qasper_bool qasper_freeform sciq swde webqs mgsm_direct_de
mgsm_direct_es mgsm_direct_fr mgsm_direct_ja mgsm_direct_ru mgsm_direct_zh xstorycloze_ar xstorycloze_es xstorycloze_id
xstorycloze_ru xstorycloze_zh lm_syneval zhoblimp turblimp_core blimp_nl belebele
""".split() + [f"include_base_44_{lang}_few_shot_og" for lang in """albanian arabic armenian azerbaijani basque belarusian
bengali bulgarian chinese croatian dutch finnish french georgian german greek hebrew hindi hungarian indonesian italian
japanese kazakh korean lithuanian malay nepali north_macedonian persian portuguese russian serbian spanish tagalog tamil
telugu turkish ukrainian uzbek vietnamese""".split()] + [f"mmmlu_{slug}" for slug in """ar_xy bn_bd de_de es_la fr_fr
hi_in id_id it_it ja_jp ko_kr pt_br sw_ke yo_ng zh_cn""".split()]

EXCLUDED_PREFIXES = ("code2text_", "jsonschema_bench_", "lambada_openai", "lambada_standard")
EXCLUDED = {"swde", "realtoxicityprompts", "wikitext"}
PASSAGE_FIELDS = ["passage", "context", "ctx", "article", "story", "premise", "background", "document", "paragraph",
                  "support"]
SPLITS = ("test_split", "validation_split", "training_split")


class _Loader(yaml.SafeLoader):
    """YAML with the task files' ``!function`` tags read as plain strings."""


_Loader.add_multi_constructor("!", lambda loader, suffix, node: f"!{suffix}")


def _load(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    with open(path, encoding="utf-8") as handle:
        config = yaml.load(handle, Loader=_Loader) or {}
    if not isinstance(config, dict):
        return {}
    include = config.pop("include", None)
    if isinstance(include, str) and path not in seen:
        base = _load(path.parent / include, seen + (path,)) if (path.parent / include).exists() else {}
        config = {**base, **config}
    return config


def index_tasks(root: Path) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """(leaf task name -> config, group or tag name -> member task names)."""
    tasks: dict[str, dict] = {}
    groups: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.yaml")):
        try:
            config = _load(path)
        except (yaml.YAMLError, OSError, RecursionError):
            continue
        task = config.get("task")
        if "group" in config and isinstance(task, list):
            members = [t if isinstance(t, str) else t.get("task") for t in task if isinstance(t, (str, dict))]
            groups.setdefault(str(config["group"]), []).extend(m for m in members if isinstance(m, str))
            continue
        if isinstance(task, str):
            tasks[task] = {**config, "__dir__": str(path.parent)}
            tags = config.get("tag") or []
            for tag in [tags] if isinstance(tags, str) else tags:
                if isinstance(tag, str):
                    groups.setdefault(tag, []).append(task)
    return tasks, groups


def leaves(name: str, tasks: dict, groups: dict, depth: int = 0) -> list[str]:
    if name in tasks:
        return [name]
    if depth > 6:
        return []
    out: list[str] = []
    for member in groups.get(name, []):
        out.extend(leaves(member, tasks, groups, depth + 1))
    if not out:  # bundle names that are prefixes of a family (belebele, include_base_44, mmmlu)
        out = sorted(t for t in tasks if t.startswith(name + "_") and depth == 0)
    return out


def _with_class_dataset(config: dict) -> dict:
    """Tasks written as a Python class name their dataset in its ``DATASET_PATH``/``DATASET_NAME``
    and read splits as ``self.dataset["test"]``: read those from the task's source file."""
    if config.get("dataset_path") or not isinstance(config.get("class"), str) or "__dir__" not in config:
        return config
    source = ""
    for path in sorted(Path(config["__dir__"]).glob("*.py")):
        source += path.read_text(encoding="utf-8", errors="replace")
    path_match = re.search(r"DATASET_PATH\s*=\s*[\"']([^\"']+)[\"']", source)
    name_match = re.search(r"DATASET_NAME\s*=\s*[\"']([^\"']+)[\"']", source)
    if not path_match:
        return config
    out = {**config, "dataset_path": path_match.group(1), "dataset_name": name_match.group(1) if name_match else None}
    for key, split in (("test_split", "test"), ("validation_split", "validation"), ("training_split", "train")):
        if re.search(r"dataset\[[\"']" + split + r"[\"']\]", source):
            out[key] = split
    return out


def excluded(name: str) -> bool:
    return name in EXCLUDED or name.startswith(EXCLUDED_PREFIXES)


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _key(name: str) -> str:
    key = "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")
    key = "_".join(part for part in key.split("_") if part)
    return "lmh_" + key


def main() -> int:
    import lm_eval

    root = Path(os.path.dirname(lm_eval.__file__)) / "tasks"
    tasks, groups = index_tasks(root)
    registry = tomllib.loads(REGISTRY.read_text(encoding="utf-8"))
    covered = {e["provider"].get("repo") for e in registry.get("eval", []) if isinstance(e.get("provider"), dict)}
    chosen: dict[str, dict] = {}
    skipped: list[tuple[str, str]] = []
    for bundle in BUNDLES:
        found = leaves(bundle, tasks, groups)
        if not found:
            skipped.append((bundle, "not in this lm-eval release"))
        for leaf in found:
            if leaf in chosen or any(leaf == s for s, _ in skipped):
                continue
            config = _with_class_dataset(tasks[leaf])
            if excluded(leaf):
                skipped.append((leaf, "excluded (Marin's exclusion list)"))
                continue
            path = config.get("dataset_path")
            split = next((config.get(k) for k in SPLITS if isinstance(config.get(k), str)), None)
            if not isinstance(path, str) or "/" not in path or path.startswith((".", "/")) or os.sep in path[:1]:
                skipped.append((leaf, f"dataset_path {path!r} is not a Hub dataset repo"))
            elif split is None:
                skipped.append((leaf, "no test, validation or train split named"))
            elif path in covered:
                skipped.append((leaf, f"{path} is already a hand-written entry"))
            else:
                chosen[leaf] = {"repo": path, "config": config.get("dataset_name"), "split": split}
    lines = [
        "# Generated by scripts/evals_from_lm_eval.py from the lm-eval-harness task registry "
        f"(lm_eval {getattr(lm_eval, '__version__', '')}); do not edit by hand.",
        "# Best effort: a set that cannot be fetched or read is reported by the eval_ngrams check",
        "# eval_sets_available and never blocks a build. Revisions are branches until `marin-assets evals lock`",
        "# pins them. Fields: every string field of a row but the passage fields Marin drops.",
        f"# {len(chosen)} leaf tasks; left out:",
    ]
    lines += [f"#   {name}: {reason}" for name, reason in sorted(set(skipped))]
    lines += ["", "version = 1", ""]
    names = set()
    for leaf, spec in sorted(chosen.items()):
        key = _key(leaf)
        if key in names:
            continue
        names.add(key)
        config = spec["config"]
        split = spec["split"]
        if isinstance(config, str) and config:
            globs = [f"*{config}/*{split}*", f"*{config}*{split}*", f"*{split}*{config}*"]
        else:
            globs = [f"*{split}*"]
        lines += [
            "[[eval]]",
            f"name = {_toml_string(key)}",
            f"title = {_toml_string('lm-eval ' + leaf)}",
            'group = "lm-eval"',
            "mandatory = false",
            'fields = ["*"]',
            "passage_fields = [" + ", ".join(_toml_string(p) for p in PASSAGE_FIELDS) + "]",
            "[eval.provider]",
            'kind = "huggingface"',
            f"repo = {_toml_string(spec['repo'])}",
        ]
        if isinstance(config, str) and config:
            lines.append(f"config = {_toml_string(config)}")
        lines += [f"split = {_toml_string(split)}", 'revision = "main"',
                  "files = [" + ", ".join(_toml_string(g) for g in globs) + "]", ""]
    OUT.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {OUT}: {len(names)} eval sets, {len(set(skipped))} left out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
