"""One stage of datatrove's MinHash pipeline, as its documentation runs it (its own
``LocalPipelineExecutor``, one worker), for ``bench/bench_dedup_peers.py``. Runs in the bench's
own environment (``.bench/venv-datatrove``), never in the project's: it imports only datatrove.

Usage: ``python peer_datatrove.py STAGE WORK INPUT BUCKETS HASHES_PER_BUCKET``; prints the
stage process's VmHWM (KiB) as JSON on its last line.
"""

from __future__ import annotations

import json
import sys


def vmhwm_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def main() -> None:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter, MinhashDedupSignature
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    stage, work, data, buckets, per_bucket = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    config = MinhashConfig(n_grams=5, num_buckets=buckets, hashes_per_bucket=per_bucket)
    files = len([line for line in open(f"{data}/files.txt") if line.strip()])
    pipelines = {
        "signatures": ([JsonlReader(data, glob_pattern="*.jsonl"), MinhashDedupSignature(output_folder=f"{work}/signatures", config=config)], files),
        "buckets": ([MinhashDedupBuckets(input_folder=f"{work}/signatures", output_folder=f"{work}/buckets", config=config)], buckets),
        "cluster": ([MinhashDedupCluster(input_folder=f"{work}/buckets", output_folder=f"{work}/remove_ids", config=config)], 1),
        "filter": (
            [
                JsonlReader(data, glob_pattern="*.jsonl"),
                MinhashDedupFilter(input_folder=f"{work}/remove_ids", exclusion_writer=JsonlWriter(f"{work}/removed", compression=None)),
                JsonlWriter(f"{work}/deduplicated", compression=None),
            ],
            files,
        ),
    }
    pipeline, tasks = pipelines[stage]
    LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=1, logging_dir=f"{work}/logs/{stage}").run()
    print(json.dumps({"vmhwm_kib": vmhwm_kib()}))


if __name__ == "__main__":
    main()
