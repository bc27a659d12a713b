"""The JVM of one Spark session, the Java calls py4j does not make on its own, and the one
place where Java exceptions become Python ones.

py4j converts Python ints to ``Integer`` (so the adapter passes typed values through Iceberg's own
parsers, see ``listing.java_partition``), and static methods that share a name with an instance
method need reflection. Every
call that reaches Iceberg goes through ``java_errors``, which turns what crossed py4j into the
kinds of ``icecdc.domain.errors``: Iceberg's own by the Java exception's class (walking its causes); an
unavailable catalog as ``icecdc.domain.transient`` tells it from the chain's classes, codes and messages.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeVar

from icecdc.domain.errors import (
    CatalogUnavailable,
    CommitConflict,
    CommitStateUnknown,
    CompareAndSetLost,
    IcebergError,
    NoSuchTable,
)
from icecdc.domain.transient import MAX_CHAIN, Symptoms, classify

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JavaObject = Any
T = TypeVar("T")

# Iceberg's own verdicts, which decide before anything else in the chain: a commit whose state is
# unknown must never be retried as if the catalog had only been busy.
_KINDS: dict[str, type[IcebergError]] = {
    "org.apache.iceberg.exceptions.ValidationException": CommitConflict,
    "org.apache.iceberg.exceptions.CommitFailedException": CompareAndSetLost,
    "org.apache.iceberg.exceptions.CommitStateUnknownException": CommitStateUnknown,
    "org.apache.iceberg.exceptions.NoSuchTableException": NoSuchTable,
    "org.apache.spark.sql.catalyst.analysis.NoSuchTableException": NoSuchTable,
}
# The links that carry a code (``icecdc.domain.transient`` reads it): JDBC's SQLState (PostgreSQL's
# PSQLException among them), the AWS SDK's HTTP status (S3's 503 SlowDown).
_SQL_EXCEPTION = "java.sql.SQLException"
_AWS_SERVICE_EXCEPTION = "software.amazon.awssdk.core.exception.SdkServiceException"


def java_exception(error: BaseException) -> JavaObject | None:
    """The Java throwable behind a Python exception, if one crossed py4j (directly, or inside one
    of PySpark's converted exceptions)."""
    return getattr(error, "java_exception", None) or getattr(error, "_origin", None)


def _causes(throwable: JavaObject) -> Iterator[JavaObject]:
    for _ in range(MAX_CHAIN):
        if throwable is None:
            return
        yield throwable
        cause = throwable.getCause()
        throwable = None if cause is None or cause.equals(throwable) else cause


def _class_names(throwable: JavaObject) -> set[str]:
    """The throwable's class and its superclasses: a kind matches its subclasses too."""
    names = set()
    lang = throwable.getClass()
    while lang is not None:
        names.add(str(lang.getName()))
        lang = lang.getSuperclass()
    return names


def _symptoms(link: JavaObject, classes: set[str]) -> Symptoms:
    state = link.getSQLState() if _SQL_EXCEPTION in classes else None
    status = link.statusCode() if _AWS_SERVICE_EXCEPTION in classes else None
    return Symptoms(
        message=str(link.toString()),
        classes=frozenset(classes),
        sql_state=None if state is None else str(state),
        http_status=None if status is None else int(status),
    )


def translate(error: BaseException) -> BaseException:
    """The ``icecdc.domain.errors`` kind of an exception that came out of the JVM; other exceptions
    (and Java ones of no known kind) are returned as they are."""
    throwable = java_exception(error)
    if throwable is None:
        return error
    chain = [(link, _class_names(link)) for link in _causes(throwable)]
    message = str(throwable.getMessage() or throwable.toString())
    for link, classes in chain:
        for class_name, kind in _KINDS.items():
            if class_name in classes:
                return kind(f"{class_name.rsplit('.', 1)[-1]}: {message}", str(link.getClass().getName()))
    symptoms = [_symptoms(link, classes) for link, classes in chain]
    diagnosis = classify(symptoms)
    if diagnosis is None:
        return error
    evidence = chain[symptoms.index(diagnosis.evidence)][0]
    cause = "" if evidence is throwable else f" ({diagnosis.evidence.message})"
    return CatalogUnavailable(f"{diagnosis.kind.value}: {message}{cause}", str(evidence.getClass().getName()))


@contextmanager
def java_errors() -> Iterator[None]:
    """Raise the ``icecdc.domain.errors`` kind of whatever the block's Java calls throw."""
    try:
        yield
    except Exception as error:
        translated = translate(error)
        if translated is error:
            raise
        raise translated from None


def translated(method: Callable[..., T]) -> Callable[..., T]:
    """``java_errors`` around a whole method."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        with java_errors():
            return method(*args, **kwargs)

    return wrapper


# icecdc's Java classes, compiled once per JVM (its gateway): py4j caches methods by class name,
# so a second compile of a class (another class loader) would have calls on its instances sent
# to the first one's methods, which fail ("object is not an instance of declaring class").
_COMPILED: weakref.WeakKeyDictionary[Any, dict[str, JavaObject]] = weakref.WeakKeyDictionary()
_COMPILING = threading.Lock()


class JavaBridge:
    """The JVM behind one Spark session."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        context = spark.sparkContext
        if context._gateway is None or context._jvm is None:
            raise RuntimeError("this Spark session has no JVM (stopped, or a Spark Connect client)")
        self._gateway: JavaObject = context._gateway
        self.jvm: JavaObject = context._jvm

    @property
    def iceberg(self) -> JavaObject:
        """The ``org.apache.iceberg`` package."""
        return self.jvm.org.apache.iceberg

    @property
    def java_spark_session(self) -> JavaObject:
        return self.spark._jsparkSession

    @functools.cached_property
    def caller_thread_executor(self) -> JavaObject:
        """An ``ExecutorService`` that runs each task on the thread that submits it (Guava's
        direct executor, as Iceberg relocates it), for snapshot updates whose manifest work is a
        few small files: Iceberg waits for its worker pool's tasks by polling every 10 ms
        (``Tasks.waitFor``), so each parallel step of a commit costs at least 10 ms however
        little it does (docs/BENCHMARKS.md, row "Many tables in one batch")."""
        concurrent = self.iceberg.relocated.com.google.common.util.concurrent
        return concurrent.MoreExecutors.newDirectExecutorService()

    @property
    def updates(self) -> JavaObject:
        """icecdc's own snapshot-update builders (``java/IcecdcUpdates.java``): a table's files
        and summary in one py4j call each. Compiled on first use, once per JVM."""
        return self._compiled_once("IcecdcUpdates")

    @property
    def local_files(self) -> JavaObject:
        """What icecdc changes in Hadoop's local file system (``java/IcecdcLocalFiles.java``)."""
        return self._compiled_once("IcecdcLocalFiles")

    def _compiled_once(self, class_name: str) -> JavaObject:
        source = resources.files("icecdc.jvm").joinpath(f"java/{class_name}.java").read_text(encoding="utf-8")
        return self.compiled_once(class_name, source)

    def compiled_once(self, class_name: str, source: str) -> JavaObject:
        """An instance of the Java class ``class_name`` that ``source`` defines, compiled on first
        use in this JVM (icecdc's own classes are in ``icecdc/jvm/java``)."""
        with _COMPILING:  # the commit threads of a batch ask at once
            compiled = _COMPILED.setdefault(self._gateway, {})
            if class_name not in compiled:
                compiled[class_name] = self._compiled(class_name, source)
            return compiled[class_name]

    def _compiled(self, class_name: str, source: str) -> JavaObject:
        """Compiled here by Janino, the compiler Spark ships for its generated code: nothing to
        build or install, and its classes see Iceberg's, whichever class loader holds them."""
        with java_errors():
            compiler = self.jvm.org.codehaus.janino.SimpleCompiler()
            compiler.setParentClassLoader(self.iceberg.Table._java_lang_class.getClassLoader())
            compiler.cook(source)
            java_class = compiler.getClassLoader().loadClass(class_name)
            no_types = self._gateway.new_array(self.jvm.java.lang.Class, 0)
            no_args = self._gateway.new_array(self.jvm.java.lang.Object, 0)
            return java_class.getConstructor(no_types).newInstance(no_args)

    def static_call(self, java_class: JavaObject, method: str) -> JavaObject:
        """Call a no-argument static method through reflection: py4j cannot call a static method
        that shares its name with an instance method (``SparkTableCache.get()`` and ``get(key)``)."""
        no_types = self._gateway.new_array(self._gateway.jvm.java.lang.Class, 0)
        no_args = self._gateway.new_array(self._gateway.jvm.java.lang.Object, 0)
        return java_class._java_lang_class.getMethod(method, no_types).invoke(None, no_args)

    def activate_session(self) -> None:
        """Make this session the active one of the calling thread's JVM thread. Spark resolves
        catalogs through ``SQLConf.get``, which falls back to an empty default configuration on a
        thread with no active session: reading through a catalog first used on another Python
        thread (the sidecar beside the ingester in one process) then fails with "catalog not
        defined"."""
        self.jvm.org.apache.spark.sql.SparkSession.setActiveSession(self.java_spark_session)

    def heap_used_bytes(self) -> int:
        """The driver JVM's heap in use now (for the benchmarks' memory figures)."""
        runtime = self.jvm.java.lang.Runtime.getRuntime()
        return int(runtime.totalMemory() - runtime.freeMemory())

    def _heap_pools(self) -> list[JavaObject]:
        management = self.jvm.java.lang.management.ManagementFactory
        return [p for p in iterate(management.getMemoryPoolMXBeans()) if p.getType().toString() == "Heap memory"]

    def reset_heap_peak(self) -> None:
        for pool in self._heap_pools():
            pool.resetPeakUsage()

    def heap_peak_bytes(self) -> int:
        """The JVM heap's peak use since ``reset_heap_peak``: the sum of each heap pool's own peak
        (eden, survivor, old), an upper bound, as the pools peak at different moments."""
        return sum(int(pool.getPeakUsage().getUsed()) for pool in self._heap_pools())

    def pid(self) -> int:
        return int(self.jvm.java.lang.ProcessHandle.current().pid())

    def class_available(self, name: str) -> bool:
        """Whether a class is on the driver's classpath (a connector, say)."""
        try:
            self.jvm.java.lang.Class.forName(name)
            return True
        except Exception:  # noqa: BLE001 - py4j wraps ClassNotFoundException
            return False


def iterate(iterable: JavaObject) -> Iterator[JavaObject]:
    """The elements of a Java ``Iterable``. Also the way to iterate a Java collection: py4j's own
    iteration ends on a NoSuchElementException, whose round trip costs far more than the calls to
    ``hasNext``."""
    iterator = iterable.iterator()
    while iterator.hasNext():
        yield iterator.next()


def string_map(java_map: JavaObject) -> dict[str, str]:
    """A Java ``Map`` of strings as a dict, through ``iterate`` (``dict(java_map)`` pays py4j's
    slow end of iteration, see ``iterate``)."""
    return {str(entry.getKey()): str(entry.getValue()) for entry in iterate(java_map.entrySet())}
