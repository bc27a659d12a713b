"""Whether an error is a blip: the catalog, its database or its store did not answer for now, and
the same call may well succeed after a pause. One vocabulary for the Java adapter
(``icecdc.jvm.bridge``) and the pyiceberg side (``icecdc.runtime.catalog``): each describes an
error's cause chain as ``Symptoms``, and ``classify`` decides, by codes first (SQLState, HTTP
status, class) and by wording only in a chain that carries none. Pure: strings and numbers in, a
kind out.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass

# How many links of a cause chain the adapters read (a chain may loop back on itself).
MAX_CHAIN = 16


class Transient(str, enum.Enum):
    """What kind of blip an error is."""

    BUSY = "busy"  # a lock held past the busy timeout, a serialization failure, a deadlock, no free connection slot
    DISCONNECTED = "disconnected"  # refused, reset, closed, or ended by the server (a restart, a failover)
    SERVER = "server-error"  # the server failed or is unavailable for now (HTTP 5xx)
    THROTTLED = "throttled"  # asked to slow down (HTTP 429, S3's SlowDown)
    TIMEOUT = "timeout"  # no answer in time


@dataclass(frozen=True)
class Symptoms:
    """What one error (one link of a cause chain) says about itself."""

    message: str = ""
    # Qualified names of its class and every superclass: Java's (``java.sql.SQLException``) or
    # Python's (``builtins.ConnectionError``).
    classes: frozenset[str] = frozenset()
    sql_state: str | None = None
    http_status: int | None = None
    # The driver's own verdict that the connection is gone (SQLAlchemy's ``connection_invalidated``).
    disconnected: bool = False


@dataclass(frozen=True)
class Diagnosis:
    kind: Transient
    evidence: Symptoms  # the link that shows it


# SQLState (SQL standard classes; PostgreSQL's own codes, which its JDBC driver and psycopg report).
_SQL_STATE_CLASSES = {"08": Transient.DISCONNECTED}  # connection exception: 08001 cannot connect, 08006 failure, ...
_SQL_STATES = {
    # Class 57P, the server going away, except 57P04 (database_dropped): that one does not come back.
    "57P01": Transient.DISCONNECTED,  # admin_shutdown: "terminating connection due to administrator command"
    "57P02": Transient.DISCONNECTED,  # crash_shutdown
    "57P03": Transient.DISCONNECTED,  # cannot_connect_now: "the database system is starting up"
    "57P05": Transient.DISCONNECTED,  # idle_session_timeout
    "57014": Transient.TIMEOUT,  # query_canceled, which statement_timeout raises (icecdc never cancels one)
    "55P03": Transient.BUSY,  # lock_not_available: lock_timeout
    "40001": Transient.BUSY,  # serialization_failure
    "40P01": Transient.BUSY,  # deadlock_detected
    "53300": Transient.BUSY,  # too_many_connections
}
# Classes whose instances are blips whatever they say; a subclass before its superclass, since a
# link's classes include its superclasses.
_CLASSES = (
    # JDBC's own kinds
    ("java.sql.SQLTimeoutException", Transient.TIMEOUT),
    ("java.sql.SQLTransactionRollbackException", Transient.BUSY),
    ("java.sql.SQLTransientConnectionException", Transient.DISCONNECTED),
    ("java.sql.SQLNonTransientConnectionException", Transient.DISCONNECTED),  # class 08 as well, despite its name
    ("java.sql.SQLRecoverableException", Transient.DISCONNECTED),
    ("java.sql.SQLTransientException", Transient.BUSY),
    # The network's, in Java (Apache HttpClient's are their subclasses) and in Python
    ("java.net.SocketTimeoutException", Transient.TIMEOUT),
    ("java.net.ConnectException", Transient.DISCONNECTED),
    ("java.net.NoRouteToHostException", Transient.DISCONNECTED),
    ("builtins.TimeoutError", Transient.TIMEOUT),  # socket.timeout too
    ("builtins.ConnectionError", Transient.DISCONNECTED),  # refused, reset, aborted, broken pipe
    ("requests.exceptions.Timeout", Transient.TIMEOUT),
    ("requests.exceptions.ConnectionError", Transient.DISCONNECTED),
    # The REST catalog's answers, as Iceberg's Java client and pyiceberg raise them
    ("org.apache.iceberg.exceptions.ServiceUnavailableException", Transient.SERVER),  # 503
    ("org.apache.iceberg.exceptions.ServiceFailureException", Transient.SERVER),  # 500
    ("pyiceberg.exceptions.TooManyRequestsError", Transient.THROTTLED),  # 429
    ("pyiceberg.exceptions.ServiceUnavailableError", Transient.SERVER),  # 503
    ("pyiceberg.exceptions.ServerError", Transient.SERVER),  # other 5xx
    # SQLAlchemy's pool
    ("sqlalchemy.exc.TimeoutError", Transient.TIMEOUT),  # no pooled connection in time
    ("sqlalchemy.exc.DisconnectionError", Transient.DISCONNECTED),
)
_JVM_UNREACHABLE = "py4j.protocol.Py4JNetworkError"
# What drivers and stores say when they say it only in words. Timeouts are the network's only
# ("Read timed out"): Spark's "Futures timed out" is a job's failure, not the catalog's.
_WORDING = (
    (re.compile(r"SQLITE_BUSY|SQLITE_LOCKED|database (table )?is locked"), Transient.BUSY),
    (re.compile(r"slow_?down|too_?many_?requests|too many requests|throttl|rate exceeded", re.IGNORECASE), Transient.THROTTLED),
    (re.compile(r"service[ _]unavailable", re.IGNORECASE), Transient.SERVER),
    (
        re.compile(r"\b(read|connect|connection|socket|request) timed out|timeout expired|request_timeout", re.IGNORECASE),
        Transient.TIMEOUT,
    ),
    (
        re.compile(
            r"connection (refused|reset|aborted)|broken pipe|could not connect|couldn't connect|no route to host|"
            r"failed to establish a new connection|network_connection|terminating connection|closed the connection|"
            r"\bconnection\b[^.;:]{0,30}\bclosed\b|the database system is (starting up|shutting down|in recovery mode)|"
            # PostgreSQL's 57P03 in words, which is all psycopg has when the server refuses a new
            # connection (its SQLState comes with no session): recovery, a standby not open yet.
            r"the database system is not (yet )?accepting connections|"
            r"SSL SYSCALL error",
            re.IGNORECASE,
        ),
        Transient.DISCONNECTED,
    ),
)


def _by_sql_state(state: str | None) -> Transient | None:
    if not state:
        return None
    return _SQL_STATES.get(state) or _SQL_STATE_CLASSES.get(state[:2])


def _by_http_status(status: int | None) -> Transient | None:
    if status == 429:
        return Transient.THROTTLED
    # 501 (Not Implemented) is an answer, not a blip.
    if status is not None and 500 <= status < 600 and status != 501:
        return Transient.SERVER
    return None


def by_code(symptoms: Symptoms) -> Transient | None:
    """The kind one link's codes and classes say it is, if they say so."""
    kind = _by_sql_state(symptoms.sql_state) or _by_http_status(symptoms.http_status)
    if kind is None and symptoms.disconnected:
        kind = Transient.DISCONNECTED
    return kind or next((kind for name, kind in _CLASSES if name in symptoms.classes), None)


def by_wording(message: str) -> Transient | None:
    """The kind a message's words say it is, if they say so."""
    return next((kind for pattern, kind in _WORDING if pattern.search(message)), None)


def classify(chain: Iterable[Symptoms]) -> Diagnosis | None:
    """Whether an error, described link by link (outermost first), is a blip worth retrying:
    codes and classes over the whole chain first; words only when no link carries a code (a
    server that answered with a SQLState or a status said what the error is, and wrappers repeat
    their cause's words: PostgreSQL's 57P04 reads "terminating connection due to conflict with
    recovery" but will not come back)."""
    links = list(chain)
    # The Spark JVM itself gone (py4j cannot reach its gateway: "Connection refused" under it) is
    # not the catalog: waiting for it to come back would hold a stopping command for minutes.
    if any(_JVM_UNREACHABLE in link.classes for link in links):
        return None
    for link in links:
        if kind := by_code(link):
            return Diagnosis(kind, link)
    if any(link.sql_state or link.http_status is not None for link in links):
        return None
    for link in links:
        if kind := by_wording(link.message):
            return Diagnosis(kind, link)
    return None
