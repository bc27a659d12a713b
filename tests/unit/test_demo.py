"""The demo's final check says what differs between the table and the expected rows."""

from icecdc.demo import row_differences

EXPECTED = [(1, "eu", 10), (2, "us", 20), (3, "apac", 30)]


def test_equal_rows_have_no_differences():
    assert row_differences(EXPECTED, list(EXPECTED)) == []


def test_missing_extra_and_changed_rows_are_each_named_with_examples():
    actual = [(1, "eu", 10), (2, "us", 21), (4, "latam", 40)]
    assert row_differences(EXPECTED, actual) == [
        "1 rows missing, e.g. [(3, 'apac', 30)]",
        "1 rows that should not be there, e.g. [(4, 'latam', 40)]",
        "1 rows with other values, e.g. expected (2, 'us', 20), found (2, 'us', 21)",
    ]


def test_a_key_held_twice_is_a_difference_even_when_one_copy_is_right():
    assert row_differences(EXPECTED, [*EXPECTED, (3, "apac", 30)]) == ["1 keys held more than once"]


def test_examples_are_bounded():
    (missing,) = row_differences([(k, k) for k in range(100)], [], examples=2)
    assert missing == "100 rows missing, e.g. [(0, 0), (1, 1)]"


# -- the demo's second writer: a plain Spark foreachBatch MERGE job on a table the sidecar keeps --


def test_the_merge_jobs_table_is_kept_by_name_alone_beside_the_ingested_one(tmp_path):
    from icecdc.demo import DEMO_TABLE, MERGE_JOB_TABLE, demo_config

    config = demo_config(tmp_path, 9092)
    orders, customers = config.tables
    assert orders.name == DEMO_TABLE["name"] and orders.ingested
    assert customers.name == MERGE_JOB_TABLE and not customers.ingested
    assert config.ingested_tables == [orders]


def test_the_merge_jobs_batches_change_only_rows_that_exist_and_its_model_follows_them():
    from icecdc.demo_merge_job import ChangeBatches, apply

    generator = ChangeBatches(seed=7)
    first = generator.batch(50)
    assert {c.op for c in first} == {"c"}
    rows: dict = {}
    apply(rows, first)
    ops = []
    for _ in range(15):
        batch = generator.batch(generator.random.randint(20, 50))
        keys = [c.row[0] for c in batch]
        assert len(set(keys)) == len(keys), "a MERGE refuses a source that changes a key twice"
        for change in batch:
            assert (change.row[0] in rows) == (change.op != "c")
            if change.op == "d":
                assert rows[change.row[0]] == change.row
        ops += [c.op if c.op != "u" or c.row[1] == rows[c.row[0]][1] else "move" for c in batch]
        apply(rows, batch)
    assert rows == generator.rows
    assert {"c", "u", "d", "move"} <= set(ops)


def test_the_merge_job_expects_the_rows_of_its_committed_batches_only(tmp_path):
    from icecdc.demo_merge_job import ForeachBatchMergeJob, apply

    job = ForeachBatchMergeJob(None, "lake.demo.customers", tmp_path, batches=4, seed=3)  # type: ignore[arg-type]
    job.committed = [0, 1]
    rows: dict = {}
    for changes in job.batches[:2]:
        apply(rows, changes)
    assert job.expected() == sorted(rows.values())
    assert ForeachBatchMergeJob(None, "t.x", tmp_path, batches=4, seed=3).batches == job.batches  # type: ignore[arg-type]
