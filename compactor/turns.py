"""What the sidecar does next, decided from plain data (as Flink's ``TriggerManager`` decides
maintenance triggers in one place): the loop asks, does it, and asks again.

One piece of work per turn, so that the group protocol is served between two (a rebalance waits
for whatever this replica is doing). Maintenance due on a table this replica maintains goes
first: a busy replica always has a partition to compact, so maintenance placed after compactions
would never run (found by the two-replica test), and it comes due seldom (expiry every
``interval_seconds``, a manifest check at most once a minute, each skipped at once when it would
do nothing). Otherwise the best-ranked due partition this replica owns, on a table no
maintenance run is touching.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from icecdc.compactor.policy import Candidate
from icecdc.events import MaintenanceKind


@dataclass(frozen=True)
class Maintain:
    table: str
    kind: MaintenanceKind


@dataclass(frozen=True)
class Compact:
    candidate: Candidate


Step = Maintain | Compact | None


def owned_candidates(
    candidates: Sequence[Candidate], owns: Callable[[str, str], bool], maintenance_running: Callable[[str], bool]
) -> list[Candidate]:
    """The candidates (ranked) in partitions this replica holds, on tables no maintenance run is
    touching: a maintenance run stops new compactions of its table on every replica."""
    return [c for c in candidates if owns(c.table, c.partition_path) and not maintenance_running(c.table)]


def next_step(maintenance_due: Sequence[tuple[str, MaintenanceKind]], candidates: Sequence[Candidate]) -> Step:
    """Maintenance first, then the best candidate, else nothing to do."""
    if maintenance_due:
        return Maintain(*maintenance_due[0])
    if candidates:
        return Compact(candidates[0])
    return None


def idle(*, joined: bool, seconds_since_commit_event: float, until_idle: float, has_candidates: bool, waiting: bool) -> bool:
    """Whether ``--until-idle`` may stop the sidecar: in its group, no commit event for
    ``until_idle`` seconds, nothing due and nothing waiting to become due (hot or backing off)."""
    return joined and seconds_since_commit_event >= until_idle and not has_candidates and not waiting
