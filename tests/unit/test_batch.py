"""The per-batch upsert rule, over plain data."""

import pytest

from icecdc.domain.layout import Column, PartitionTerm, TableLayout
from icecdc.domain.sourcespec import BeforeImage, SourceRules, UnknownPartition
from icecdc.ingest.batch import KeyChange, complete_row, reduce_key, to_key_change
from icecdc.ingest.debezium import ChangeEvent, Reason, RejectedEvent

REGION = (PartitionTerm("region", "region", "identity", "string"),)


def layout(partition=REGION, key=("id",)):
    columns = (Column("id", "long", True), Column("region", "string"), Column("n", "int"))
    return TableLayout("db.t", "t", columns, {"id": 1, "region": 2, "n": 3}, key, partition, 0, "/w/db/t/data")


def row(i, region, n=0):
    return {"id": i, "region": region, "n": n}


def test_insert_deletes_in_its_own_partition():
    change = to_key_change(ChangeEvent("c", (1,), None, row(1, "eu")), layout())
    assert change.prior_partitions == (("eu",),)


FULL = SourceRules(BeforeImage.FULL)


def test_partition_moving_update_deletes_in_both_when_before_images_are_full():
    change = to_key_change(ChangeEvent("u", (1,), row(1, "eu"), row(1, "us")), layout(), FULL)
    assert change.prior_partitions == (("eu",), ("us",)) and not change.global_delete


def test_by_default_a_before_image_is_trusted_for_its_key_only():
    # PostgreSQL's REPLICA IDENTITY DEFAULT through the schema wrapper: the other columns are
    # there, as nulls or fallback values; "eu" may not be where the row was.
    change = to_key_change(ChangeEvent("u", (1,), row(1, "eu"), row(1, "us")), layout())
    assert change.global_delete and change.prior_partitions == ()
    delete = to_key_change(ChangeEvent("d", (1,), row(1, ""), None), layout())
    assert delete.global_delete


def test_an_update_without_before_image_has_an_unknown_old_partition():
    assert to_key_change(ChangeEvent("u", (1,), None, row(1, "us")), layout(), FULL).global_delete
    same = SourceRules(BeforeImage.FULL, UnknownPartition.SAME_PARTITION)
    assert to_key_change(ChangeEvent("u", (1,), None, row(1, "us")), layout(), same).prior_partitions == (("us",),)


def test_missing_columns_of_after_image_become_null():
    assert complete_row(layout(), {"id": 1}) == {"id": 1, "region": None, "n": None}


@pytest.mark.parametrize("unknown", [UnknownPartition.DEAD_LETTER, UnknownPartition.SAME_PARTITION])
def test_a_delete_whose_old_partition_is_unknown_is_dead_lettered_unless_deleted_globally(unknown):
    rules = SourceRules(BeforeImage.FULL, unknown)
    with pytest.raises(RejectedEvent) as info:
        to_key_change(ChangeEvent("d", (1,), {"id": 1}, None), layout(), rules)
    assert info.value.rejection.reason == Reason.MISSING_PARTITION_VALUE
    assert "['region']" in info.value.rejection.detail and unknown.value in info.value.rejection.detail
    assert to_key_change(ChangeEvent("d", (1,), {"id": 1}, None), layout(), SourceRules(BeforeImage.FULL)).global_delete


def test_delete_partition_from_key_when_partitioned_by_key():
    by_key = layout(partition=(PartitionTerm("id_bucket", "id", "bucket[4]", "long"),))
    change = to_key_change(ChangeEvent("d", (1,), {"id": 1}, None), by_key)
    assert change.prior_partitions == ((by_key.partition_of({"id": 1})[0],),)


def test_unpartitioned_table():
    assert to_key_change(ChangeEvent("d", (1,), {"id": 1}, None), layout(partition=())).prior_partitions == ((),)


def test_last_change_wins_and_every_partition_gets_a_delete():
    result = reduce_key(
        [
            KeyChange("c", row(1, "eu", 1), (("eu",),)),
            KeyChange("u", row(1, "us", 2), (("eu",), ("us",))),
            KeyChange("u", row(1, "apac", 3), (("us",), ("apac",))),
        ]
    )
    assert result.row == row(1, "apac", 3)
    assert result.delete_partitions == {("eu",), ("us",), ("apac",)}


def test_delete_last_leaves_no_row():
    result = reduce_key([KeyChange("u", row(1, "us"), (("eu",), ("us",))), KeyChange("d", None, (("us",),))])
    assert result.row is None and result.delete_partitions == {("eu",), ("us",)}


def test_reinsert_after_delete_in_same_batch():
    result = reduce_key([KeyChange("d", None, (("eu",),)), KeyChange("c", row(1, "eu", 5), (("eu",),))])
    assert result.row == row(1, "eu", 5) and result.delete_partitions == {("eu",)}


def test_a_global_delete_covers_every_partition_of_the_key():
    result = reduce_key([KeyChange("u", row(1, "us"), (), global_delete=True), KeyChange("u", row(1, "eu"), (("us",), ("eu",)))])
    assert result.global_delete and result.delete_partitions == frozenset() and result.row == row(1, "eu")


def test_a_table_without_a_primary_key_appends_its_creates_and_deletes_nothing():
    keyless = layout(key=())
    assert keyless.append_only and not layout().append_only
    for op in ("c", "r"):
        change = to_key_change(ChangeEvent(op, (), None, row(1, "eu")), keyless)
        assert change == KeyChange(op, row(1, "eu"), ())
    # A column the event does not carry is null, as on a keyed table.
    assert to_key_change(ChangeEvent("c", (), None, {"id": 2}), keyless).after == {"id": 2, "region": None, "n": None}


@pytest.mark.parametrize(("op", "what"), [("u", "an update"), ("d", "a delete")])
@pytest.mark.parametrize("rules", [SourceRules(), FULL, SourceRules(unknown_partition=UnknownPartition.SAME_PARTITION)])
def test_an_update_or_delete_of_a_table_without_a_primary_key_is_dead_lettered_never_guessed(op, what, rules):
    event = ChangeEvent(op, (), row(1, "eu"), row(1, "us") if op == "u" else None)
    with pytest.raises(RejectedEvent) as raised:
        to_key_change(event, layout(key=()), rules)
    assert raised.value.rejection.reason is Reason.NO_PRIMARY_KEY
    assert raised.value.rejection.detail == (
        f"table db.t has no primary key: it is mirrored append-only, updates and deletes cannot be applied ({what})"
    )
