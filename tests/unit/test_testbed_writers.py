"""The test-bed writers' pure parts: the change generators keep to a locality when given one, and
the upsert sink's plan and model agree with a replay of the changes."""

from __future__ import annotations

from icecdc.testbed.upsert_sink import ChangeGenerator as SinkChanges
from icecdc.testbed.upsert_sink import ChangeKind, apply_changes, plan_checkpoint
from icecdc.testbed.writers.model import REGIONS, ChangeGenerator, Locality, Op, TableModel


def test_a_locality_moves_new_rows_on_and_keeps_changes_recent():
    locality = Locality(batches_per_partition=4, reach_back=2)
    changes = ChangeGenerator(seed=3, locality=locality)
    batches = [changes.inserts(50), *(changes.merge(30) for _ in range(15))]
    born = {}
    for batch in batches:
        for change in batch.changes:
            if change.op is Op.INSERT:
                born[change.row.id] = batch.seq
                assert change.row.region == locality.region(batch.seq)
            else:
                assert batch.seq - born[change.row.id] <= 2, "a change reaches back further than the locality says"
    regions = {row.region for row in TableModel.replay(batches).rows.values()}
    assert regions == {"p000", "p001", "p002", "p003"}
    updates = [c for b in batches for c in b.changes if c.op is Op.UPDATE]
    assert updates and all(c.row.region == locality.region(born[c.row.id]) for c in updates), "a row moved partition"


def test_without_a_locality_every_batch_touches_every_region():
    changes = ChangeGenerator(seed=3)
    changes.inserts(300)
    batch = changes.merge(60)
    assert {c.row.region for c in batch.changes} == set(REGIONS)


def test_the_sink_changes_a_key_once_a_checkpoint_when_told_to_and_keeps_to_its_locality():
    locality = Locality(batches_per_partition=3, reach_back=1)
    generator = SinkChanges(seed=5, twice=0.0, locality=locality)
    model: dict = {}
    born: dict[int, int] = {}
    for seq in range(9):
        changes = generator.checkpoint(model, 40)
        assert len({c.id for c in changes}) == len(changes), "a key changed twice in one checkpoint"
        assert not any(p.position_deletes for p in plan_checkpoint(model, changes))
        for change in changes:
            if change.id not in model:
                born[change.id] = seq
                assert change.row is not None and change.row.region == locality.region(seq)
            else:
                assert seq - born[change.id] <= 1
                if change.kind is ChangeKind.UPSERT:
                    assert change.row is not None and change.row.region == model[change.id].region
        model = apply_changes(model, changes)
    assert {row.region for row in model.values()} <= {"p000", "p001", "p002"}
