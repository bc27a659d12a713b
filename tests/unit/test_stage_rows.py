"""The rows the stages pass on (``ingest/stage_rows.py``): each declared once in Arrow, its Spark
DDL made from it, and the ``op`` column never ambiguous between a change, a tag and a file."""

from __future__ import annotations

from icecdc.ingest.filemeta import FileKind
from icecdc.ingest.stage_rows import KAFKA_SCHEMA, KAFKA_SCHEMA_WITH_HEADERS, PARSED, PARSED_SCHEMA, RESULT, RESULT_SCHEMA, Tag


def test_the_spark_ddl_names_every_arrow_field_in_order():
    assert [column.split()[0] for column in PARSED_SCHEMA.split(", ")] == PARSED.names
    assert [column.split()[0] for column in RESULT_SCHEMA.split(", ")] == RESULT.names
    assert "prior array<string>" in PARSED_SCHEMA


def test_the_result_rows_are_the_parsed_rows_and_a_written_files_facts():
    assert RESULT.names[: len(PARSED)] == PARSED.names
    assert RESULT.names[len(PARSED) :] == ["path", "record_count", "file_size", "description"]


def test_the_headers_column_follows_the_kafka_sources_columns():
    assert KAFKA_SCHEMA_WITH_HEADERS.startswith(f"{KAFKA_SCHEMA}, ")
    assert KAFKA_SCHEMA_WITH_HEADERS.endswith("headers array<struct<key:string,value:binary>>")


def test_an_op_is_a_change_a_tag_or_a_file_never_two_of_them():
    debezium_ops = {"c", "r", "u", "d"}
    tags, files = {tag.value for tag in Tag}, {kind.value for kind in FileKind}
    assert not tags & files
    assert not (tags | files) & debezium_ops
