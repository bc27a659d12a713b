"""One-off investigations: benches whose question is answered, kept to rerun them. Not installed.

They run from the repository's root as ``python -m benchmarks NAME [options]`` and reuse
``icecdc.bench``'s registry and harness. The product must never import this package.
"""

from __future__ import annotations

from icecdc.bench import Benchmark

INVESTIGATIONS = tuple(
    Benchmark(name, help, package=__name__)
    for name, help in (
        ("rewrite", "the compactor's rewrite throughput (deletes applied) against pyarrow read+write"),
        ("manifests", "point-lookup latency with N small manifests against the same data files with the manifests merged"),
        ("manifest-merging", "the writer's commit time against the table's live files and commit.manifest.min-count-to-merge"),
        (
            "global-deletes",
            "reads with unresolved global equality deletes against the same table resolved, and resolving's cost",
        ),
        ("scale", "the compactor's metadata reads, decisions, status and listings against partitions and files"),
        ("jobs", "settled partitions compacted per minute, one Spark job per partition against several a job"),
        ("ingest-shape", "the ingester's cost per batch against the batch's size and the tables it spans, with memory"),
        (
            "conversion",
            "one batch's equality deletes converted to position deletes, with the key index and by reading the partition's keys",
        ),
        (
            "parse",
            "the ingester's parse stage on one core: its Python path against its fast path, generator and connector messages",
        ),
        ("watch", "one poll of the kept tables' watcher over N tables, none changed and one new snapshot each"),
        ("sorted-lookup", "a point lookup on the sort key before and after the sidecar's compactions, sorted and unsorted"),
    )
)
