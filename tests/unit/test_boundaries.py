"""Where icecdc meets Iceberg, without a JVM: Java and pyiceberg errors translated once into
icecdc's kinds, an unavailable catalog ridden out with backoff and given up on after its time,
table names, and the enums the events carry against the JSON Schemas that publish them."""

from __future__ import annotations

import itertools

import pytest
from pyiceberg.exceptions import NoSuchTableError, ServiceUnavailableError

from icecdc.compactor.policy import Work
from icecdc.domain.errors import (
    CatalogOutage,
    CatalogUnavailable,
    CommitConflict,
    CommitStateUnknown,
    CompareAndSetLost,
    NoSuchTable,
)
from icecdc.domain.events import CompactionOutcome, MaintenanceKind, MaintenanceOutcome
from icecdc.domain.tableref import TableRef
from icecdc.jvm.bridge import translate
from icecdc.runtime.catalog import translate_pyiceberg
from icecdc.runtime.config import CatalogRetryConfig
from icecdc.runtime.health import Health
from icecdc.runtime.outages import AVAILABLE, CatalogRetry
from icecdc.schemas import COMPACTION_EVENT, MAINTENANCE_EVENT, load_schema

# ---- Java exceptions, as py4j hands them over ----


class JavaClass:
    def __init__(self, name: str, parent: JavaClass | None = None) -> None:
        self.name, self.parent = name, parent

    def getName(self) -> str:
        return self.name

    def getSuperclass(self) -> JavaClass | None:
        return self.parent


RUNTIME = JavaClass("java.lang.RuntimeException", JavaClass("java.lang.Exception"))
SQL = JavaClass("java.sql.SQLException", JavaClass("java.lang.Exception"))


class Throwable:
    def __init__(
        self,
        java_class: JavaClass,
        message: str,
        cause: Throwable | None = None,
        sql_state: str | None = None,
        status: int | None = None,
    ) -> None:
        self.java_class, self.message, self.cause = java_class, message, cause
        self.sql_state, self.status = sql_state, status

    def getClass(self) -> JavaClass:
        return self.java_class

    def getMessage(self) -> str:
        return self.message

    def getCause(self) -> Throwable | None:
        return self.cause

    def equals(self, other: object) -> bool:
        return self is other

    def toString(self) -> str:
        return f"{self.java_class.name}: {self.message}"

    def getSQLState(self) -> str | None:  # java.sql.SQLException's
        return self.sql_state

    def statusCode(self) -> int | None:  # the AWS SDK's SdkServiceException's
        return self.status


class Py4JError(Exception):
    def __init__(self, throwable: Throwable) -> None:
        super().__init__("An error occurred while calling o42.commit")
        self.java_exception = throwable


def iceberg(name: str, message: str = "", cause: Throwable | None = None) -> Throwable:
    return Throwable(JavaClass(f"org.apache.iceberg.exceptions.{name}", RUNTIME), message, cause)


@pytest.mark.parametrize(
    ("throwable", "kind"),
    [
        (iceberg("ValidationException", "Cannot commit, found new delete for replaced data file"), CommitConflict),
        (iceberg("CommitFailedException", "Cannot commit: stale metadata"), CompareAndSetLost),
        (iceberg("CommitStateUnknownException", "Service failed: 500"), CommitStateUnknown),
        (iceberg("NoSuchTableException", "Table does not exist: db.t"), NoSuchTable),
        (iceberg("ServiceUnavailableException", "503"), CatalogUnavailable),
        # SQLite under a lock held past the busy timeout: a plain SQLException, told by its code
        (
            Throwable(
                JavaClass("org.apache.iceberg.jdbc.UncheckedSQLException", RUNTIME),
                "Failed to get table db.orders from catalog lake",
                Throwable(JavaClass("org.sqlite.SQLiteException", SQL), "[SQLITE_BUSY] The database file is locked"),
            ),
            CatalogUnavailable,
        ),
        (
            Throwable(
                RUNTIME,
                "wrapped",
                Throwable(JavaClass("java.net.ConnectException", JavaClass("java.net.SocketException")), "refused"),
            ),
            CatalogUnavailable,
        ),
        # a subclass of a known kind is that kind
        (
            Throwable(
                JavaClass(
                    "org.apache.iceberg.exceptions.CleanableFailure",
                    JavaClass("org.apache.iceberg.exceptions.ValidationException", RUNTIME),
                ),
                "x",
            ),
            CommitConflict,
        ),
    ],
)
def test_java_exceptions_become_icecdcs_kinds(throwable, kind):
    translated = translate(Py4JError(throwable))
    assert isinstance(translated, kind)
    assert translated.java_class is not None


def test_java_exceptions_of_no_known_kind_and_python_ones_stay_as_they_are():
    unknown = Py4JError(Throwable(JavaClass("java.lang.IllegalStateException", RUNTIME), "a bug"))
    assert translate(unknown) is unknown
    plain = ValueError("not from Java")
    assert translate(plain) is plain


def test_pyiceberg_errors_become_icecdcs_kinds():
    from sqlalchemy.exc import OperationalError

    locked = OperationalError("SELECT ...", {}, Exception("database is locked"))
    assert isinstance(translate_pyiceberg(locked), CatalogUnavailable)
    assert isinstance(translate_pyiceberg(ServiceUnavailableError("restarting")), CatalogUnavailable)
    assert isinstance(translate_pyiceberg(NoSuchTableError("db.t")), NoSuchTable)
    assert isinstance(translate_pyiceberg(ConnectionRefusedError("refused")), CatalogUnavailable)
    missing = FileNotFoundError("/warehouse/db/t/metadata/v3.metadata.json")
    assert translate_pyiceberg(missing) is missing  # not a blip: retrying will not bring it back


# ---- riding out an outage ----


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def retry(give_up: float = 60.0) -> tuple[CatalogRetry, Clock, Health]:
    clock = Clock()
    health = Health(stall_seconds=10, clock=clock)
    settings = CatalogRetryConfig(give_up_seconds=give_up, backoff_seconds=1, backoff_max_seconds=8)
    return CatalogRetry(settings, "test", health, clock=clock, sleep=clock.sleep), clock, health


def test_an_outage_is_ridden_out_and_visible_while_it_lasts():
    catalog, clock, health = retry()
    seen: list[tuple[bool, float]] = []

    def flaky() -> str:
        seen.append((health.readiness()[0], AVAILABLE.labels("test")._value.get()))
        if clock.now < 20:
            raise CatalogUnavailable("SQLITE_BUSY")
        return "answered"

    assert catalog.call("refreshing db.t", flaky) == "answered"
    assert len(seen) > 3 and clock.now >= 20
    assert seen[1] == (False, 0.0)  # not ready, and the gauge says so, during the outage
    assert health.readiness()[0] and AVAILABLE.labels("test")._value.get() == 1.0
    assert health.liveness()[0]  # waiting on purpose is progress: a restart would not help


def test_an_outage_longer_than_the_give_up_time_stops_the_command_with_a_clear_message():
    catalog, clock, _ = retry(give_up=30)
    calls = []

    def down() -> None:
        calls.append(clock.now)
        raise CatalogUnavailable("connection refused")

    with pytest.raises(CatalogOutage, match=r"has not answered for 3\ds.*give_up_seconds is 30.*committing batch 7"):
        catalog.call("committing batch 7", down)
    assert 30 <= clock.now < 40
    assert all(0 < b - a <= 8 for a, b in itertools.pairwise(calls))  # jittered backoff, capped


def test_other_errors_are_not_retried():
    catalog, _, _ = retry()
    calls = []

    def broken() -> None:
        calls.append(1)
        raise CommitConflict("stale plan")

    with pytest.raises(CommitConflict):
        catalog.call("committing", broken)
    assert calls == [1]


# ---- names and enums ----


def test_a_table_ref_says_each_name_a_part_of_the_stack_wants():
    ref = TableRef.of("lake", "db.orders")
    assert (ref.identifier, ref.qualified, ref.qualified_namespace) == ("db.orders", "lake.db.orders", "lake.db")
    assert TableRef.of("lake", "a.b.orders").namespace == ("a", "b")
    with pytest.raises(ValueError):
        TableRef.of("lake", "orders")


def test_the_event_enums_are_the_schemas_enums():
    compaction = load_schema(COMPACTION_EVENT)["properties"]
    maintenance = load_schema(MAINTENANCE_EVENT)["properties"]
    assert {o.value for o in CompactionOutcome} == set(compaction["outcome"]["enum"])
    assert {w.value for w in Work} == set(compaction["kind"]["enum"])
    assert {k.value for k in MaintenanceKind} == set(maintenance["kind"]["enum"])
    assert {o.value for o in MaintenanceOutcome} == set(maintenance["outcome"]["enum"])
