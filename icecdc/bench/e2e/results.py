"""The e2e bench's results, and what is read from them: latency ratios by phase, portability."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from icecdc.bench.e2e.probe import ProbePoint, ReaderProbe
from icecdc.bench.e2e.snapshots import SettleToCompacted
from icecdc.bench.e2e.stream import Workload
from icecdc.bench.portability import AgeSummary, exact_share, summarise_ages
from icecdc.bench.strategies import StrategyCounts
from icecdc.domain.sourcespec import BeforeImage


@dataclass(frozen=True)
class Portability:
    """How portable the sidecar's table was, while writing and after."""

    oldest_equality_delete_writing: AgeSummary
    oldest_equality_delete_after: AgeSummary
    exact_writing: dict[str, float | None]  # reader -> share of probes read exactly
    exact_after: dict[str, float | None]
    # While writing, the samples taken outside every probe (a probe copies the table, on the same cores).
    oldest_equality_delete_outside_probes: AgeSummary | None = None
    # A staged table: how far main was behind the staging branch's head while writing.
    main_behind_writing: AgeSummary | None = None
    # A source whose before-images hold the key only: the oldest live global delete.
    oldest_global_delete_writing: AgeSummary | None = None
    oldest_global_delete_after: AgeSummary | None = None


@dataclass(frozen=True)
class StrategyResult:
    series: list[ProbePoint]
    commit_seconds: list[tuple[float, float]]  # (seconds into the run, the writer's commit latency)
    writer_failures: list[str]
    rows_match: bool
    ingested_bytes: int
    rewritten_bytes: int
    write_amplification: float
    # (maintenance + writer bytes) / writer bytes, from the first change batch to the last
    writing_amplification: float | None
    compaction_commits: int
    maintenance: StrategyCounts
    writer_commit_p50: float
    writer_commit_p99: float
    writer_commit_max: float
    settle_to_compacted: SettleToCompacted
    settled_partitions_with_equality_deletes: int
    # (seconds since the first batch, ``writing_amplification`` so far), after each commit
    amplification_so_far: list[tuple[float, float]] = field(default_factory=list)
    # the bytes behind ``writing_amplification``: ``snapshots.bytes_added_between``
    bytes_added_writing: dict[str, int] = field(default_factory=dict)


@dataclass
class E2EResults:
    machine: str
    minutes: float
    batches: int
    batch_seconds: float
    probe_seconds: float
    cron_seconds: list[float]
    drain_seconds: float
    drain_max_seconds: float
    lookups: int
    repeats: int
    workload: Workload
    format_version: int = 2
    hot_read_budget: float | None = None
    strategies: dict[str, StrategyResult] = field(default_factory=dict)
    reference: list[ProbePoint] = field(default_factory=list)  # the compacted copy, probe by probe
    writes_ended_t: float = 0.0
    drained_seconds: float = 0.0  # how long the drain lasted
    load_compacted_seconds: float | None = None  # how long the sidecar took to compact a load of many commits
    workload_name: str = "small"
    age_sample_seconds: float = 2.0
    # (seconds into the run, age of the sidecar table's oldest live equality delete or None)
    equality_delete_ages: list[tuple[float, float | None]] = field(default_factory=list)
    # the same of its oldest live global delete, sampled with it
    global_delete_ages: list[tuple[float, float | None]] = field(default_factory=list)
    staging_branch: str | None = None
    table_properties: dict[str, str] = field(default_factory=dict)  # every table's, over icecdc's
    # (seconds into the run, how far main was behind the staging branch's head; None: no main yet)
    main_behind: list[tuple[float, float | None]] = field(default_factory=list)
    readers: list[ReaderProbe] = field(default_factory=list)
    portability: Portability | None = None


WRITING, FINAL = "writing", "final"


def in_phase(point: ProbePoint, writes_ended_t: float, phase: str, final_t: float) -> bool:
    """``writing``: probes wholly in the second half of the writes; ``final``: the last probe."""
    if phase == FINAL:
        return point.t >= final_t
    return point.t >= writes_ended_t / 2 and point.t_end <= writes_ended_t


def latency_ratio(results: E2EResults, strategy: str, metric: str, phase: str) -> float | None:
    """Median over a phase's probes of a strategy's latency over the compacted copy's (None: no probe)."""
    series = results.strategies[strategy].series
    pairs = zip(series, results.reference, strict=True)
    ratios = [
        getattr(m, metric) / getattr(r, metric) for m, r in pairs if in_phase(m, results.writes_ended_t, phase, series[-1].t)
    ]
    return statistics.median(ratios) if ratios else None


def portability(results: E2EResults) -> Portability:
    """The sidecar table's age samples and reader probes, while writing and after."""
    ended, probes = results.writes_ended_t, results.readers
    readers = sorted({r for p in probes for r in p.outcomes})

    def shares(phase: list[ReaderProbe]) -> dict[str, float | None]:
        return {r: exact_share([p.outcomes[r] for p in phase if r in p.outcomes]) for r in readers}

    probing = [(p.t, p.t_end) for p in results.reference]
    global_ages, key_only = results.global_delete_ages, results.workload.before_image is BeforeImage.KEY
    return Portability(
        oldest_equality_delete_writing=summarise_ages([a for t, a in results.equality_delete_ages if t <= ended]),
        oldest_equality_delete_after=summarise_ages([a for t, a in results.equality_delete_ages if t > ended]),
        exact_writing=shares([p for p in probes if p.t <= ended]),
        exact_after=shares([p for p in probes if p.t > ended]),
        oldest_equality_delete_outside_probes=summarise_ages(
            [a for t, a in results.equality_delete_ages if t <= ended and not any(s <= t <= e for s, e in probing)]
        ),
        main_behind_writing=summarise_ages([b for t, b in results.main_behind if t <= ended]) if results.staging_branch else None,
        oldest_global_delete_writing=summarise_ages([a for t, a in global_ages if t <= ended]) if key_only else None,
        oldest_global_delete_after=summarise_ages([a for t, a in global_ages if t > ended]) if key_only else None,
    )
