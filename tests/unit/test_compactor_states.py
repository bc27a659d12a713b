"""The tracker, the outcome rules and the turn together, as a state machine: commit events for
random partitions (and a table's global deletes), metadata reads, turns that pick work and begin
its jobs, jobs that end in every outcome, time passing. Beside the tracker runs a model of what
``outcomes`` promises (the write each partition's answer is for, its failures in a row, the
window its retry falls in), and after every step the tracker must agree with it:

- never two jobs on one partition at once, and only a partition under a job is compacting;
- a write that was answered stays answered (no work is due for it) until the next write to its
  partition; work done while hot holds only until the partition settles;
- back-off grows with each failure in a row, within ``retry_max_seconds``, resets when an
  attempt answers the partition, and gives up after ``max_attempts``; a fenced attempt changes
  nothing; a backing-off partition is not due before its retry time;
- every partition that needs work and is not answered is either due or waiting, never both;
- reading (``phase_of``, ``candidates``, ``waiting``) changes nothing;
- a metadata read forgets the partitions it does not list, except those under a job.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from dataclasses import dataclass

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from icecdc.compactor import scheduler
from icecdc.compactor.outcomes import BackingOff, Compacting, Outcome
from icecdc.compactor.policy import PartitionStats, global_work, last_pack, needed_work
from icecdc.compactor.settle import Phase, phase, quiet_windows
from icecdc.compactor.tracker import GLOBAL_DELETES_PATH, PartitionMetadata, PartitionPhase, PartitionTracker, TrackedPartition
from icecdc.domain.events import CommitEvent, PartitionDelta
from icecdc.runtime.config import CompactorConfig, SettleConfig

SETTINGS = CompactorConfig(
    # A batch's files (1 kB each) are small; a partition's data fits one job with others.
    target_file_size_bytes=1024 * 1024,
    min_small_files=2,
    partitions_per_job=3,
    # A hot partition with one equality-delete file (cost 1 + 3) is over its budget of 2.
    hot_read_budget=2,
    # Back-off of 2 s after one failure, 4 s capped to 3 s after two, given up at the third: the
    # whole cycle fits in the steps of one example, as does a partition settling.
    max_attempts=3,
    retry_base_seconds=2,
    retry_max_seconds=3,
    settle=SettleConfig(cadence_multiple=3, min_seconds=2, max_seconds=30, initial_seconds=3),
)
TABLES = ("db.a", "db.b")
PAUSES = (0.0, 1.0, 2.0, 3.0, 5.0, 10.0, 40.0)  # seconds between two steps of the sidecar
Key = tuple[str, str]


@dataclass(frozen=True)
class Commit:
    table: str
    paths: tuple[str, ...]  # none (only global deletes, or nothing), one or two
    data_files: int  # a partition
    equality_delete_files: int  # a partition
    global_delete_files: int
    lag: float  # seconds: a late event, older than the last one


COMMITS = [
    Commit(*c)
    for c in itertools.product(
        TABLES,
        (("p=1",), ("p=2",), ("p=3",), ("p=1", "p=2"), ("p=2", "p=3"), ()),
        (1, 3),
        (0, 1),
        (0, 0, 0, 1),
        (0.0, 0.0, 0.0, 4.0),
    )
]


@dataclass(frozen=True)
class JobEnd:
    which: int  # of the jobs under way (modulo their number)
    outcome: Outcome
    nothing_to_do: int  # a bit a partition of the job: skipped at its starting snapshot, whatever the job's end
    seconds: float  # how long it ran


JOB_ENDS = [
    JobEnd(*e)
    for e in itertools.product(
        range(3),
        # Failures twice as often as the others: three in a row give a partition up.
        (Outcome.COMMITTED, Outcome.SKIPPED, Outcome.CONFLICT, Outcome.FAILED, Outcome.FENCED, Outcome.CONFLICT, Outcome.FAILED),
        range(8),
        (1.0, 3.0, 10.0),
    )
]


@dataclass(frozen=True)
class MetadataRead:
    table: str
    listing: int  # a bit a tracked partition of the table (by path): the ones it lists
    compacted: bool  # whether it finds them compacted, or as the commit events left them


METADATA_READS = [MetadataRead(*r) for r in itertools.product(TABLES, range(16), (False, True))]


@dataclass
class Expected:
    """What the outcome rules say of one partition, from the attempts it has seen."""

    failures: int = 0  # conflicts and failures in a row
    # The write an attempt answered, whether as hot work, and whether as the last pack.
    answer: tuple[float, bool, bool] | None = None
    failed_at: float | None = None  # when the last of them ended


@dataclass(frozen=True)
class Job:
    started: float
    # (partition, the write it answers, hot, whether it answers it: not the portability target's)
    partitions: tuple[tuple[Key, float | None, bool, bool, bool], ...]


class TrackerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tracker = PartitionTracker(SETTINGS)
        self.now = 1_000.0
        self.sequence = 0
        self.rng = random.Random(0)
        self.jobs: list[Job] = []
        self.expected: dict[Key, Expected] = {}

    # ---- what happens ----

    # Each rule draws one value (a step costs Hypothesis about a draw a value, and a thousand
    # examples must take seconds): one of every combination, simplest first.
    @rule(commit=st.sampled_from(COMMITS))
    def write(self, commit: Commit) -> None:
        self.sequence += 1
        table, paths, data_files, deletes, global_deletes, lag = dataclasses.astuple(commit)
        deltas = [
            PartitionDelta(
                {"p": path},
                path,
                0,
                data_files=data_files,
                data_bytes=1000 * data_files,
                data_records=10 * data_files,
                equality_delete_files=deletes,
                equality_delete_records=deletes,
            )
            for path in paths
        ]
        at_ms = int((self.now - lag) * 1000)
        self.tracker.on_commit(
            CommitEvent(
                table,
                self.sequence,
                None,
                self.sequence,
                at_ms,
                "overwrite",
                "w",
                None,
                {},
                deltas,
                global_delete_files=global_deletes,
                global_delete_records=global_deletes,
            )
        )
        for p in self.tracker:
            self.expected.setdefault(p.key, Expected())

    @rule(pause=st.sampled_from(PAUSES))
    def turn(self, pause: float) -> None:
        if (job := self._turn(pause)) is not None:
            self.jobs.append(job)

    @rule(pause=st.sampled_from(PAUSES), end=st.sampled_from(JOB_ENDS))
    def attempt(self, pause: float, end: JobEnd) -> None:
        """A turn whose job ends before the next step: a run of attempts on one partition (a
        retry after each failure, until given up) fits in the steps of one example."""
        if (job := self._turn(pause)) is not None:
            self._end(job, end)

    @rule(end=st.sampled_from(JOB_ENDS))
    def job_ends(self, end: JobEnd) -> None:
        if self.jobs:  # (no precondition: a disabled rule costs Hypothesis draws again)
            self._end(self.jobs.pop(end.which % len(self.jobs)), end)

    def _turn(self, pause: float) -> Job | None:
        """Time passes, then the sidecar picks its work and begins its job, if it has work."""
        self.now += pause
        step = scheduler.next_step(
            [], self.tracker.candidates(self.now), SETTINGS.partitions_per_job, SETTINGS.target_file_size_bytes
        )
        if step is None:
            return None
        assert isinstance(step, scheduler.Compact)
        job = step.candidates
        assert len({c.table for c in job}) == 1 and len(job) <= SETTINGS.partitions_per_job
        assert len(job) == 1 or all(scheduler.is_due_conversion(c) for c in job) or not any(c.hot for c in job), (
            "a hot partition gets a job of its own, but for the portability target's conversions due together"
        )
        begun = []
        for candidate in job:
            partition = self.tracker.get(candidate.table, candidate.partition_path)
            assert partition is not None
            answers = candidate.due_by is None
            compacting = self.tracker.begin(partition, hot=candidate.hot, answers=answers, last_pack=candidate.last_pack)
            assert compacting.attempt == self.expected[partition.key].failures + 1
            assert compacting.after_write == partition.cadence.last_write
            begun.append((partition.key, compacting.after_write, candidate.hot, answers, candidate.last_pack))
        return Job(self.now, tuple(begun))

    def _end(self, job: Job, end: JobEnd) -> None:
        _, outcome, nothing_to_do, seconds = dataclasses.astuple(end)
        self.now += seconds
        for i, (key, after_write, hot, answers, as_last_pack) in enumerate(job.partitions):
            ended = Outcome.SKIPPED if len(job.partitions) > 1 and nothing_to_do >> i & 1 else outcome
            partition = self.tracker.get(*key)
            assert partition is not None, "a partition under a job is not forgotten"
            resolution = self.tracker.resolve(partition, ended, "why", started=job.started, now=self.now, rng=self.rng)
            self._expect(key, ended, resolution.outcome, after_write, (hot, answers, as_last_pack))
            if resolution.outcome is Outcome.COMMITTED:
                assert partition.last_compaction == self.now

    def _expect(
        self, key: Key, ended: Outcome, reported: Outcome, after_write: float | None, kind: tuple[bool, bool, bool]
    ) -> None:
        hot, answers, last_pack = kind
        expected = self.expected[key]
        if ended is Outcome.FENCED:
            assert reported is Outcome.FENCED  # and nothing changes
            return
        if ended in (Outcome.CONFLICT, Outcome.FAILED) and expected.failures + 1 < SETTINGS.max_attempts:
            assert reported is ended
            expected.failures, expected.failed_at = expected.failures + 1, self.now
            return
        # Answered: done, nothing to do, or given up after max_attempts.
        given_up = ended in (Outcome.CONFLICT, Outcome.FAILED)
        assert reported is (Outcome.ABANDONED if given_up else ended)
        expected.failures, expected.failed_at = 0, None
        if answers:  # a conversion for the portability target leaves the answer as it was
            expected.answer = None if after_write is None else (after_write, hot, last_pack)

    @rule(read=st.sampled_from(METADATA_READS))
    def metadata_read(self, read: MetadataRead) -> None:
        table, listing, compacted = dataclasses.astuple(read)
        tracked = sorted((p for p in self.tracker if p.table == table), key=lambda p: p.path)
        listed = {p.path for i, p in enumerate(tracked) if listing >> i & 1}  # a bit a partition
        metadata = {
            p.path: PartitionMetadata(
                p.partition,
                _compacted(p) if compacted else p.stats,
                p.cadence.last_write,
                p.last_compaction,
                p.oldest_write,
            )
            for p in tracked
            if p.path in listed
        }
        self.tracker.on_metadata(table, self.sequence, metadata)
        kept = {p.path for p in self.tracker if p.table == table}
        assert kept == listed | {p.path for p in tracked if p.compacting}
        for p in tracked:
            if p.path not in kept:
                del self.expected[p.key]

    # ---- what must hold ----

    def _settled(self, partition: TrackedPartition) -> bool:
        return phase(partition.cadence, self.now, SETTINGS.settle) is Phase.SETTLED

    @invariant()
    def agrees_with_the_rules(self) -> None:
        # One invariant that reads the tracker once a step: the checks share what is due and waiting.
        before = [(p.key, p.state, p.last_compaction, p.stats) for p in self.tracker]
        due = {(c.table, c.partition_path) for c in self.tracker.candidates(self.now)}
        waiting = {p.key for p in self.tracker.waiting(self.now)}
        assert not due & waiting
        running = [key for job in self.jobs for key, *_ in job.partitions]
        assert len(running) == len(set(running)), "one job a partition at a time"
        assert not set(running) & due
        for p in self.tracker:
            assert p.compacting == (p.key in running)
            assert (self.tracker.phase_of(p, self.now) is PartitionPhase.COMPACTING) == p.compacting
            expected = self.expected[p.key]
            if isinstance(p.state, Compacting):
                assert p.state.attempt == expected.failures + 1
                continue
            settled = self._settled(p)
            self._answered_until_the_next_write(p, expected, settled, due | waiting)
            self._backoff_grows_within_its_bound_and_resets(p, expected, due)
            needs = global_work(p.stats, p.oldest_write, self.now) if p.is_global else needed_work(p.stats, SETTINGS)
            if needs is not None and not p.answered(settled):
                assert p.key in due | waiting, "work needed is due or waiting"
            if settled and p.packs_last and last_pack(p.stats, SETTINGS) and not p.answered(settled, last_pack_due=True):
                assert p.key in due | waiting, "a settled partition's last pack is due or waiting"
            portable_at = self.tracker.portability_due_at(p)
            if portable_at is not None:
                # Due once the share of the target is reached, hot or settled, answered or not.
                assert p.key in (due if portable_at <= self.now else due | waiting), "the portability target's conversion"
        assert [(p.key, p.state, p.last_compaction, p.stats) for p in self.tracker] == before, "reading changes nothing"

    def _answered_until_the_next_write(self, p: TrackedPartition, expected: Expected, settled: bool, wanted: set[Key]) -> None:
        answer = expected.answer
        quiet = quiet_windows(p.cadence, self.now, SETTINGS.settle)
        last_pack_due = settled and p.packs_last and quiet >= SETTINGS.last_pack_after_windows
        holds = (
            answer is not None
            and answer[0] == p.cadence.last_write
            and not (settled and answer[1])
            and not (last_pack_due and not answer[2])
        )
        assert p.answered(settled, last_pack_due) == holds, (p.state, p.cadence.last_write, settled, last_pack_due)
        # A settled partition's answer leaves its last pack to come, unless it was that or there is none to make.
        final = holds and (not settled or (answer is not None and answer[2]) or last_pack(p.stats, SETTINGS) is None)
        if final:  # unless the portability target asks for a conversion: that is not answered
            assert p.key not in wanted or self.tracker.portability_due_at(p) is not None

    def _backoff_grows_within_its_bound_and_resets(self, p: TrackedPartition, expected: Expected, due: set[Key]) -> None:
        assert isinstance(p.state, BackingOff) == (expected.failures > 0), (p.state, expected)
        if isinstance(p.state, BackingOff):
            assert p.state.failures == expected.failures < SETTINGS.max_attempts
            assert expected.failed_at is not None
            # base * 2^(n-1), capped, jittered between half and full.
            cap = min(SETTINGS.retry_max_seconds, SETTINGS.retry_base_seconds * 2.0 ** (expected.failures - 1))
            assert expected.failed_at + cap / 2 <= p.state.retry_at <= expected.failed_at + cap
            assert p.state.retry_at - expected.failed_at <= SETTINGS.retry_max_seconds
            if self.now < p.state.retry_at:
                assert p.key not in due


def _compacted(partition: TrackedPartition) -> PartitionStats:
    """What a compaction leaves: one file of the partition's data, no deletes."""
    if partition.path == GLOBAL_DELETES_PATH:
        return PartitionStats()
    stats = partition.stats
    return PartitionStats(
        data_files=1, data_bytes=stats.data_bytes, records=stats.records, small_files=1, small_bytes=stats.data_bytes
    )


TrackerMachine.TestCase.settings = settings(
    max_examples=1000, stateful_step_count=10, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestTrackerStates = TrackerMachine.TestCase
