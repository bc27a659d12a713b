"""``icecdc bench source-latency``'s verdict follows from its own figures: the rate the table
followed and the latency's growth from the first third of a run to the last."""

from __future__ import annotations

from icecdc.bench.source_latency import FLAT_WITHIN, KEPT_RATE_SHARE, LatencyResults, RunResult, verdict


def run(number: int, *, committed: int = 60_000, seconds: float = 60.0, start: float = 3.3, end: float = 3.3, lag: float = 0.0):
    """A run whose rows' latency goes from ``start`` to ``end`` seconds over the run, and whose
    table falls ``lag`` seconds further behind by the end."""
    result = RunResult(number, 1_000, seconds, committed, committed)
    rows = 3_000
    for i in range(rows):
        at = 1 + (seconds - 1) * i / (rows - 1)
        share = i / (rows - 1)
        result.committed_at.append(at)
        result.latencies.append(start + (end - start) * share + lag * share)
    return result


def results(*runs: RunResult) -> LatencyResults:
    return LatencyResults("2 cores", 1_000, 60, 1, 1.0, 5.0, "icecdc's orders transactions on 8 connections", runs=list(runs))


def test_the_issues_run_kept_neither_the_rate_nor_a_flat_latency():
    """The run the bench once called kept and flat: the table fell behind, p50 rose 3.3 to 4.9 s."""
    behind = run(1, start=3.3, end=4.9)
    assert behind.pipeline_rate < KEPT_RATE_SHARE * 1_000 and not behind.kept_rate()
    assert behind.growth() > FLAT_WITHIN and not behind.stayed_flat()
    text = verdict(results(behind))
    assert "did not keep 1,000 transactions/s" in text and "did not stay flat" in text
    assert f"{behind.third(0):.2f} s to {behind.third(2):.2f} s, +" in text, "the figures it rests on"


def test_a_steady_delay_keeps_the_rate_and_stays_flat():
    steady = [run(1, start=1.5, end=1.6), run(2, committed=59_400, start=1.7, end=1.6)]
    assert all(r.kept_rate() and r.stayed_flat() for r in steady)
    text = verdict(results(*steady))
    assert text.startswith("The pipeline kept 1,000 transactions/s") and "The latency stayed flat" in text


def test_each_half_of_the_verdict_is_its_own():
    """PostgreSQL short of the rate with a flat latency; the rate kept with a latency that fell."""
    slow_source = run(1, committed=54_000, start=1.5, end=1.5)
    assert not slow_source.kept_rate() and slow_source.stayed_flat()
    text = verdict(results(slow_source))
    assert "did not keep" in text and "PostgreSQL 900" in text and "The latency stayed flat" in text
    falling = run(1, start=3.0, end=1.5)
    assert falling.kept_rate() and not falling.stayed_flat(), "flat is within the bound either way"
    assert "did not stay flat" in (text := verdict(results(falling))) and "2.75 s to 1.75 s, -36%" in text


def test_the_pieces_of_a_row_add_up_to_its_latency():
    """Moments as a run sees them (epoch seconds, the broker's and snapshot's in whole ms): the
    path's pieces add up to the snapshot's commit minus the stamp, and visibility follows it."""
    from icecdc.bench.source_latency import PATH, Moments, Piece, pieces

    stamped = 1_800_000_000.123456
    moments = Moments(stamped, 1_800_000_000.401, 1_800_000_001.052, 1_800_000_001.9, 1_800_000_002.117, 1_800_000_002.2)
    split = pieces(moments)
    assert abs(sum(split[p] for p in PATH) - (moments.committed - stamped)) < 1e-6
    assert split[Piece.VISIBILITY] == moments.seen - moments.committed
    assert all(seconds >= 0 for seconds in split.values())


def test_a_runs_pieces_leave_out_what_is_not_known():
    from icecdc.bench.source_latency import Piece, pieces_summary

    result = run(1)
    for piece in Piece:
        result.pieces[piece.value] = [0.5] * (len(result.latencies) - 1) + [None]
    assert result.piece(Piece.KAFKA, 0.5) == 0.5
    assert "visibility" in pieces_summary(results(result))


def test_a_stamped_row_is_visible_when_its_batch_committed_every_table():
    """pgbench's rows are read from history, but a transaction is in place once its batch
    committed the last of the load's tables, and seen once a reader saw every one of them; a
    table not of the load does not count."""
    from icecdc.bench.source_latency import PathTimes
    from icecdc.ingest.writer import BatchResult, BatchTiming
    from icecdc.jvm.tables import CommittedSnapshot

    def snapshot(snapshot_id: int, at: float) -> CommittedSnapshot:
        return CommittedSnapshot(snapshot_id, None, 1, int(at * 1000), "overwrite")

    commits = {"history": snapshot(7, 100.0), "accounts": snapshot(8, 100.4), "other": snapshot(9, 105.0)}
    batch = BatchTiming(99.0, BatchResult("b1", 10, 0, commits, 1.2, commits_wall_seconds=0.5))
    path = PathTimes([batch], {7: 100.6, 8: 100.9}, {("k",): 99.5}, "history", ["accounts", "history"])
    assert path.visible_at(7, 100.0) == 100.4
    assert path.visible_at(6, 90.0) == 90.0, "a snapshot of no known batch: its own commit"
    moments = path.moments(7, 100.4, ("k",), 98.0)
    assert (moments.produced, moments.polled, moments.commits_started, moments.seen) == (99.5, 99.0, 99.7, 100.9)
    path.seen.pop(8)
    assert path.moments(7, 100.4, ("k",), 98.0).seen != path.moments(7, 100.4, ("k",), 98.0).seen, "nan: not all seen"
