"""``marin-assets build``: what one backfill holds, and the names it refuses before launching."""

from __future__ import annotations

from marin_assets import cli
from marin_assets.core import specs


def test_build_holds_every_chain_step_and_the_global_steps_after_it() -> None:
    from marin_assets.definitions import defs
    from marin_assets.defs.partitions import source_partitions

    graph = defs.resolve_asset_graph()
    per_source = {k.to_user_string() for k in graph.materializable_asset_keys if graph.get(k).partitions_def == source_partitions}
    selected = {"/".join(path) for path in cli.build_selection()}
    assert per_source <= selected, "each source's complete chain"
    assert {specs.EXACT_DUPLICATES.name, specs.FUZZY_DUPLICATES.name, specs.BOILERPLATE_NGRAMS.name, specs.QUALITY_BANDS.name, specs.SAMPLING_GROUPS.name} <= selected
    assert specs.SOURCE_PINS.name not in selected, "pins are observed, not built"
    assert not {specs.TOPIC_MODEL.name, specs.QUALITY_MODEL.name} & selected, "training is asked for explicitly"
    assert {specs.TOPIC_MODEL.name, specs.QUALITY_MODEL.name} <= {"/".join(p) for p in cli.build_selection(with_models=True)}
    assert all(graph.get(k).partitions_def in (None, source_partitions) for k in graph.materializable_asset_keys if k.to_user_string() in selected)


def test_build_names_a_source_that_is_not_in_the_catalog(capsys) -> None:
    assert cli.main(["build", "--sources", "cp/peps,no/such_source", "--url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "no/such_source" in err and "cp/peps" not in err


def test_build_says_which_webserver_it_could_not_reach(capsys) -> None:
    assert cli.main(["build", "--sources", "cp/peps", "--url", "http://127.0.0.1:9"]) == 2
    assert "cannot reach the Dagster webserver at http://127.0.0.1:9" in capsys.readouterr().err


def test_the_backfill_build_asks_for_holds_each_chain_and_each_global_step_once() -> None:
    """What the webserver makes of build's request (partition names plus the selection): the
    named sources' partitions of every per-source asset, and every global step, in one backfill."""
    import time

    import dagster as dg
    from dagster._core.execution.backfill import PartitionBackfill

    from marin_assets.definitions import defs

    graph = defs.resolve_asset_graph()
    sources = ["cp/peps", "cp/libretexts"]
    with dg.instance_for_test() as instance:
        backfill = PartitionBackfill.from_asset_partitions(
            backfill_id="build", asset_graph=graph, backfill_timestamp=time.time(), tags={}, asset_selection=[dg.AssetKey(p) for p in cli.build_selection()],
            partition_names=sources, dynamic_partitions_store=instance, all_partitions=False, title=None, description=None, run_config=None,
        )  # fmt: skip
    target = backfill.asset_backfill_data.target_subset
    partitioned = {k.to_user_string(): set(target.get_partitions_subset(k).get_partition_keys()) for k in target.asset_keys if graph.get(k).partitions_def}
    unpartitioned = {k.to_user_string() for k in target.asset_keys if not graph.get(k).partitions_def}
    assert partitioned and all(parts == set(sources) for parts in partitioned.values()), partitioned
    assert {specs.POOL.name, specs.RAW_FILES.name} <= set(partitioned)
    assert {specs.EXACT_DUPLICATES.name, specs.QUALITY_BANDS.name, specs.SAMPLING_GROUPS.name} <= unpartitioned
