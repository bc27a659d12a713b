"""The loads of ``icecdc bench source-latency``: the tables they configure, in the order the
bench reads them back, and pgbench's report read as figures."""

from __future__ import annotations

import pytest

from icecdc.bench.source_loads import LoadKind, OrdersLoad, PgbenchLoad, make_load
from icecdc.runtime.config import TableConfig
from icecdc.testbed.pgbench import PgbenchReport, parse_report
from icecdc.testbed.postgres import PostgresError

# pgbench 15's report of a rate-limited run, as it prints it.
REPORT = """pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: <builtin: TPC-B (sort of)>
scaling factor: 1
query mode: prepared
number of clients: 8
number of threads: 1
maximum number of tries: 1
duration: 5 s
number of transactions actually processed: 5011
number of failed transactions: 0 (0.000%)
latency average = 2.803 ms
latency stddev = 4.996 ms
rate limit schedule lag: avg 1.121 (max 39.929) ms
initial connection time = 61.907 ms
tps = 1013.272843 (without initial connection time)
"""


def test_pgbench_report_gives_its_transactions_and_mean_latency():
    assert parse_report(REPORT) == PgbenchReport(5011, 2.803)


def test_a_report_without_a_transaction_count_is_an_error():
    with pytest.raises(PostgresError, match="no transaction count"):
        parse_report("pgbench: error: connection to server failed")


@pytest.mark.parametrize("load", [OrdersLoad(run=2, connections=4), PgbenchLoad(scale=1, clients=4)], ids=lambda x: x.kind.value)
def test_a_load_configures_one_valid_table_per_source_table_in_order(load):
    specs = load.specs("bench.latency_x_2", lambda table: f"prefix.public.{table}")
    tables = [TableConfig.model_validate(spec) for spec in specs]
    assert [t.topic for t in tables] == [f"prefix.public.{s}" for s in load.source_tables], "the bench pairs them in order"
    assert [t.name for t in tables] == [f"bench.latency_x_2_{s}" for s in load.source_tables]
    stamped = tables[load.source_tables.index(load.stamped.table)]
    assert set(load.stamped.identity) <= set(stamped.schema_ or {}) and load.stamped.stamp in load.stamped.identity


def test_pgbench_mirrors_its_keyed_tables_by_key_and_history_append_only():
    load = PgbenchLoad(1, 4)
    specs = {s: TableConfig.model_validate(spec) for s, spec in zip(load.source_tables, load.specs("b.x", str), strict=True)}
    assert {name: t.primary_key for name, t in specs.items()} == {
        "pgbench_accounts": ["aid"],
        "pgbench_branches": ["bid"],
        "pgbench_tellers": ["tid"],
        "pgbench_history": [],
    }
    assert all(t.partition_by == ["bid"] for t in specs.values())


def test_the_load_kind_picks_the_load():
    assert isinstance(make_load(LoadKind.PGBENCH, 1, 8, 2), PgbenchLoad)
    assert isinstance(make_load(LoadKind.ORDERS, 1, 8, 2), OrdersLoad)
