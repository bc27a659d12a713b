"""The pure parts of ``icecdc bench e2e``: the stream's shape, Amoro's trigger, the settle delay."""

from types import SimpleNamespace

import pytest

from icecdc.bench.e2e import (
    FINAL,
    WRITING,
    E2EResults,
    ProbePoint,
    SnapshotLog,
    Workload,
    batch_sizes,
    generate,
    latency_ratio,
    settle_settings,
    settle_to_compacted,
)
from icecdc.bench.strategies import amoro_minor_due, cron_period, strategy_names


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
