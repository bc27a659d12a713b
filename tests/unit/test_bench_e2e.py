"""The pure parts of ``icecdc bench e2e``: the stream's shape, Amoro's trigger, the settle delay, and
whether the sidecar's table is portable (equality-delete ages, readers' exactness, write amplification)."""

import random
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from icecdc.bench.e2e.probe import ProbePoint, ReaderProbe, on_portable
from icecdc.bench.e2e.results import FINAL, WRITING, E2EResults, latency_ratio, portability
from icecdc.bench.e2e.snapshots import (
    SnapshotLog,
    amplification_between,
    amplification_so_far,
    bytes_added_between,
    settle_to_compacted,
)
from icecdc.bench.e2e.stream import (
    Workload,
    batch_sizes,
    change_batches,
    generate,
    large_workload,
    load_chunks,
    new_orders,
    settle_settings,
)
from icecdc.bench.e2e.summaries import portability_summary
from icecdc.bench.portability import (
    AgeSummary,
    KeyDigest,
    ReadOutcome,
    digest_exactness,
    exact_share,
    exactness,
    oldest_equality_delete_age,
    summarise_ages,
)
from icecdc.bench.strategies import amoro_minor_due, cron_options, cron_period, strategy_names
from icecdc.domain.files import DataFileContent
from icecdc.domain.sourcespec import BeforeImage


def test_batch_sizes_are_bursty_and_repeatable():
    workload = Workload(changes=100, burst_share=0.25, burst_factor=4)
    sizes = batch_sizes(400, workload)
    assert sizes == batch_sizes(400, workload)
    assert set(sizes) == {100, 400}
    assert 0.15 < sizes.count(400) / len(sizes) < 0.35


def test_stream_moves_the_hot_day_and_keeps_late_changes():
    stream, orders = generate(12, Workload(keys=500, changes=50, batches_per_day=3, late_share=0.2))
    assert len(stream) == 13 and len(stream[0]) == 500
    assert {r["updated_at"] // 86_400_000_000 for r in orders.rows.values()} >= {
        20089,
        20090,
        20091,
        20092,
    }  # days 0-3 after 2025-01-01


def test_amoro_minor_trigger_counts_small_files_and_equality_deletes():
    assert not amoro_minor_due(small_files=6, equality_delete_files=5)
    assert amoro_minor_due(small_files=6, equality_delete_files=6)
    assert amoro_minor_due(small_files=12, equality_delete_files=0)


def test_settle_to_compacted_counts_partitions_left_with_equality_deletes():
    log = SnapshotLog(
        ingested_bytes=0,
        rewritten_bytes=0,
        compaction_commits=0,
        live_equality_deletes=set(),
        writes={
            ("eu", 1): [(10.0, True), (20.0, True)],  # settled with deletes, compacted at 35
            ("us", 1): [(10.0, False)],  # last write added no delete: nothing to answer
            ("eu", 2): [(95.0, True)],  # still hot when the writes ended
            ("us", 2): [(30.0, True)],
        },  # settled, never compacted
        maintained={("eu", 1): [15.0, 35.0, 50.0], ("eu", 2): [96.0]},
    )
    result = settle_to_compacted(log, writes_ended=100.0, settle_seconds=10.0)
    assert result.settled_partitions == 2 and result.compacted == 1
    assert result.median_seconds == pytest.approx(15.0)


def test_latency_ratio_by_phase_against_the_compacted_copy_of_the_same_probe():
    def series(*points: tuple[float, float]) -> list[ProbePoint]:
        return [ProbePoint(t, t + 20, v, 0, 0, 0, 0, 0, 0, 0, 0) for t, v in points]

    results = E2EResults("m", 1, 1, 1, 1, [], 1, 1, 1, 1, Workload(), writes_ended_t=100.0)
    results.strategies["none"] = SimpleNamespace(series=series((20, 10), (50, 30), (70, 40), (90, 50), (130, 70)))
    results.reference = series((20, 10), (50, 10), (70, 10), (90, 10), (130, 10))
    # The first half of the writes is the tables filling up; a probe that ran past the last
    # batch is in neither phase; the final probe is the last one.
    assert latency_ratio(results, "none", "count_ms", WRITING) == pytest.approx(3.5)
    assert latency_ratio(results, "none", "count_ms", FINAL) == pytest.approx(7.0)
    results.writes_ended_t = 60.0
    assert latency_ratio(results, "none", "count_ms", WRITING) is None


def test_settle_windows_follow_the_batch_cadence():
    settle = settle_settings(10)
    assert (settle["min_seconds"], settle["initial_seconds"], settle["max_seconds"]) == (15, 30, 60)  # the 10 s default
    assert settle_settings(5)["max_seconds"] == 30


def test_strategy_names_one_cron_per_period():
    names = strategy_names([30, 120.5])
    assert names == ("none", "cron-30s", "cron-120.5s", "threshold", "icecdc")
    assert [cron_period(n) for n in names] == [None, 30.0, 120.5, None, None]


def test_oldest_equality_delete_age_from_the_snapshots_that_added_the_live_files():
    committed = {1: 10_000, 2: 14_000, 3: 19_000}
    assert oldest_equality_delete_age([3, 2, 3], committed, now_ms=20_000) == pytest.approx(6.0)
    assert oldest_equality_delete_age([], committed, now_ms=20_000) is None  # none live
    # A snapshot expiry removed counts as old as the oldest one still listed: a lower bound.
    assert oldest_equality_delete_age([99, 3], committed, now_ms=20_000) == pytest.approx(10.0)
    assert oldest_equality_delete_age([None], committed, now_ms=20_000) == pytest.approx(10.0)


def test_age_samples_summarised_with_the_share_that_had_none_live():
    ages = [None, None, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 40.0]
    summary = summarise_ages(ages)
    assert (summary.samples, summary.none_share, summary.max_seconds) == (10, 0.2, 40.0)
    # Nearest-rank percentiles (bench.report), a sample with none live counting as 0 s.
    assert summary.p50_seconds == pytest.approx(3.0) and summary.p95_seconds == pytest.approx(40.0)
    assert summarise_ages([]) == AgeSummary(0, None, None, None, None)


def test_a_read_is_exact_only_with_the_models_rows_each_once():
    model = [(1, "eu"), (2, "us")]
    assert exactness(model, [(2, "us"), (1, "eu")]) is ReadOutcome.EXACT
    assert exactness(model, [(1, "eu"), (2, "us"), (2, "eu")]) is ReadOutcome.WRONG  # a delete not applied
    assert exactness(model, [(1, "eu"), (1, "eu"), (2, "us")]) is ReadOutcome.WRONG  # a key read twice
    assert exactness(model, None) is ReadOutcome.REFUSED
    digest = KeyDigest.of([1, 2, 3])
    assert digest_exactness(digest, KeyDigest.of([3, 1, 2])) is ReadOutcome.EXACT
    assert digest_exactness(digest, KeyDigest.of([1, 2, 3, 3])) is ReadOutcome.WRONG  # an old version read too
    assert digest_exactness(digest, KeyDigest.of([1, 2])) is ReadOutcome.WRONG
    assert digest_exactness(digest, None) is ReadOutcome.REFUSED
    assert exact_share([ReadOutcome.EXACT, ReadOutcome.REFUSED, ReadOutcome.EXACT, ReadOutcome.EXACT]) == 0.75
    assert exact_share([]) is None


def test_portability_splits_samples_and_probes_at_the_last_batch():
    results = E2EResults("m", 1, 1, 1, 1, [], 1, 1, 1, 1, Workload(), writes_ended_t=100.0)
    results.equality_delete_ages = [(50.0, 8.0), (99.0, None), (120.0, None)]
    exact, refused = ReadOutcome.EXACT, ReadOutcome.REFUSED
    results.readers = [
        ReaderProbe(40.0, 1, {"pyiceberg": refused, "duckdb": exact}, {}),
        ReaderProbe(90.0, 2, {"pyiceberg": exact, "duckdb": exact}, {}),
        ReaderProbe(130.0, 3, {"pyiceberg": exact, "duckdb": exact}, {}),
        ReaderProbe(95.0, 4, {"pyiceberg": refused, on_portable("pyiceberg"): exact}, {}, portable_seconds_behind=3.5),
    ]
    results.reference = [ProbePoint(45.0, 60.0, *[0] * 9)]  # a probe from 45 to 60 s: the sample at 50 in it
    report = portability(results)
    assert report.oldest_equality_delete_writing.samples == 2 and report.oldest_equality_delete_writing.none_share == 0.5
    outside = report.oldest_equality_delete_outside_probes
    assert outside is not None and outside.samples == 1 and outside.none_share == 1.0
    assert report.oldest_equality_delete_after.none_share == 1.0
    assert report.exact_writing == {"duckdb": 1.0, "pyiceberg": 1 / 3, on_portable("pyiceberg"): 1.0}
    assert report.exact_after == {"duckdb": 1.0, "pyiceberg": 1.0, on_portable("pyiceberg"): None}
    results.portability = report
    writing = next(line for line in portability_summary(results).splitlines() if line.startswith("| writing |"))
    assert "| 33% | 100% | 100% | - | 3.5 / 3.5 | 3 |" in writing, writing


def test_a_key_only_source_reports_its_global_deletes_apart_and_the_cron_keeps_them():
    workload = Workload(partitioning="region", before_image=BeforeImage.KEY)
    results = E2EResults("m", 1, 1, 1, 1, [], 1, 1, 1, 1, workload, writes_ended_t=100.0)
    results.equality_delete_ages = [(50.0, 8.0), (90.0, 3.0), (120.0, None)]
    results.global_delete_ages = [(50.0, 8.0), (90.0, None), (120.0, None)]
    report = portability(results)
    writing, after = report.oldest_global_delete_writing, report.oldest_global_delete_after
    assert writing is not None and (writing.samples, writing.none_share, writing.max_seconds) == (2, 0.5, 8.0)
    assert after is not None and after.none_share == 1.0
    results.portability = report
    rows = [line.split(" | ")[0] for line in portability_summary(results).splitlines() if line.startswith("| ")]
    assert rows[1:] == [
        "| writing",
        "| writing, outside the probes",
        "| writing, global deletes only",
        "| after",
        "| after, global deletes only",
    ]
    # A source of whole before-images makes no global delete: no such rows.
    assert portability(replace(results, workload=Workload())).oldest_global_delete_writing is None
    # Iceberg's remove-dangling-deletes would drop the global deletes the writer commits meanwhile.
    assert "remove-dangling-deletes" not in cron_options(BeforeImage.KEY)
    assert cron_options(BeforeImage.FULL)["remove-dangling-deletes"] == "true"


def test_a_staged_run_reports_how_far_main_was_behind_its_branch_while_writing():
    results = E2EResults("m", 1, 1, 1, 1, [], 1, 1, 1, 1, Workload(), writes_ended_t=100.0, staging_branch="staged")
    results.main_behind = [(10.0, None), (50.0, 2.0), (99.0, 0.0), (120.0, 9.0)]  # no main yet, then two, then after
    report = portability(results)
    assert report.main_behind_writing is not None and report.main_behind_writing.samples == 3
    assert report.main_behind_writing.max_seconds == 2.0
    results.portability = report
    assert "Staged on branch staged: readers read main" in portability_summary(results)
    assert portability(replace(results, staging_branch=None)).main_behind_writing is None


def added_log(**added: Any) -> SnapshotLog:
    """A snapshot log of only what its snapshots added."""
    return SnapshotLog(
        ingested_bytes=0, rewritten_bytes=0, compaction_commits=0, writes={}, maintained={}, live_equality_deletes=set(), **added
    )


def test_write_amplification_over_the_writing_phase_only():
    log = added_log(added=[(5.0, 1000, False), (12.0, 10, False), (15.0, 25, True), (18.0, 10, False), (30.0, 500, True)])
    # The initial load (t=5) and the drain's rewrite (t=30) are outside the window.
    assert amplification_between(log, start=10.0, end=20.0) == pytest.approx(45 / 20)
    assert amplification_between(log, start=40.0, end=50.0) is None
    # So far, after each commit in the window once the writer has committed: the total is the last.
    assert amplification_so_far(log, start=10.0, end=20.0) == [(2.0, 1.0), (5.0, 3.5), (8.0, pytest.approx(45 / 20))]


def test_the_bytes_of_the_writing_phase_by_who_added_them_and_what_they_hold():
    log = added_log(
        added_files=[
            (5.0, False, DataFileContent.DATA, 1000),  # the initial load: before the window
            (12.0, False, DataFileContent.DATA, 10),
            (12.0, False, DataFileContent.EQUALITY_DELETES, 3),
            (15.0, True, DataFileContent.POSITION_DELETES, 4),
            (16.0, True, DataFileContent.DATA, 20),
            (18.0, False, DataFileContent.DATA, 10),
            (30.0, True, DataFileContent.DATA, 500),  # the drain: after it
        ],
    )
    assert bytes_added_between(log, start=10.0, end=20.0) == {
        "sidecar data": 20,
        "sidecar position deletes": 4,
        "writer data": 20,
        "writer equality deletes": 3,
    }


def test_the_large_workload_keeps_most_notes_and_writes_every_bucket():
    workload = large_workload(rows=300, changes=100)
    stream, orders = generate(3, workload)
    assert len(stream[0]) == 300 and workload.partition_by == ["bucket(16, id)"]
    assert all(len(row["note"]) == 400 for row in orders.rows.values())
    assert large_workload(rows=300, buckets=2).partition_by == ["bucket(2, id)"]
    # Most updates keep the note of the row they change.
    updates = [v for v in (orjson.loads(value) for batch in stream[1:] for _, value in batch) if v["op"] == "u"]
    kept = sum(u["before"]["note"] == u["after"]["note"] for u in updates)
    assert updates and kept / len(updates) > 0.75


def test_the_run_makes_the_load_in_chunks_and_the_same_stream_as_in_memory(monkeypatch):
    """At users' sizes the load is made as it is written; the stream is the one ``generate``
    holds in memory, record for record."""
    monkeypatch.setattr("icecdc.bench.e2e.stream.LOAD_CHUNK_ROWS", 120)
    workload = large_workload(rows=300, changes=50)
    orders = new_orders(workload)
    chunks = list(load_chunks(orders, workload.keys))
    assert [len(c) for c in chunks] == [120, 120, 60]
    stream, in_memory = generate(4, workload)
    assert [[r for c in chunks for r in c], *change_batches(orders, 4, workload)] == stream
    assert orders.rows == in_memory.rows


def test_lookup_keys_are_distinct_keys_of_the_rows_whether_few_or_many():
    _, orders = generate(2, Workload(keys=2000, changes=100))
    for count in (5, 900, 5000):
        keys = orders.sample_keys(random.Random(1), count)
        assert len(keys) == len(set(keys)) == min(count, len(orders.rows)) and set(keys) <= set(orders.rows)
    assert orders.sample_keys(random.Random(1), 5) == orders.sample_keys(random.Random(1), 5)
