"""The ``mixture_studies`` sensor: new studies, new external results, refits.

Each tick, for the storage root:

1. a study folder with a spec that is not yet a partition is added, and its swarm requested;
2. a results file of an external trainer's study that is new or changed since the last tick
   (size and modification stamp) is read, and the runs it names are requested as ``proxy_results`` partitions (validation runs,
   ``v-...``, as ``mixture_validation``); an unusable file is logged (with the fix) and not
   retried until it changes;
3. a study whose latest ``proxy_results`` materialization is newer than its latest
   ``mixture_model`` one, with none of its runs still queued or running, gets a refit
   (``mixture_model`` then ``mixture_weights``).

Like the other sensors it starts in the state ``MARIN_AUTOMATION`` names (off by default).
"""

import json

import dagster as dg

from marin_assets.core import specs
from marin_assets.core.mixture import results
from marin_assets.core.mixture import swarm as swarm_core
from marin_assets.core.mixture import validation as validation_core
from marin_assets.defs.automation.sensors import default_status
from marin_assets.defs.jobs import STUDY_JOBS
from marin_assets.defs.partitions import (
    RUNS,
    STUDIES,
    proxy_run_key,
    study_partitions,
)
from marin_assets.defs.resources import MarinResource

STUDY_TAG = "marin/study"
PROXY_RESULTS = dg.AssetKey(specs.PROXY_RESULTS.name)
MIXTURE_MODEL = dg.AssetKey(specs.MIXTURE_MODEL.name)


_IN_FLIGHT = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]


def _latest_storage_id(instance: dg.DagsterInstance, key: dg.AssetKey, partitions: list[str]) -> int:
    if not partitions:
        return 0
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, asset_partitions=partitions), limit=1).records
    return records[0].storage_id if records else 0


@dg.sensor(
    name="mixture_studies",
    jobs=STUDY_JOBS,
    minimum_interval_seconds=60,
    default_status=default_status(),
    description="Registers new mixture studies, picks up external proxy results dropped into a study's results/ "
    "folder and refits the study's model once they are in. Default from MARIN_AUTOMATION (off).",
)
def mixture_studies(context: dg.SensorEvaluationContext, marin: MarinResource) -> dg.SensorResult:
    root = marin.layout().root
    cursor: dict[str, dict[str, str]] = json.loads(context.cursor) if context.cursor else {}
    registered = set(context.instance.get_dynamic_partitions(STUDIES))
    new_studies = [s for s in swarm_core.list_studies(root) if s not in registered]
    requests: list[dg.RunRequest] = [
        dg.RunRequest(job_name=specs.MIXTURE_SWARM.phase, partition_key=s, run_key=f"propose/{s}", tags={STUDY_TAG: s}) for s in new_studies
    ]
    run_keys = set(context.instance.get_dynamic_partitions(RUNS))
    for study in sorted(registered):
        folder = swarm_core.results_dir(root, study)
        seen = cursor.get(study, {})
        now = {storage_name: results.file_signature(uri) for storage_name, uri in ((u.rsplit("/", 1)[-1], u) for u in results.results_files(folder))}
        changed = [f"{folder}/{name}" for name, sig in now.items() if seen.get(name) != sig]
        cursor[study] = now
        if changed:
            try:
                spec = swarm_core.load_study(root, study)
            except swarm_core.StudyError as exc:
                context.log.warning(str(exc))
                continue
            if spec.trainer != "external":
                changed = []  # the built-in trainer's own results, written by the runs that recorded them
        if changed:
            ids, errors = results.run_ids_in(folder, changed)
            for error in errors:
                context.log.warning(error)
            valid = set(spec.run_ids())
            validation_runs = {r for r in ids if r.startswith(validation_core.RUN_PREFIX)}
            unknown = sorted(ids - valid - validation_runs)
            if unknown:
                context.log.warning(f"study '{study}': results name runs {unknown[:5]} that are not among its {len(valid)} runs; they are ignored")
            stamp = "-".join(sorted(now[c.rsplit('/', 1)[-1]] for c in changed))
            for run in sorted(ids & valid & run_keys):
                requests.append(
                    dg.RunRequest(job_name=specs.PROXY_RESULTS.phase, partition_key=proxy_run_key(study, run), run_key=f"results/{study}/{run}/{stamp}", tags={STUDY_TAG: study})
                )
            if validation_runs:  # results of mixture_validation's runs: measure again
                requests.append(dg.RunRequest(job_name=specs.MIXTURE_VALIDATION.phase, partition_key=study, run_key=f"validation/{study}/{stamp}", tags={STUDY_TAG: study}))
            continue  # refit once the requested runs are done (a later tick)
        in_flight = context.instance.get_run_ids(dg.RunsFilter(statuses=_IN_FLIGHT, tags={STUDY_TAG: study}), limit=1)
        if in_flight:
            continue
        run_partitions = [str(proxy_run_key(study, r)) for r in sorted(run_keys)]
        latest_results = _latest_storage_id(context.instance, PROXY_RESULTS, run_partitions)
        if latest_results and latest_results > _latest_storage_id(context.instance, MIXTURE_MODEL, [study]):
            requests.append(dg.RunRequest(job_name=specs.MIXTURE_MODEL.phase, partition_key=study, run_key=f"refit/{study}/{latest_results}", tags={STUDY_TAG: study}))
    return dg.SensorResult(
        run_requests=requests,
        cursor=json.dumps(cursor, sort_keys=True),
        dynamic_partitions_requests=[study_partitions.build_add_request(new_studies)] if new_studies else [],
    )


MIXTURE_SENSORS = [mixture_studies]
