"""Family transforms of the web and API sources: HPLT, MASSIVE, NSF awards, docx corpus.

Each turns the rows its provider stored under ``raw/`` into rows with ``text`` and
``source_id`` and counts every row it drops, by reason.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections.abc import Mapping

import polars as pl

from marin_assets.core.ingest.transforms import register

# --------------------------------------------------------------------------- HPLT v3.0

# Web-register labels (Turku register scheme): top-level registers, then sub-registers.
TOP_REGISTERS = ("MT", "LY", "SP", "ID", "NA", "HI", "IN", "OP", "IP")
SUB_REGISTERS = ("ob", "nb", "ne", "ra", "re", "rv", "sr", "it", "en", "av", "rs",
                 "lt", "fi", "dtp", "oi", "on", "oh", "oo", "os", "ed", "oe", "ds")  # fmt: skip
# Prose sub-registers: opinion/narrative blogs, news, research, recipes, reviews, sports,
# interviews, encyclopedia articles, advice, religious texts.
GOOD_SUB_REGISTERS = ("ob", "nb", "ne", "ra", "re", "rv", "sr", "it", "en", "av", "rs")
GOOD_TOP_REGISTERS = ("HI", "LY", "SP")  # how-to, lyrical, spoken


@dataclasses.dataclass(frozen=True)
class HpltFilterParams:
    """Which HPLT documents are kept (defaults are the reference values)."""

    crawl_prefixes: tuple[str, ...] = ("wide", "survey")  # the non-Common-Crawl crawls
    machine_translated_max: float = 0.2  # drop when MT >= this
    selling_max: float = 0.1  # drop when ds (description with intent to sell) > this
    persuasion_good_sub_min: float = 0.15  # dominant IP needs a prose sub-register above this
    keep_tier: int = 8  # WDS tiers at or above this are kept when not rejected
    good_top_mt_max: float = 0.15  # a good top-level register keeps a row only below this MT


HPLT_PARAMS = HpltFilterParams()


def _column(frame: pl.DataFrame, name: str, dtype: pl.DataType = pl.Utf8) -> pl.Expr:
    return pl.col(name) if name in frame.columns else pl.lit(None, dtype=dtype)


def _truthy(frame: pl.DataFrame, name: str) -> pl.Expr:
    """A column's Python truthiness (lists non-empty, strings non-empty, numbers non-zero)."""
    if name not in frame.columns:
        return pl.lit(False)
    dtype = frame.schema[name]
    if isinstance(dtype, (pl.List, pl.Array)):
        expr = pl.col(name).list.len() > 0
    elif dtype == pl.Utf8:
        expr = pl.col(name).str.len_bytes() > 0
    elif dtype == pl.Boolean:
        expr = pl.col(name)
    elif dtype.is_numeric():
        expr = pl.col(name) != 0
    elif isinstance(dtype, pl.Struct):
        expr = pl.col(name).is_not_null()
    else:
        expr = pl.lit(False)
    return expr.fill_null(False)


def _dominant(scores: dict[str, pl.Expr], names: tuple[str, ...]) -> pl.Expr:
    """The name of the highest score among ``names`` present (null when none is)."""
    present = [n for n in names if n in scores]
    if not present:
        return pl.lit(None, dtype=pl.Utf8)
    index = pl.concat_list([scores[n] for n in present]).list.arg_max()
    return index.replace_strict(list(range(len(present))), present, default=None, return_dtype=pl.Utf8)


def hplt_reasons(frame: pl.DataFrame, params: HpltFilterParams = HPLT_PARAMS) -> pl.Expr:
    """Why each row is dropped (null when it is kept), first failing rule wins."""
    crawl = _column(frame, "crawl_id")
    non_cc = pl.any_horizontal([crawl.str.starts_with(p) for p in params.crawl_prefixes]).fill_null(False)
    register_type = frame.schema.get("web-register")
    fields = {f.name for f in register_type.fields} if isinstance(register_type, pl.Struct) else set()
    scores = {k: pl.col("web-register").struct.field(k).cast(pl.Float64) for k in (*TOP_REGISTERS, *SUB_REGISTERS) if k in fields}
    zero = pl.lit(0.0)
    mt = scores.get("MT", zero).fill_null(0.0)
    ds = scores.get("ds", zero).fill_null(0.0)
    top, sub = _dominant(scores, TOP_REGISTERS), _dominant(scores, SUB_REGISTERS)
    good_sub_strong = pl.any_horizontal([scores[k].fill_null(0.0) > params.persuasion_good_sub_min for k in GOOD_SUB_REGISTERS if k in scores] or [pl.lit(False)])
    tier = _column(frame, "wds_tier", pl.Int64).cast(pl.Int64, strict=False)
    keep = (
        (tier >= params.keep_tier).fill_null(False)
        | sub.is_in(list(GOOD_SUB_REGISTERS)).fill_null(False)
        | (top.is_in(list(GOOD_TOP_REGISTERS)).fill_null(False) & (mt < params.good_top_mt_max))
    )
    return (
        pl.when(crawl.is_null()).then(pl.lit("missing_crawl_id"))
        .when(~non_cc).then(pl.lit("common_crawl"))
        .when(_truthy(frame, "pii")).then(pl.lit("pii"))
        .when(mt >= params.machine_translated_max).then(pl.lit("machine_translated"))
        .when(ds > params.selling_max).then(pl.lit("selling"))
        .when((sub == "lt").fill_null(False)).then(pl.lit("legal_terms"))
        .when((top == "IP").fill_null(False) & ~good_sub_strong).then(pl.lit("persuasion"))
        .when(~keep).then(pl.lit("low_register"))
        .otherwise(pl.lit(None, dtype=pl.Utf8))
    )  # fmt: skip


def _drop_counts(frame: pl.DataFrame, reason: str = "_reason") -> dict[str, int]:
    dropped = frame.filter(pl.col(reason).is_not_null())
    return {str(r): int(n) for r, n in dropped[reason].value_counts().iter_rows()} if dropped.height else {}


@register("hplt_register_filter")
def hplt_register_filter(frame: pl.DataFrame) -> tuple[pl.DataFrame, Mapping[str, int]]:
    """Keep non-Common-Crawl HPLT documents that pass the web-register quality rules."""
    frame = frame.with_columns(hplt_reasons(frame).alias("_reason"))
    counts = _drop_counts(frame)
    kept = frame.filter(pl.col("_reason").is_null())
    out = kept.select(
        _column(kept, "text").alias("text"),
        _column(kept, "id").cast(pl.Utf8).alias("source_id"),
        _column(kept, "wds_tier", pl.Int64).cast(pl.Int64, strict=False).alias("hplt_wds_tier"),
        _column(kept, "crawl_id").alias("hplt_crawl_id"),
        _column(kept, "u").alias("hplt_url"),
        _column(kept, "ts").cast(pl.Utf8).alias("hplt_timestamp"),
        *([pl.col("web-register").alias("hplt_web_register")] if "web-register" in kept.columns else []),
        *([pl.col("doc_scores").alias("hplt_doc_scores")] if "doc_scores" in kept.columns else []),
    )
    return out, counts


# --------------------------------------------------------------------------- MASSIVE v1.1

# Slot vocabulary of each of the 60 MASSIVE intents (slot names are the same in every locale).
INTENT_SLOTS: dict[str, tuple[str, ...]] = {intent: tuple(slots.split()) for intent, slots in {
    "alarm_query": "alarm_type date device_type event_name house_place time timeofday",
    "alarm_remove": "alarm_type date event_name person relation time timeofday",
    "alarm_set": "alarm_type date event_name general_frequency media_type order_type person relation time time_zone timeofday",
    "audio_volume_down": "change_amount device_type",
    "audio_volume_mute": "change_amount date device_type event_name time timeofday",
    "audio_volume_other": "change_amount",
    "audio_volume_up": "change_amount device_type media_type song_name",
    "calendar_query": "business_name date event_name general_frequency list_name meal_type person place_name relation sport_type time timeofday",
    "calendar_remove": "app_name business_type date event_name general_frequency list_name meal_type person place_name relation time timeofday transport_type",
    "calendar_set": "artist_name business_name business_type date event_name general_frequency house_place meal_type media_type person personal_info place_name relation song_name sport_type time timeofday",
    "cooking_query": "food_type meal_type",
    "cooking_recipe": "app_name business_name cooking_type date device_type drink_type event_name food_type ingredient list_name meal_type media_type time timeofday",
    "datetime_convert": "person place_name time time_zone timeofday",
    "datetime_query": "date event_name food_type place_name time time_zone timeofday",
    "email_addcontact": "business_name email_address list_name person personal_info place_name relation",
    "email_query": "business_name date email_folder event_name person personal_info place_name relation time timeofday",
    "email_querycontact": "business_name date device_type event_name list_name media_type person personal_info place_name relation time",
    "email_sendemail": "artist_name business_name date email_address email_folder event_name general_frequency meal_type person personal_info place_name relation time timeofday",
    "general_greet": "date",
    "general_joke": "business_type date food_type joke_type person relation",
    "general_quirky": "artist_name business_type date device_type drink_type event_name food_type general_frequency meal_type media_type movie_name news_topic person place_name relation time timeofday",
    "iot_cleaning": "date device_type general_frequency house_place place_name time",
    "iot_coffee": "business_name business_type coffee_type date device_type time timeofday",
    "iot_hue_lightchange": "change_amount color_type house_place player_setting time",
    "iot_hue_lightdim": "change_amount color_type device_type house_place",
    "iot_hue_lightoff": "color_type device_type house_place time",
    "iot_hue_lighton": "device_type house_place",
    "iot_hue_lightup": "change_amount device_type house_place",
    "iot_wemo_off": "device_type house_place",
    "iot_wemo_on": "device_type house_place",
    "lists_createoradd": "date drink_type event_name general_frequency list_name music_descriptor person place_name relation time",
    "lists_query": "app_name business_name date device_type event_name list_name music_genre person timeofday",
    "lists_remove": "date event_name list_name meal_type person place_name relation song_name timeofday",
    "music_dislikeness": "music_descriptor music_genre",
    "music_likeness": "app_name artist_name date event_name music_descriptor music_genre place_name player_setting playlist_name song_name",
    "music_query": "artist_name date media_type music_album music_genre person player_setting song_name timeofday",
    "music_settings": "app_name artist_name device_type media_type music_descriptor music_genre player_setting song_name",
    "news_query": "date device_type general_frequency media_type news_topic person place_name time timeofday transport_type",
    "play_audiobook": "app_name artist_name audiobook_author audiobook_name date media_type player_setting song_name time",
    "play_game": "device_type game_name game_type",
    "play_music": "app_name artist_name date device_type media_type movie_name music_album music_descriptor music_genre player_setting playlist_name song_name time timeofday",
    "play_podcasts": "date media_type person place_name player_setting podcast_descriptor podcast_name radio_name time timeofday transport_type",
    "play_radio": "app_name date device_type house_place media_type music_descriptor music_genre person radio_name relation time timeofday",
    "qa_currency": "business_name currency_name date place_name",
    "qa_definition": "definition_word",
    "qa_factoid": "artist_name date event_name food_type list_name movie_name music_genre news_topic person place_name time",
    "qa_maths": "date general_frequency",
    "qa_stock": "business_name currency_name date news_topic person time",
    "recommendation_events": "business_name business_type date event_name meal_type movie_type personal_info place_name time timeofday",
    "recommendation_locations": "business_name business_type date drink_type food_type meal_type place_name time",
    "recommendation_movies": "business_name business_type date event_name media_type movie_name movie_type place_name time timeofday",
    "social_post": "business_name business_type date device_type event_name media_type person personal_info place_name relation weather_descriptor",
    "social_query": "date event_name general_frequency media_type news_topic person relation time",
    "takeaway_order": "app_name business_name business_type date drink_type food_type ingredient meal_type order_type time timeofday",
    "takeaway_query": "business_name business_type event_name food_type meal_type order_type person place_name time timeofday",
    "transport_query": "app_name business_name business_type date event_name food_type person place_name relation time timeofday transport_descriptor transport_name transport_type",
    "transport_taxi": "app_name business_name business_type date event_name person place_name time timeofday transport_agency transport_name transport_type",
    "transport_ticket": "app_name currency_name date place_name relation time timeofday transport_descriptor transport_name transport_type",
    "transport_traffic": "date event_name place_name time timeofday",
    "weather_query": "business_type date event_name food_type general_frequency meal_type place_name time timeofday weather_descriptor",
}.items()}  # fmt: skip
PARTITION_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


@dataclasses.dataclass(frozen=True)
class MassiveRenderParams:
    min_distractors: int = 20
    max_distractors: int = 60


MASSIVE_PARAMS = MassiveRenderParams()


def intent_tool(intent: str) -> dict[str, object]:
    """A Responses-API function tool for one intent: every slot is an array of strings."""
    return {
        "type": "function",
        "name": intent,
        "description": f"Handle a request with the {intent!r} intent.",
        "parameters": {
            "type": "object",
            "properties": {
                slot: {"type": "array", "items": {"type": "string"}, "description": f"Values of the {slot!r} slot in the request."}
                for slot in INTENT_SLOTS[intent]
            },
            "required": [],
        },
    }


INTENTS = tuple(sorted(INTENT_SLOTS))
_TOOL_JSON = {intent: json.dumps(intent_tool(intent), ensure_ascii=False) for intent in INTENTS}
_SLOT = re.compile(r"\[([^\[\]:]*):([^\[\]]*)\]")


def parse_annotation(annotation: str) -> list[tuple[str, str]] | None:
    """``(slot, value)`` pairs of ``... [slot : value] ...``, in order; None when malformed."""
    pairs = [(m.group(1).strip(), m.group(2).strip()) for m in _SLOT.finditer(annotation)]
    rest = _SLOT.sub("", annotation)
    if "[" in rest or "]" in rest or any(not slot for slot, _ in pairs):
        return None
    return pairs


def tool_selection(intent: str, seed: str, params: MassiveRenderParams = MASSIVE_PARAMS) -> list[str]:
    """The gold intent plus 20-60 seeded distractor intents, shuffled (same seed, same list)."""
    rng = random.Random(seed)
    others = [i for i in INTENTS if i != intent]
    chosen = [intent, *rng.sample(others, rng.randint(params.min_distractors, min(params.max_distractors, len(others))))]
    rng.shuffle(chosen)
    return chosen


def render_function_call(locale: str, massive_id: str, intent: str, arguments: dict[str, list[str]]) -> str:
    call = {"type": "function_call", "call_id": f"call_{locale}_{massive_id}", "name": intent,
            "arguments": json.dumps(arguments, ensure_ascii=False, sort_keys=True)}  # fmt: skip
    return json.dumps(call, ensure_ascii=False)


def render_massive(locale: str, massive_id: str, split: str, intent: str, utterance: str, pairs: list[tuple[str, str]]) -> str:
    arguments: dict[str, list[str]] = {}
    for slot, value in pairs:
        arguments.setdefault(slot, []).append(value)
    tools = "[" + ", ".join(_TOOL_JSON[i] for i in tool_selection(intent, f"{locale}/{massive_id}/{split}")) + "]"
    return f"Tools: {tools}\nRequest: {utterance}\ntool_call: {render_function_call(locale, massive_id, intent, arguments)}"


@register("massive_function_calling")
def massive_function_calling(frame: pl.DataFrame) -> tuple[pl.DataFrame, Mapping[str, int]]:
    """Render each utterance as a tool list, the request and the gold function call."""
    counts: dict[str, int] = {}
    out: dict[str, list[str]] = {k: [] for k in ("text", "source_id", "locale", "split", "intent", "scenario", "massive_id")}
    columns = ("locale", "id", "partition", "intent", "scenario", "utt", "annot_utt")
    rows = frame.select(_column(frame, c).cast(pl.Utf8) for c in columns)
    for locale, massive_id, partition, intent, scenario, utterance, annotation in rows.iter_rows():
        reason = None
        if not locale or massive_id is None:
            reason = "missing_id"
        elif intent not in INTENT_SLOTS:
            reason = "unknown_intent"
        elif partition not in PARTITION_SPLITS:
            reason = "unknown_partition"
        elif not utterance or not utterance.strip():
            reason = "missing_utterance"
        if reason is None:
            pairs = parse_annotation(annotation or "")
            if pairs is None or annotation is None:
                reason = "malformed_annotation"
        if reason is not None:
            counts[reason] = counts.get(reason, 0) + 1
            continue
        split = PARTITION_SPLITS[partition]
        out["text"].append(render_massive(locale, massive_id, split, intent, utterance, pairs))  # type: ignore[arg-type]
        out["source_id"].append(f"{locale}/{massive_id}/{split}")
        for key, value in (("locale", locale), ("split", split), ("intent", intent), ("scenario", scenario), ("massive_id", massive_id)):
            out[key].append(value)
    return pl.DataFrame(out, schema={k: pl.Utf8 for k in out}), counts


# --------------------------------------------------------------------------- NSF awards

NSF_FIELDS = ("awd_titl_txt", "awd_abstract_narration", "awd_eff_date", "awd_exp_date", "awd_amount",
              "dir_abbr", "org_dir_long_name", "div_abbr", "org_div_long_name")  # fmt: skip


@register("nsf_award_abstracts")
def nsf_award_abstracts(frame: pl.DataFrame) -> tuple[pl.DataFrame, Mapping[str, int]]:
    """Title, a blank line and the abstract; awards without an abstract are dropped."""
    title = _column(frame, "awd_titl_txt").str.strip_chars()
    abstract = _column(frame, "awd_abstract_narration")
    frame = frame.with_columns(
        pl.when(_column(frame, "parse_error").is_not_null()).then(pl.lit("unparseable_award"))
        .when(abstract.is_null() | (abstract.str.strip_chars().str.len_bytes() == 0)).then(pl.lit("missing_abstract"))
        .otherwise(pl.lit(None, dtype=pl.Utf8)).alias("_reason")
    )  # fmt: skip
    counts = _drop_counts(frame)
    repaired = int(frame.filter(pl.col("_reason").is_null()).select(_truthy(frame, "utf8_repaired").sum()).item() or 0)
    if repaired:
        counts["invalid_utf8_repaired"] = repaired
    kept = frame.filter(pl.col("_reason").is_null())
    text = (
        pl.when(title.is_not_null() & (title.str.len_bytes() > 0))
        .then(pl.concat_str([title, pl.lit("\n\n"), abstract]))
        .otherwise(abstract)
    )
    out = kept.select(
        text.alias("text"),
        _column(kept, "awd_id").cast(pl.Utf8).alias("source_id"),
        *[_column(kept, f).cast(pl.Float64, strict=False).alias(f) if f == "awd_amount" else _column(kept, f).alias(f) for f in NSF_FIELDS],
        _column(kept, "year", pl.Int64).cast(pl.Int64, strict=False).alias("year"),
    )
    return out, counts


# --------------------------------------------------------------------------- docx corpus

_DOCX_ID = r"^[0-9a-f]{64}$"


@register("docx_corpus_records")
def docx_corpus_records(frame: pl.DataFrame) -> tuple[pl.DataFrame, Mapping[str, int]]:
    """Fetched document texts as they are; documents not served or empty are dropped and counted."""
    status = _column(frame, "status")
    doc_id = _column(frame, "id").cast(pl.Utf8)
    frame = frame.with_columns(
        pl.when(doc_id.is_null() | ~doc_id.str.contains(_DOCX_ID).fill_null(False)).then(pl.lit("invalid_id"))
        .when(status.is_null()).then(pl.lit("document_status_missing"))
        .when(status != "ok").then(pl.lit("document_") + status)
        .otherwise(pl.lit(None, dtype=pl.Utf8)).alias("_reason")
    )  # fmt: skip
    counts = _drop_counts(frame)
    kept = frame.filter(pl.col("_reason").is_null())
    repaired = int(kept.select(_truthy(kept, "utf8_repaired").sum()).item() or 0)
    if repaired:
        counts["invalid_utf8_repaired"] = repaired
    out = kept.select(
        _column(kept, "text").alias("text"),
        _column(kept, "id").cast(pl.Utf8).alias("source_id"),
        *[_column(kept, c).alias(c) for c in ("url", "raw_url", "source", "language")],
    )
    return out, counts
