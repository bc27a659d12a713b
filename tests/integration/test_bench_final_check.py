"""The e2e bench's final check, which holds every table to the stream's final state in Spark
(at users' partition sizes the rows do not fit in Python): it must see a row that differs and a
row read twice."""

from icecdc.bench.e2e.stream import Workload, generate
from icecdc.bench.harness import differing_rows

SCHEMA = "id long, region string, status string, amount decimal(12, 2), updated_at timestamp"


def test_the_final_check_counts_rows_that_differ_either_way(spark):
    _, orders = generate(2, Workload(keys=50, changes=10))
    rows = orders.expected_rows()
    expected = spark.createDataFrame(orders.expected_frame(), schema=SCHEMA)
    assert differing_rows(spark.createDataFrame(rows, SCHEMA), expected) == 0
    first = rows[0]
    changed = [(*first[:3], first[3] + 1, first[4]), *rows[1:]]
    assert differing_rows(spark.createDataFrame(changed, SCHEMA), expected) == 2
    assert differing_rows(spark.createDataFrame([first, *rows], SCHEMA), expected) == 1
    assert differing_rows(spark.createDataFrame(rows[1:], SCHEMA), expected) == 1
