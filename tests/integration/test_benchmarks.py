"""Every ``icecdc bench`` harness and every investigation (``python -m benchmarks``) on a short
run with small data: smoke tests of the harness, not measurements."""

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from icecdc.bench.e2e.probe import METRICS, on_portable
from icecdc.bench.strategies import strategy_names
from icecdc.demo import postgres_missing
from tests.processes import command_env, icecdc_process

pytestmark = pytest.mark.bench
ROOT = Path(__file__).resolve().parents[2]


def investigation(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m benchmarks ...`` from the repository's root, where the folder is (not installed)."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        check=False,
        env=command_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_e2e_benchmark_harness(tmp_path):
    """Every strategy (and the compacted copy) gets every series, the run ends with every table
    equal to the stream's final state (it fails otherwise), and JSON, plots and summary are written.
    The source sends key-only before-images (PostgreSQL's default), so every update and delete is
    a global delete, which every strategy's table must end without applying wrongly. Every table
    merges its manifests on each commit (``--table-property``), so the table without maintenance
    ends with one manifest per content and partition spec (at icecdc's 8 its six batches would
    leave theirs)."""
    out = tmp_path / "out"
    # The drain lasts until the sidecar has answered every partition (bounded): on a loaded
    # machine that takes longer than 15 s, and the run waits for it rather than measuring less.
    run = icecdc_process(
        "bench",
        "e2e",
        "--state-dir",
        str(tmp_path / "state"),
        "--out",
        str(out),
        "--minutes",
        "0.5",
        "--keys",
        "2000",
        "--changes",
        "200",
        "--batch-seconds",
        "5",
        "--probe-seconds",
        "10",
        "--cron-seconds",
        "10",
        "--drain-seconds",
        "15",
        "--drain-max-seconds",
        "300",
        "--lookups",
        "3",
        "--before-image",
        "key",
        "--table-property",
        "commit.manifest.min-count-to-merge=2",
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "were deleted in every partition" in run.stderr + run.stdout, "the writer wrote global deletes"
    results = orjson.loads((out / "e2e.json").read_bytes())
    strategies = strategy_names([10])
    assert list(results["strategies"]) == list(strategies)
    for strategy, series in [*((s, m["series"]) for s, m in results["strategies"].items()), ("compacted", results["reference"])]:
        assert len(series) >= 2, strategy
        for point in series:
            assert set(METRICS) <= set(point) and all(point[m] >= 0 for m in METRICS), (strategy, point)
        assert series[-1]["data_files"] > 0, strategy
    for strategy in strategies:
        measured = results["strategies"][strategy]
        assert measured["rows_match"] and not measured["writer_failures"], strategy
        assert len(measured["commit_seconds"]) == results["batches"], strategy
        assert measured["ingested_bytes"] > 0 and "write_amplification" in measured and "settle_to_compacted" in measured
    # Without maintenance nothing is rewritten and the equality deletes stay; every other
    # strategy is seen rewriting within the run.
    assert results["strategies"]["none"]["rewritten_bytes"] == 0
    assert results["strategies"]["none"]["series"][-1]["equality_delete_files"] > 0
    assert results["table_properties"] == {"commit.manifest.min-count-to-merge": "2"}
    # Data, equality deletes, global deletes (the unpartitioned spec's).
    assert results["strategies"]["none"]["series"][-1]["manifests"] <= 3
    assert results["strategies"]["cron-10s"]["compaction_commits"] > 0
    assert results["strategies"]["icecdc"]["compaction_commits"] > 0
    # The sidecar left every partition merged (the drain waited for it): no live equality deletes.
    assert results["strategies"]["icecdc"]["series"][-1]["equality_delete_files"] == 0
    # The sidecar's table was sampled for its oldest equality delete, and once drained both readers
    # that cannot apply equality deletes read it exactly.
    assert results["equality_delete_ages"] and results["portability"]["oldest_equality_delete_writing"]["samples"] > 0
    # The global deletes' ages were sampled with the others, and are among them.
    for (t, oldest), (t_global, oldest_global) in zip(
        results["equality_delete_ages"], results["global_delete_ages"], strict=True
    ):
        assert t == t_global and (oldest_global is None or (oldest is not None and oldest_global <= oldest))
    assert results["portability"]["oldest_global_delete_writing"]["samples"] > 0
    # The current snapshot, then holding no equality delete, is also the newest portable one.
    readers = ("pyiceberg", "duckdb")
    assert results["readers"][-1]["outcomes"] == dict.fromkeys((*readers, *map(on_portable, readers)), "exact")
    assert results["readers"][-1]["portable_seconds_behind"] == 0.0
    assert results["strategies"]["icecdc"]["amplification_so_far"], "the write amplification over the run"
    pngs = ("e2e.png", "e2e-writer_commit_ms.png", "e2e-portability.png", "e2e-amplification.png")
    for name in (*pngs, *(f"e2e-{m}.png" for m in METRICS)):
        assert (out / name).stat().st_size > 0, name
    text = (out / "e2e.md").read_text()
    assert all(f"| {s} |" in text for s in strategies)
    assert "table property commit.manifest.min-count-to-merge=2;" in text


def test_rewrite_benchmark_harness(tmp_path):
    """A short ``python -m benchmarks rewrite``: every path (both engines, pyarrow) timed over the same
    files, summary and plot written."""
    out = tmp_path / "out"
    run = investigation(
        "rewrite",
        "--state-dir",
        str(tmp_path / "state"),
        "--out",
        str(out),
        "--rows",
        "20000",
        "--batches",
        "4",
        "--repeats",
        "1",
        "--regions",
        "1",
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = orjson.loads((out / "rewrite.json").read_bytes())
    # Every row in one partition: four loading INSERTs and the writer's batch of updates, five files.
    assert results["files"] == 5 and results["input_bytes"] > 0
    assert results["icecdc_mb_per_second_per_core"] > 0 and results["pyarrow_mb_per_second_per_core"] > 0
    assert len(results["arrow_seconds"]) == 1  # the arrow engine's merge, side by side
    assert results["stages"] and all(stage["tasks"] > 0 for stage in results["stages"])  # Spark's profile of it
    assert (out / "rewrite.png").stat().st_size > 0 and "pyarrow" in (out / "rewrite.md").read_text()


def test_manifests_benchmark_harness(tmp_path):
    """A short ``python -m benchmarks manifests``: each table has as many manifests as commits, the merge
    leaves fewer over the same data files, and JSON, plot and summary are written."""
    out = tmp_path / "out"
    run = investigation(
        "manifests",
        "--state-dir",
        str(tmp_path / "state"),
        "--out",
        str(out),
        "--rows",
        "3000",
        "--manifests",
        "2,6",
        "--lookups",
        "5",
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = orjson.loads((out / "manifests.json").read_bytes())
    assert [p["manifests"] for p in results["series"]] == [2, 6]
    for point in results["series"]:
        assert point["merged_manifests"] == 1 and len(point["lookup_ms"]) == len(point["merged_lookup_ms"]) == 5
        assert point["data_files"] >= point["manifests"]
    assert (out / "manifests.png").stat().st_size > 0 and "| 6 |" in (out / "manifests.md").read_text()


def test_manifest_merging_benchmark_harness(tmp_path):
    """A short ``python -m benchmarks manifest-merging``: every writer commit timed, merging on every
    commit (min-count 2) leaves one data and one delete manifest where 8 leaves the commits' own,
    and JSON, plot and summary are written."""
    out = tmp_path / "out"
    run = investigation(
        "manifest-merging",
        "--state-dir",
        str(tmp_path / "state"),
        "--out",
        str(out),
        "--live-files",
        "300",
        "--min-counts",
        "2,8",
        "--commits",
        "4",
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = orjson.loads((out / "manifest-merging.json").read_bytes())
    points = {p["min_count_to_merge"]: p for p in results["series"]}
    assert sorted(points) == [2, 8] and all(len(p["commit_ms"]) == 4 and p["live_files"] == 300 for p in points.values())
    assert points[2]["manifests_after"] == 2 and points[8]["manifests_after"] == 1 + 4 + 4
    assert points[2]["manifest_bytes_after"] > 0
    assert (out / "manifest-merging.png").stat().st_size > 0 and "| 300 | 8 |" in (out / "manifest-merging.md").read_text()


def test_global_deletes_benchmark_harness(tmp_path):
    """Reads timed on both snapshots, resolutions timed, the table equal to the stream's final
    state (the run fails otherwise), JSON, plot and summary written."""
    out = tmp_path / "out"
    run = investigation(
        "global-deletes",
        *("--state-dir", str(tmp_path / "state"), "--out", str(out)),
        *("--rows", "3000", "--changes", "100", "--batches", "2", "--repeats", "1", "--lookups", "2"),
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = orjson.loads((out / "global-deletes.json").read_bytes())
    assert results["all_at_once"]["global_delete_files"] == 2 and len(results["per_batch"]) == 2
    assert all(len(results["unresolved_ms"][q]) == len(results["resolved_ms"][q]) > 0 for q in ("count", "aggregate", "lookup"))
    assert (out / "global-deletes.png").stat().st_size > 0 and "unresolved / resolved" in (out / "global-deletes.md").read_text()


def test_scale_benchmark_harness(tmp_path):
    """Two table shapes built, every step timed on each, the file counts the writer implies
    (a data and an equality-delete file per partition and batch), JSON, plot and summary written."""
    out = tmp_path / "out"
    run = investigation(
        "scale",
        *("--state-dir", str(tmp_path / "state"), "--out", str(out)),
        *("--partitions", "3,6", "--batches", "2", "--repeats", "1"),
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = orjson.loads((out / "scale.json").read_bytes())
    assert [(p["partitions"], p["files"]) for p in results["series"]] == [(3, 12), (6, 24)]
    for point in results["series"]:
        assert all(
            len(point["costs"][step]["seconds"]) == 1 for step in ("reconcile", "re-reconcile", "decision", "status", "listing")
        )
    assert (out / "scale.png").stat().st_size > 0 and "live files" in (out / "scale.md").read_text()


def test_jobs_benchmark_harness(tmp_path):
    """Both settings run on fresh tables, every partition compacted (to one file, every row kept,
    checked by the bench itself), in as many jobs as the setting implies; JSON, plot, summary."""
    out = tmp_path / "out"
    run = investigation(
        "jobs",
        *("--state-dir", str(tmp_path / "state"), "--out", str(out)),
        *("--partitions", "4", "--rows", "5", "--batches", "2", "--per-job", "1,4", "--repeats", "1"),
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = orjson.loads((out / "jobs.json").read_bytes())
    assert [(r["partitions_per_job"], r["jobs"], r["partitions_compacted"]) for r in results["runs"]] == [(1, 4, 4), (4, 1, 4)]
    assert (out / "jobs.png").stat().st_size > 0 and "partitions/min" in (out / "jobs.md").read_text()


def test_sorted_lookup_benchmark_harness(tmp_path):
    """Both tables compacted to a file a partition, which a lookup then reads alone, where each batch
    file admitted it before; the sorted table's files sorted by id; JSON, plot, summary."""
    out = tmp_path / "out"
    run = investigation(
        "sorted-lookup",
        *("--state-dir", str(tmp_path / "state"), "--out", str(out)),
        *("--partitions", "2", "--rows", "200", "--batches", "4", "--keys", "6", "--repeats", "1"),
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [result] = orjson.loads((out / "sorted-lookup.json").read_bytes())["runs"]
    assert result["every_file_sorted"]
    for kind in ("sorted", "unsorted"):
        before, after = result["lookups"][kind]["before"], result["lookups"][kind]["after"]
        assert (before["data_files"], after["data_files"]) == (8, 2), result
        assert before["files_per_lookup"] > 1 and after["files_per_lookup"] == 1, result
    assert (out / "sorted-lookup.png").stat().st_size > 0 and "files a lookup reads" in (out / "sorted-lookup.md").read_text()


def test_ingest_shape_benchmark_harness(tmp_path):
    """A batch-size point and fan-out points (three tables committed one by one and side by side),
    of the real connector's messages, each batch committed to every table it spans
    and each table checked against the rows its changes imply, with memory figures taken."""
    out = tmp_path / "out"
    run = investigation(
        "ingest-shape",
        *("--state-dir", str(tmp_path / "state"), "--out", str(out), "--shape", "connector"),
        *("--changes", "300", "--tables", "1,3", "--commit-threads", "1,4", "--fan-out-changes", "300", "--batches", "1"),
        *("--job", "both"),
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = orjson.loads((out / "ingest-shape.json").read_bytes())
    points = results["batch_sizes"] + results["fan_out"]
    # Each point twice, the job in the driver and on Spark (the bench fails a batch that ran elsewhere).
    assert [(p["changes"], p["tables"], p["commit_threads"], p["job"]) for p in points] == [
        (300, tables, threads, job) for tables, threads in ((1, 4), (1, 4), (3, 1), (3, 4)) for job in ("driver", "spark")
    ]
    for point in points:
        assert len(point["seconds"]) == 1 and point["heap_peak_mib"] > 0
        assert point["job"] == "driver" or point["workers_peak_mib"] > 0  # a job in the driver starts no Python worker
        assert point["shape"] == "connector" and point["value_bytes"] > 300 * 2000  # about 3 KB a message
        # CPU time of the batch, the driver's Python and its JVM: some, and no more than the cores allow.
        (python_cpu,), (jvm_cpu,), (seconds,) = point["python_cpu_seconds"], point["jvm_cpu_seconds"], point["seconds"]
        assert python_cpu >= 0 and jvm_cpu >= 0 and python_cpu + jvm_cpu > 0
        assert python_cpu + jvm_cpu <= (os.cpu_count() or 1) * seconds + 0.05  # /proc counts in 10 ms ticks
        (jit_cpu,) = point["jit_cpu_seconds"]  # the JIT compilers' share of the JVM's
        assert 0 <= jit_cpu <= jvm_cpu + 0.05
    assert (out / "ingest-shape.png").stat().st_size > 0 and "records/s" in (out / "ingest-shape.md").read_text()


def test_ingest_benchmark_harness(tmp_path):
    """Both of icecdc's ways (the job in the driver, on Spark) and MERGE timed on every measured
    batch, the two tables equal at the end (the bench fails otherwise), JSON, plot and summary."""
    out = tmp_path / "out"
    run = icecdc_process(
        "bench",
        "ingest",
        *("--state-dir", str(tmp_path / "state"), "--out", str(out)),
        *("--sizes", "2000", "--changes", "200", "--batches", "1"),
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (size,) = orjson.loads((out / "ingest.json").read_bytes())["sizes"]
    assert (len(size["driver_seconds"]), len(size["spark_seconds"]), len(size["merge_seconds"])) == (1, 1, 2)
    assert (out / "ingest.png").stat().st_size > 0 and "MERGE / icecdc in the driver" in (out / "ingest.md").read_text()


@pytest.mark.parametrize("load", ["orders", "pgbench"])
def test_source_latency_benchmark_harness(tmp_path, load):
    """A short ``icecdc bench source-latency`` at a low rate, the sidecar beside the ingester, with
    each load: the tables end equal to PostgreSQL's rows (the run fails otherwise), every measured
    row version has a latency, reads are probed against a compacted copy, and JSON, plot and
    summary are written."""
    if postgres_missing():
        pytest.skip(postgres_missing())
    out = tmp_path / "out"
    rate, seconds = 50, 8
    run = icecdc_process(
        "bench",
        "source-latency",
        *("--load", load),
        *("--state-dir", str(tmp_path / "state"), "--out", str(out)),
        *("--rate", str(rate), "--seconds", str(seconds), "--warmup-seconds", "1", "--runs", "1"),
        *("--connections", "2", "--min-commit-interval", "1", "--probe-seconds", "3"),
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (result,) = orjson.loads((out / "source-latency.json").read_bytes())["runs"]
    assert result["rows_match"] and result["rows"] > 0
    if load == "orders":  # a paced load on a loaded machine may fall behind, never run ahead
        assert 0 < result["committed"] <= rate * seconds + rate // 100 + 1
    else:  # pgbench -R draws its transactions' start times at random, around the rate
        assert 0 < result["committed"] <= 2 * rate * seconds
        assert result["rows"] >= 100_000 + result["committed"], "scale 1's accounts, and a history row a transaction"
        assert "pgbench's mean transaction latency" in result["load_detail"]
    assert result["latencies"] and len(result["latencies"]) == len(result["committed_at"])
    assert all(latency > 0 for latency in result["latencies"]), "visible after the commit, never before"
    assert all(at >= 1 for at in result["committed_at"]), "the warm-up is not measured"
    assert result["snapshots"] >= 1
    # The sidecar ran beside the ingester, whose commits are counted.
    assert result["sidecar"] is not None and result["writer_commits"] >= 1
    assert result["write_amplification"] is not None and result["write_amplification"] >= 1
    # Each row's path in pieces, all known, adding up to its latency (the broker's and the snapshot's ms).
    path = [result["pieces"][p] for p in ("debezium", "kafka", "batch", "commit")]
    assert all(len(p) == len(result["latencies"]) and None not in p for p in path)
    for latency, *split in zip(result["latencies"], *path, strict=True):
        assert abs(sum(split) - latency) < 1e-6
    assert None not in result["pieces"]["visibility"] and min(result["pieces"]["visibility"]) >= 0
    # Reads probed while the load ran and once after catch-up, each ratio a plausible one of two
    # reads of the same rows (a wrong copy or a failed timing would be far off or 0).
    writing = [read["writing"] for read in result["reads"]]
    assert writing.count(True) >= 1 and writing[-1:] == [False] and writing.count(False) == 1
    assert all(0.1 < ratio < 20 for read in result["reads"] for ratio in read["ratios"].values()), result["reads"]
    assert (out / "source-latency.png").stat().st_size > 0
    summary = (out / "source-latency.md").read_text()
    assert "| 1 |" in summary and "Reads while writing were" in summary


def test_contention_benchmark_harness(tmp_path):
    """A short ``icecdc bench contention`` in its own process: every mode measured, every table
    equal to the workload's state (the run fails otherwise), JSON, plot and summary written."""
    out = tmp_path / "out"
    run = icecdc_process(
        "bench",
        "contention",
        "--state-dir",
        str(tmp_path / "state"),
        "--batches",
        "4",
        "--changes",
        "300",
        "--interval",
        "1",
        "--out",
        str(out),
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = orjson.loads((out / "contention.json").read_bytes())
    assert set(results["modes"]) == {"none", "naive", "coordinated", "unmerged"}
    for mode, measured in results["modes"].items():
        assert len(measured["commit_seconds"]) == 4 and measured["rows_match"] and not measured["writer_failures"], mode
    assert results["modes"]["none"]["compactor"] is None and results["modes"]["unmerged"]["compactor"] is None
    assert all(m["manifests"] > 0 for m in results["modes"].values())
    for mode in ("naive", "coordinated"):
        assert {"commit_attempts", "conflict_rate"} <= set(results["modes"][mode]["compactor"])
    assert (out / "contention.png").stat().st_size > 0
    assert "| coordinated |" in (out / "contention.md").read_text()


def test_writers_benchmark_harness(tmp_path):
    """A short ``icecdc bench writers``: a merge-on-read writer beside the sidecar in its own process,
    never refused, its table equal to its model, the reads after the writes measured, JSON, plot and
    summary written."""
    out = tmp_path / "out"
    run = icecdc_process(
        "bench",
        "writers",
        "--state-dir",
        str(tmp_path / "state"),
        "--writers",
        "merge-on-read",
        "--formats",
        "2",
        "--commits",
        "4",
        "--rows",
        "500",
        "--changes",
        "40",
        "--probe-seconds",
        "4",
        "--out",
        str(out),
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (case,) = orjson.loads((out / "writers.json").read_bytes())["cases"]
    assert case["commits"] == 6 and case["refused"] == [] and case["differences"] == []
    assert case["snapshots_changing_rows"] == [] and case["sidecar"] is not None
    # Four commits may end before the sidecar joins: the probe after the writes is always taken.
    assert case["reads"] and not case["reads"][-1]["writing"]
    assert (out / "writers.png").stat().st_size > 0
    assert "| merge-on-read v2 | 1 |" in (out / "writers.md").read_text()


def test_parse_benchmark_harness(tmp_path):
    """A short ``python -m benchmarks parse``: both paths measured on both message shapes (the bench checks
    that they give the same rows), JSON, plot and summary written."""
    out = tmp_path / "out"
    run = investigation("parse", "--state-dir", str(tmp_path / "state"), "--changes", "300", "--repeats", "2", "--out", str(out))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (out / "parse.json").stat().st_size > 0 and (out / "parse.png").stat().st_size > 0
    text = (out / "parse.md").read_text()
    assert all(f"| {shape} |" in text for shape in ("generator", "connector", "connector-pg-types")), text


def test_conversion_benchmark_harness(tmp_path):
    """A short ``python -m benchmarks conversion`` with its Spark way: every way converts exactly the
    batch's rows (the bench asserts it), JSON, plot and summary written."""
    out = tmp_path / "out"
    run = investigation(
        "conversion", "--state-dir", str(tmp_path / "state"), "--rows", "4000", "--files", "2",
        "--changes", "50", "--batches", "2", "--out", str(out), timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    runs = orjson.loads((out / "conversion.json").read_bytes())["runs"]
    assert set(runs) == {"reading keys", "key index", "reading keys, Spark job"}
    assert all(len(measured) == 2 and all(m["positions"] == 50 for m in measured) for measured in runs.values())
    assert (out / "conversion.png").stat().st_size > 0
