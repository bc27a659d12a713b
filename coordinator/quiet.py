"""When a table's writer is quiet enough for a compaction to commit, as plain arithmetic.

The ingester commits once per micro-batch, at the end of it, at a steady cadence; its commit
events say when. Between two of its commits it is busy reading and writing files and touches no
metadata, so a commit made just after one of its commits has the catalog to itself, while one
made just before its next commit races it (and the loser of the catalog's compare-and-set
retries: a slower writer commit, or a failed compaction). A compaction therefore commits when
the time since the writer's last commit, plus its own commit's expected duration and a guard,
is still short of the writer's usual gap; otherwise it waits for the writer's next commit.
"""

from __future__ import annotations

from icecdc.domain.cadence import WriteCadence

# Part of the writer's gap kept clear before its next expected commit: its own commit takes a
# moment, and a batch runs a little late or early.
GUARD_SHARE = 0.25
# Right after the writer's commit is the quietest moment there is, even for a commit too slow to
# fit the window.
JUST_AFTER_SHARE = 0.1
# A writer this share of its gap past its expected commit is late: a slow batch, or it has
# stopped. Its next commit may come at any moment or never, so no moment is quieter than now:
# waiting on would only hold the compaction, and a writer that has written its last batch would
# keep its equality deletes alive for the whole bound.
LATE_SHARE = 0.5


def quiet_delay(cadence: WriteCadence, now: float, commit_seconds: float) -> float:
    """Seconds to wait before committing to a table whose writer commits at ``cadence`` (the
    table's commit times, kept the way the settle detector keeps a partition's); 0 when the
    table is quiet now.

    The answer for a writer that is due is "one gap from its last commit": by then its commit
    event should have arrived, and the caller asks again with it; for one ``LATE_SHARE`` of a gap
    past that, 0.
    """
    gap, last = cadence.typical_gap, cadence.last_write
    if gap is None or last is None:
        return 0.0
    since = now - last
    if since < 0:
        # the writer's clock is ahead of ours; its commit is in any case just done
        return 0.0
    if since >= (1 + LATE_SHARE) * gap or since <= JUST_AFTER_SHARE * gap:
        # late (or stopped), or just committed: no moment will be quieter than this one
        return 0.0
    if since + commit_seconds + GUARD_SHARE * gap <= gap:
        return 0.0
    # Too close to the writer's next commit: wait until just after it.
    return max(gap - since, 0.0) + min(0.05 * gap, 0.25)
