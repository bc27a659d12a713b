"""The per-batch upsert rule, over plain data."""

import pytest

from icecdc.ingest.batch import KeyChange, complete_row, reduce_key, to_key_change
from icecdc.ingest.debezium import ChangeEvent, Reason, RejectedEvent
from icecdc.layout import Column, PartitionTerm, TableLayout

REGION = (PartitionTerm("region", "region", "identity", "string"),)


def layout(partition=REGION, key=("id",)):
    columns = (Column("id", "long", True), Column("region", "string"), Column("n", "int"))
    return TableLayout("db.t", "t", columns, {"id": 1, "region": 2, "n": 3}, key, partition, 0, "/w/db/t/data")


def row(i, region, n=0):
    return {"id": i, "region": region, "n": n}


def test_insert_deletes_in_its_own_partition():
    change = to_key_change(ChangeEvent("c", (1,), None, row(1, "eu")), layout())
    assert change.prior_partitions == (("eu",),)


def test_partition_moving_update_deletes_in_both():
    change = to_key_change(ChangeEvent("u", (1,), row(1, "eu"), row(1, "us")), layout())
    assert change.prior_partitions == (("eu",), ("us",))


def test_update_without_before_image_is_assumed_in_place():
    assert to_key_change(ChangeEvent("u", (1,), None, row(1, "us")), layout()).prior_partitions == (("us",),)


def test_missing_columns_of_after_image_become_null():
    assert complete_row(layout(), {"id": 1}) == {"id": 1, "region": None, "n": None}


def test_delete_without_partition_values_is_rejected():
    with pytest.raises(RejectedEvent) as info:
        to_key_change(ChangeEvent("d", (1,), {"id": 1}, None), layout())
    assert info.value.rejection.reason == Reason.MISSING_PARTITION_VALUE
    assert "['region']" in info.value.rejection.detail


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
