"""One vocabulary of blips for both sides: what the JVM (JDBC drivers, Iceberg's REST client, the
AWS SDK, the network) and the Python side (SQLAlchemy over sqlite3 and psycopg, pyiceberg's REST
client, requests, pyarrow's S3) raise when the catalog only does not answer for now, told apart
from what retrying will not mend."""

from __future__ import annotations

import importlib
import sqlite3
from pathlib import Path

import orjson
import pytest
import requests
from pyiceberg.exceptions import BadRequestError, ServerError, ServiceUnavailableError, TooManyRequestsError, UnauthorizedError
from sqlalchemy import exc as sql

from icecdc.domain.errors import CatalogUnavailable, CommitConflict, CommitStateUnknown
from icecdc.domain.transient import Symptoms, Transient, by_wording, classify
from icecdc.jvm.bridge import translate
from icecdc.runtime.catalog import translate_pyiceberg
from tests.unit.test_boundaries import RUNTIME, SQL, JavaClass, Py4JError, Throwable, iceberg

BUSY, DISCONNECTED, SERVER, THROTTLED, TIMEOUT = (
    Transient.BUSY,
    Transient.DISCONNECTED,
    Transient.SERVER,
    Transient.THROTTLED,
    Transient.TIMEOUT,
)


def kind_of(original: BaseException, translated: BaseException) -> Transient | None:
    """The blip a translation found (its message starts with the kind), None when it found none."""
    if translated is original:
        return None
    assert isinstance(translated, CatalogUnavailable), translated
    return Transient(str(translated).split(":", 1)[0])


# ---- the JVM side: a Java exception's cause chain, as py4j hands it over ----

SQLITE = JavaClass("org.sqlite.SQLiteException", SQL)
PSQL = JavaClass("org.postgresql.util.PSQLException", SQL)
UNCHECKED_SQL = JavaClass("org.apache.iceberg.jdbc.UncheckedSQLException", RUNTIME)
IO = JavaClass("java.io.IOException", JavaClass("java.lang.Exception"))
SOCKET = JavaClass("java.net.SocketException", IO)
SDK_SERVICE = JavaClass(
    "software.amazon.awssdk.core.exception.SdkServiceException",
    JavaClass("software.amazon.awssdk.core.exception.SdkException", RUNTIME),
)
S3 = JavaClass(
    "software.amazon.awssdk.services.s3.model.S3Exception",
    JavaClass("software.amazon.awssdk.awscore.exception.AwsServiceException", SDK_SERVICE),
)


def jdbc(cause: Throwable) -> Throwable:
    """Iceberg's JDBC catalog wraps the driver's SQLException."""
    return Throwable(UNCHECKED_SQL, "Failed to get table db.orders from catalog lake", cause)


def postgres(state: str, message: str) -> Throwable:
    return jdbc(Throwable(PSQL, message, sql_state=state))


@pytest.mark.parametrize(
    ("throwable", "kind"),
    [
        # SQLite under a lock held past the busy timeout: no SQLState, its code in words
        (jdbc(Throwable(SQLITE, "[SQLITE_BUSY] The database file is locked (database is locked)")), BUSY),
        (jdbc(Throwable(SQLITE, "[SQLITE_LOCKED] A table in the database is locked (database table is locked)")), BUSY),
        # PostgreSQL, by SQLState whatever the wording
        (postgres("57P01", "FATAL: terminating connection due to administrator command"), DISCONNECTED),
        (postgres("57P03", "FATAL: the database system is starting up"), DISCONNECTED),
        (postgres("08006", "An I/O error occurred while sending to the backend."), DISCONNECTED),
        (
            postgres(
                "08001",
                "Connection to catalog-db:5432 refused. Check that the hostname and port are correct and that the "
                "postmaster is accepting TCP/IP connections.",
            ),
            DISCONNECTED,
        ),
        (postgres("08003", "This connection has been closed."), DISCONNECTED),
        (postgres("55P03", 'ERROR: could not obtain lock on row in relation "iceberg_tables"'), BUSY),
        (postgres("40001", "ERROR: could not serialize access due to concurrent update"), BUSY),
        (postgres("40P01", "ERROR: deadlock detected"), BUSY),
        (postgres("53300", "FATAL: sorry, too many clients already"), BUSY),
        (postgres("57014", "ERROR: canceling statement due to statement timeout"), TIMEOUT),
        (postgres("42P01", 'ERROR: relation "iceberg_tables" does not exist'), None),
        (postgres("28P01", 'FATAL: password authentication failed for user "iceberg"'), None),
        (postgres("3D000", 'FATAL: database "catalog" does not exist'), None),
        (postgres("57P04", "FATAL: terminating connection due to conflict with recovery"), None),
        # JDBC's own kinds (HikariCP's pool among them)
        (
            jdbc(
                Throwable(
                    JavaClass("java.sql.SQLTransientConnectionException", JavaClass("java.sql.SQLTransientException", SQL)),
                    "HikariPool-1 - Connection is not available, request timed out after 30000ms.",
                )
            ),
            DISCONNECTED,
        ),
        # the network
        (
            Throwable(RUNTIME, "wrapped", Throwable(JavaClass("java.net.ConnectException", SOCKET), "Connection refused")),
            DISCONNECTED,
        ),
        (Throwable(RUNTIME, "java.net.SocketException: Connection reset", Throwable(SOCKET, "Connection reset")), DISCONNECTED),
        (Throwable(SOCKET, "Broken pipe (Write failed)"), DISCONNECTED),
        (Throwable(JavaClass("java.net.SocketTimeoutException", IO), "Read timed out"), TIMEOUT),
        # the REST catalog
        (iceberg("ServiceUnavailableException", "Service unavailable: the catalog is restarting"), SERVER),
        (iceberg("ServiceFailureException", "Server error: NullPointerException: null"), SERVER),
        (iceberg("RESTException", "Unable to process: Too Many Requests"), THROTTLED),
        (iceberg("NotAuthorizedException", "Not authorized: token expired"), None),
        # S3 through the AWS SDK: the HTTP status decides
        (Throwable(S3, "Please reduce your request rate. (Service: S3, Status Code: 503, Request ID: X1)", status=503), SERVER),
        (Throwable(S3, "Access Denied (Service: S3, Status Code: 403, Request ID: X2)", status=403), None),
        # Spark's own timeout is a job's failure, not the catalog's
        (Throwable(JavaClass("java.util.concurrent.TimeoutException", IO), "Futures timed out after [300 seconds]"), None),
    ],
)
def test_java_errors_are_told_by_what_they_are(throwable, kind):
    error = Py4JError(throwable)
    translated = translate(error)
    assert kind_of(error, translated) == kind
    if kind is not None:
        assert translated.java_class is not None


def test_icebergs_own_verdict_wins_over_a_blip_anywhere_in_the_chain():
    # A commit whose state is unknown must not be retried as if the catalog had only been busy.
    timeout = Throwable(JavaClass("java.net.SocketTimeoutException", IO), "Read timed out")
    wrapped = Throwable(RUNTIME, f"org.apache.iceberg.exceptions.CommitStateUnknownException: {timeout.toString()}")
    wrapped.cause = iceberg("CommitStateUnknownException", "Read timed out", timeout)
    assert isinstance(translate(Py4JError(wrapped)), CommitStateUnknown)
    assert isinstance(translate(Py4JError(iceberg("ValidationException", "found new delete", timeout))), CommitConflict)


def test_the_unavailable_catalog_names_the_link_that_shows_it():
    error = Py4JError(jdbc(Throwable(SQLITE, "[SQLITE_BUSY] The database file is locked (database is locked)")))
    translated = translate(error)
    assert str(translated).startswith("busy: Failed to get table db.orders")
    assert "[SQLITE_BUSY]" in str(translated)
    assert translated.java_class == "org.sqlite.SQLiteException"


# ---- the Python side: SQLAlchemy, pyiceberg's REST client, sockets, pyarrow's S3 ----


class PsycopgError(Exception):
    """A DBAPI error as psycopg2 raises it: the SQLState in ``pgcode`` (None when the server never
    answered)."""

    def __init__(self, message: str, pgcode: str | None) -> None:
        super().__init__(message)
        self.pgcode = pgcode


def operational(orig: Exception, invalidated: bool = False) -> sql.OperationalError:
    return sql.OperationalError("SELECT * FROM iceberg_tables", {}, orig, connection_invalidated=invalidated)


def http_error(status: int) -> requests.HTTPError:
    response = requests.Response()
    response.status_code = status
    return requests.HTTPError(f"{status} Server Error", response=response)


def raised_from(error: Exception, cause: Exception) -> Exception:
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        # SQLite, through SQLAlchemy
        (operational(sqlite3.OperationalError("database is locked")), BUSY),
        (operational(sqlite3.OperationalError("database table is locked")), BUSY),
        (operational(sqlite3.OperationalError("no such table: iceberg_tables")), None),
        (operational(sqlite3.OperationalError("unable to open database file")), None),
        # PostgreSQL through psycopg: by SQLState when the server said one, by words when it never answered
        (
            operational(
                PsycopgError(
                    "terminating connection due to administrator command\nserver closed the connection unexpectedly",
                    "57P01",
                )
            ),
            DISCONNECTED,
        ),
        (operational(PsycopgError('could not obtain lock on row in relation "iceberg_tables"', "55P03")), BUSY),
        (
            operational(
                PsycopgError(
                    'connection to server at "catalog-db" (10.0.0.5), port 5432 failed: Connection refused\n'
                    "\tIs the server running on that host and accepting TCP/IP connections?",
                    None,
                )
            ),
            DISCONNECTED,
        ),
        (operational(PsycopgError("SSL SYSCALL error: EOF detected", None), invalidated=True), DISCONNECTED),
        (operational(PsycopgError('relation "iceberg_tables" does not exist', "42P01")), None),
        (sql.InterfaceError("SELECT 1", {}, PsycopgError("connection already closed", None)), DISCONNECTED),
        (sql.TimeoutError("QueuePool limit of size 5 overflow 10 reached, connection timed out, timeout 30.00"), TIMEOUT),
        # pyiceberg's REST client, raised from the HTTP error
        (
            raised_from(ServiceUnavailableError("ServiceUnavailableError: RestError: Service Unavailable"), http_error(503)),
            SERVER,
        ),
        (raised_from(ServerError("ServerError: RestError: Bad Gateway"), http_error(502)), SERVER),
        (raised_from(TooManyRequestsError("TooManyRequestsError: RestError: Too Many Requests"), http_error(429)), THROTTLED),
        (raised_from(BadRequestError("BadRequestError: RestError: Malformed request"), http_error(400)), None),
        (raised_from(UnauthorizedError("UnauthorizedError: RestError: Unauthorized"), http_error(401)), None),
        (raised_from(NotImplementedError("NotImplementedError: RestError: Not Implemented"), http_error(501)), None),
        (
            requests.ConnectionError(
                "HTTPConnectionPool(host='rest', port=8181): Max retries exceeded with url: /v1/config (Caused by "
                "NewConnectionError('<urllib3.connection.HTTPConnection object at 0x7f>: Failed to establish a new "
                "connection: [Errno 111] Connection refused'))"
            ),
            DISCONNECTED,
        ),
        (requests.ReadTimeout("HTTPConnectionPool(host='rest', port=8181): Read timed out. (read timeout=60)"), TIMEOUT),
        # sockets
        (ConnectionRefusedError(111, "Connection refused"), DISCONNECTED),
        (ConnectionResetError(104, "Connection reset by peer"), DISCONNECTED),
        (BrokenPipeError(32, "Broken pipe"), DISCONNECTED),
        (TimeoutError("timed out"), TIMEOUT),
        # the warehouse through pyarrow's S3 file system
        (
            OSError(
                "When reading information for key 'db/orders/metadata/snap-1.avro' in bucket 'lake': AWS Error "
                "SLOW_DOWN during HeadObject operation: Please reduce your request rate."
            ),
            THROTTLED,
        ),
        (
            OSError(
                "When reading information for key 'db/orders/metadata/snap-1.avro' in bucket 'lake': AWS Error "
                "NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Couldn't connect to server"
            ),
            DISCONNECTED,
        ),
        (PermissionError("AWS Error ACCESS_DENIED during GetObject operation: Access Denied"), None),
        (FileNotFoundError("/warehouse/db/orders/metadata/v3.metadata.json"), None),
        (ValueError("Could not parse the metadata file"), None),
    ],
)
def test_python_errors_are_told_by_what_they_are(error, kind):
    assert kind_of(error, translate_pyiceberg(error)) == kind


# ---- the vocabulary itself ----


def test_codes_decide_before_words_over_the_whole_chain():
    worded = Symptoms("Connection reset", frozenset({"java.lang.RuntimeException"}))
    coded = Symptoms("FATAL: the database system is starting up", sql_state="57P03")
    diagnosis = classify([worded, coded])
    assert diagnosis is not None and diagnosis.evidence is coded


@pytest.mark.parametrize(
    ("symptoms", "kind"),
    [
        (Symptoms(sql_state="08006"), DISCONNECTED),
        (Symptoms(sql_state="08P01"), DISCONNECTED),
        (Symptoms(sql_state="57P04"), None),
        (Symptoms(sql_state="23505"), None),
        (Symptoms("the words of a coded answer are not read: Connection reset", sql_state="23505"), None),
        (Symptoms("Service Unavailable", http_status=404), None),
        (Symptoms(http_status=429), THROTTLED),
        (Symptoms(http_status=500), SERVER),
        (Symptoms(http_status=504), SERVER),
        (Symptoms(http_status=501), None),
        (Symptoms(http_status=404), None),
        (Symptoms(disconnected=True), DISCONNECTED),
        (Symptoms(classes=frozenset({"java.sql.SQLTimeoutException", "java.sql.SQLTransientException"})), TIMEOUT),
        (Symptoms(classes=frozenset({"java.sql.SQLTransactionRollbackException", "java.sql.SQLTransientException"})), BUSY),
        (Symptoms(), None),
    ],
)
def test_codes_and_classes(symptoms, kind):
    diagnosis = classify([symptoms])
    assert (diagnosis.kind if diagnosis else None) == kind


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("[SQLITE_BUSY] The database file is locked (database is locked)", BUSY),
        ("Connection is closed", DISCONNECTED),
        ("server closed the connection unexpectedly", DISCONNECTED),
        ("the database system is shutting down", DISCONNECTED),
        ("FATAL:  the database system is not yet accepting connections", DISCONNECTED),
        ("FATAL:  the database system is not accepting connections", DISCONNECTED),
        ("connect timed out", TIMEOUT),
        ("timeout expired", TIMEOUT),
        ("We encountered an internal error. Please try again. SlowDown", THROTTLED),
        ("Rate exceeded", THROTTLED),
        ("503 Service Unavailable", SERVER),
        ("Futures timed out after [300 seconds]", None),
        ("cursor already closed by the application", None),
        ("Table does not exist: db.orders", None),
    ],
)
def test_words(message, kind):
    assert by_wording(message) == kind


def test_a_jvm_that_is_gone_is_not_a_catalog_outage():
    """py4j's "Connection refused" when the Spark JVM has exited (a stopping command) must not be
    retried for minutes as if the catalog were down."""
    from py4j.protocol import Py4JNetworkError

    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError as refused:
            raise Py4JNetworkError("An error occurred while trying to connect to the Java server") from refused
    except Py4JNetworkError as error:
        gone = error
    assert translate_pyiceberg(gone) is gone


# ---- what PostgreSQL under the catalog really raises, captured from real runs ----

CAPTURED = orjson.loads((Path(__file__).parent / "fixtures" / "postgres_catalog_errors.json").read_bytes())["cases"]


def java_chain(links: list[dict]) -> Throwable:
    """A Java cause chain as captured (each link's class and superclasses, message, SQLState)."""
    cause = None
    for link in reversed(links):
        hierarchy = None
        for name in reversed(link["class"]):
            hierarchy = JavaClass(name, hierarchy)
        assert hierarchy is not None
        cause = Throwable(hierarchy, link["message"], cause, sql_state=link.get("sql_state"))
    assert cause is not None
    return cause


def python_error(case: dict) -> Exception:
    """SQLAlchemy's error over psycopg's, rebuilt from their real classes: psycopg's error class
    for a SQLState carries that SQLState, as the server's answer gives it."""
    module, _, name = case["orig"]["class"].rpartition(".")
    orig = getattr(importlib.import_module(module), name)(case["orig"]["message"])
    assert getattr(orig, "sqlstate", None) == case["orig"].get("sql_state")
    error_class = getattr(sql, case["error"].rpartition(".")[2])
    return error_class(case["statement"], {}, orig, connection_invalidated=case["connection_invalidated"])


@pytest.mark.parametrize("case", [c for c in CAPTURED if c["side"] == "jvm"], ids=lambda c: c["when"])
def test_what_the_jdbc_catalog_raises_when_postgres_goes_away_is_an_outage(case):
    error = Py4JError(java_chain(case["chain"]))
    assert kind_of(error, translate(error)) == Transient(case["kind"])


@pytest.mark.parametrize("case", [c for c in CAPTURED if c["side"] == "python"], ids=lambda c: c["when"])
def test_what_the_sql_catalog_raises_when_postgres_goes_away_is_an_outage(case):
    error = python_error(case)
    assert kind_of(error, translate_pyiceberg(error)) == Transient(case["kind"])


def test_the_captured_cases_span_a_restart_on_both_sides():
    """A fast shutdown (57P01), the closed connection Iceberg's pool keeps (08003), a server
    shutting down (57P03), a refused connection (pyiceberg's, which says so in words only)."""
    codes = {link.get("sql_state") for c in CAPTURED if c["side"] == "jvm" for link in c["chain"]}
    assert {"57P01", "08003", "57P03"} <= codes
    assert any("Connection refused" in c["orig"]["message"] for c in CAPTURED if c["side"] == "python")
