import jsonschema
import pytest

from icecdc.schemas import (
    COMMIT_EVENT,
    COMPACTION_EVENT,
    DEBEZIUM_ENVELOPE,
    MAINTENANCE_EVENT,
    SchemaError,
    load_schema,
    validator,
)


@pytest.mark.parametrize("name", [DEBEZIUM_ENVELOPE, COMMIT_EVENT, COMPACTION_EVENT, MAINTENANCE_EVENT])
def test_schemas_are_valid_json_schema(name):
    jsonschema.Draft7Validator.check_schema(load_schema(name))


BARE = {"op": "u", "before": {"id": 1}, "after": {"id": 1, "x": 2}, "source": {"lsn": 10}, "ts_ms": 1}


@pytest.mark.parametrize(
    "event",
    [
        BARE,
        {"schema": {"type": "struct", "fields": []}, "payload": BARE},
        {"op": "c", "before": None, "after": {"id": 1}},
        {"op": "r", "after": {"id": 1}},
        {"op": "d", "before": {"id": 1}, "after": None},
    ],
)
def test_debezium_envelopes_accepted(event):
    validator(DEBEZIUM_ENVELOPE)(event)


@pytest.mark.parametrize(
    "event",
    [
        {"op": "x", "after": {"id": 1}},
        {"op": "c", "after": None},
        {"op": "d", "before": None},
        {"before": {"id": 1}},
        {"schema": {}, "payload": {"op": "z"}},
        [1, 2],
    ],
)
def test_debezium_envelopes_rejected(event):
    with pytest.raises(SchemaError):
        validator(DEBEZIUM_ENVELOPE)(event)


def test_commit_event_shape():
    event = {
        "version": 1,
        "table": "db.t",
        "snapshot_id": 5,
        "sequence_number": 3,
        "commit_time_ms": 1,
        "operation": "overwrite",
        "partitions": [
            {
                "partition": {"region": "eu"},
                "data_files": 1,
                "data_bytes": 10,
                "data_records": 2,
                "equality_delete_files": 1,
                "equality_delete_records": 1,
            }
        ],
    }
    validator(COMMIT_EVENT)(event)
    with pytest.raises(SchemaError):
        validator(COMMIT_EVENT)({**event, "partitions": [{"partition": {}}]})


def test_compaction_event_shape_with_and_without_the_tables_portability():
    event = {
        "version": 1,
        "table": "db.t",
        "partition": {"region": "eu"},
        "kind": "equality-to-position",
        "outcome": "committed",
        "replica": "r1",
        "starting_snapshot_id": 5,
        "started_ms": 1,
        "finished_ms": 2,
    }
    validator(COMPACTION_EVENT)(event)  # an older replica's: the fields are additive
    validator(COMPACTION_EVENT)({**event, "oldest_equality_delete_age_seconds": 4.2, "portable": False})
    validator(COMPACTION_EVENT)({**event, "oldest_equality_delete_age_seconds": None, "portable": None})
    for wrong in ({"oldest_equality_delete_age_seconds": -1}, {"portable": "yes"}):
        with pytest.raises(SchemaError):
            validator(COMPACTION_EVENT)({**event, **wrong})
