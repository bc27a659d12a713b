"""The Spark session every icecdc command uses: Iceberg runtime, catalog from the config, JDBC
drivers for JDBC catalogs.

Jar resolution, in order: if the user configures ``spark.jars.packages`` with an Iceberg Spark
runtime (production images where Maven is reachable), that is used as-is; otherwise the runtime
jar shipped inside the pinned ``snowpark-connect-deps-iceberg`` wheel is added to ``spark.jars``,
which works offline. JDBC catalogs need their driver on the classpath; Debian installs them under
/usr/share/java, which is where they are looked for unless ``spark.jars`` already names one.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from icecdc.domain.errors import UserError
from icecdc.jvm.process import leave_sigterm_to_the_command, stop_session
from icecdc.runtime.config import Config

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ICEBERG_RUNTIME_ARTIFACT = "iceberg-spark-runtime-3.5_2.12"
ICEBERG_VERSION = "1.10.2"
ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
DEBIAN_JAVA_DIR = Path("/usr/share/java")
INIT_CATALOG_TABLES = "jdbc.init-catalog-tables"
PYTHON_DAEMON_MODULE = "icecdc.runtime.python_daemon"

# JDBC URI prefix -> (jar under /usr/share/java, Debian package that installs it).
JDBC_DRIVERS: dict[str, tuple[str, str]] = {
    "jdbc:sqlite:": ("sqlite-jdbc.jar", "libxerial-sqlite-jdbc-java"),
    "jdbc:postgresql:": ("postgresql.jar", "libpostgresql-jdbc-java"),
    "jdbc:mariadb:": ("mariadb-java-client.jar", "libmariadb-java"),
    "jdbc:mysql:": ("mariadb-java-client.jar", "libmariadb-java"),
}


def _driver_for(uri: str) -> tuple[str, str] | None:
    return next((driver for prefix, driver in JDBC_DRIVERS.items() if uri.startswith(prefix)), None)


class SparkSetupError(UserError):
    """Something Spark needs is missing; the message says what to install or configure."""


def iceberg_runtime_jar() -> Path:
    """The Iceberg Spark runtime jar carried by the pinned wheel."""
    try:
        import snowpark_connect_deps_iceberg as carrier
    except ImportError:
        raise SparkSetupError(
            "the Iceberg Spark runtime is not available offline: pip install "
            "'snowpark-connect-deps-iceberg==1.0.2', or set spark.conf spark.jars.packages to "
            f"org.apache.iceberg:{ICEBERG_RUNTIME_ARTIFACT}:{ICEBERG_VERSION} where Maven is reachable"
        ) from None
    jar = Path(carrier.__file__).parent / "jars" / f"{ICEBERG_RUNTIME_ARTIFACT}-{ICEBERG_VERSION}.jar"
    if not jar.is_file():
        raise SparkSetupError(f"expected the Iceberg runtime jar at {jar}; reinstall snowpark-connect-deps-iceberg==1.0.2")
    return jar


def jdbc_driver_jar(catalog_properties: dict[str, str], user_jars: list[str], java_dir: Path = DEBIAN_JAVA_DIR) -> Path | None:
    """The Debian driver jar a JDBC catalog needs; None when the catalog is not JDBC or the user
    already put a driver on the classpath through spark.jars."""
    if catalog_properties.get("type") != "jdbc":
        return None
    uri = catalog_properties.get("uri", "")
    driver = _driver_for(uri)
    if driver is None:
        if user_jars:
            return None
        raise SparkSetupError(f"no known JDBC driver for catalog URI {uri.split('?')[0]!r}; add its jar to spark.conf spark.jars")
    jar_name, package = driver
    if any(Path(j).name == jar_name for j in user_jars):
        return None
    jar = java_dir / jar_name
    if not jar.is_file():
        raise SparkSetupError(
            f"the catalog URI {uri.split('?')[0]} needs the JDBC driver {jar}, which is missing: "
            f"apt-get install {package} (or add the driver jar to spark.conf spark.jars)"
        )
    return jar


def check_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return
    if shutil.which("java") is None:
        raise SparkSetupError("Java 17 is needed for Spark and was not found: apt-get install openjdk-17-jre-headless")


def _csv(value: object) -> list[str]:
    return [item.strip() for item in str(value or "").split(",") if item.strip()]


def spark_conf(config: Config) -> dict[str, str]:
    """Every Spark setting the session gets, derived from the config (pure apart from jar lookup)."""
    user = {k: str(v) for k, v in config.spark.conf.items()}
    jars = _csv(user.get("spark.jars"))
    packages = _csv(user.get("spark.jars.packages"))
    # spark.jars may hold globs (the container image lists /opt/icecdc/jars/*.jar).
    listed = [path for jar in jars for path in (glob.glob(jar) or [jar])]
    if not any(ICEBERG_RUNTIME_ARTIFACT in p for p in packages) and not any(ICEBERG_RUNTIME_ARTIFACT in j for j in listed):
        jars.append(str(iceberg_runtime_jar()))
    driver = jdbc_driver_jar(config.catalog.properties, _csv(user.get("spark.jars")))
    if driver is not None:
        jars.append(str(driver))

    prefix = f"spark.sql.catalog.{config.catalog.name}"
    extensions = _csv(user.get("spark.sql.extensions"))
    if ICEBERG_EXTENSIONS not in extensions:
        extensions.insert(0, ICEBERG_EXTENSIONS)
    conf = {
        # Event times are stored zone-less or in UTC; a host time zone must never shift them.
        "spark.sql.session.timeZone": "UTC",
        # Small local clusters: 200 shuffle partitions only add scheduling overhead.
        "spark.sql.shuffle.partitions": "8",
        # Progress bars interleave with icecdc's own progress lines and JSON logs.
        "spark.ui.showConsoleProgress": "false",
        # The direct Kafka reader hands each micro-batch to Spark as a pandas frame: through Arrow
        # that is one columnar copy instead of pickling every record.
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Python workers forked with Arrow and pandas already imported (icecdc/runtime/python_daemon.py).
        "spark.python.daemon.module": PYTHON_DAEMON_MODULE,
        **user,
        "spark.jars": ",".join(jars),
        "spark.sql.extensions": ",".join(extensions),
        prefix: "org.apache.iceberg.spark.SparkCatalog",
    }
    for key, value in config.catalog.properties.items():
        conf[f"{prefix}.{key}"] = value
    if INIT_CATALOG_TABLES not in config.catalog.properties and sqlite_catalog_initialized(config.catalog.properties):
        # Iceberg's JDBC catalog, when it initializes over tables that already exist, leaves a
        # metadata ResultSet open: on SQLite that is a read lock held for the life of the JVM,
        # every other process's commit waits on it and fails after busy_timeout (seen with the
        # ingester and the compactor started together). Tables that exist need no initializing,
        # and create_spark_session makes sure they exist.
        conf[f"{prefix}.{INIT_CATALOG_TABLES}"] = "false"
    return conf


def sqlite_catalog_file(catalog_properties: dict[str, str]) -> Path | None:
    """The database file of a JDBC catalog on SQLite; None for any other catalog."""
    uri = catalog_properties.get("uri", "")
    if catalog_properties.get("type") != "jdbc" or not uri.startswith("jdbc:sqlite:"):
        return None
    path = uri.removeprefix("jdbc:sqlite:").removeprefix("file:").split("?")[0]
    return Path(path) if path and path != ":memory:" else None


def sqlite_catalog_initialized(catalog_properties: dict[str, str]) -> bool:
    path = sqlite_catalog_file(catalog_properties)
    if path is None or not path.exists():
        return False
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as db:
        names = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return {"iceberg_tables", "iceberg_namespace_properties"} <= names


def make_local_catalog_dirs(catalog_properties: dict[str, str]) -> None:
    """SQLite cannot create the folder of its database file, and a first-run local warehouse
    does not exist yet; create both when they are local paths."""
    database = sqlite_catalog_file(catalog_properties)
    if database is not None:
        database.parent.mkdir(parents=True, exist_ok=True)
    warehouse = catalog_properties.get("warehouse", "")
    if warehouse.startswith(("/", "file:")):
        Path(warehouse.removeprefix("file:")).mkdir(parents=True, exist_ok=True)


def host_local_paths(config: Config) -> list[str]:
    """The paths of the config that only this host sees, when executors may run on others.

    On ``local[...]`` and ``local-cluster[...]`` every executor shares the driver's filesystem.
    On any other master an executor writes data files and reads them for key matching under the
    warehouse location, so a warehouse on a local path works only if every worker mounts it at
    the same path (a shared filesystem); a SQLite catalog is read by the driver only."""
    if config.spark.master.startswith("local"):
        return []
    warehouse = config.catalog.properties.get("warehouse", "")
    return [warehouse] if warehouse.startswith(("/", "file:")) else []


def create_spark_session(config: Config, app_name: str = "icecdc") -> SparkSession:
    """Start (or reuse) the process's Spark session for this config."""
    check_java()
    for path in host_local_paths(config):
        log.warning(
            "spark.master is %s and the warehouse %s is a local path: every worker must see it at that "
            "path (a shared filesystem), or use an object store (s3://, gs://, abfs://)",
            config.spark.master,
            path,
        )
    make_local_catalog_dirs(config.catalog.properties)
    if sqlite_catalog_file(config.catalog.properties) is not None:
        # Create the catalog's tables (pyiceberg's SQL catalog writes Iceberg's own layout) so
        # that the JVM never initializes over existing ones: see INIT_CATALOG_TABLES in spark_conf.
        from icecdc.runtime.catalog import pyiceberg_catalog

        pyiceberg_catalog(config)
    from pyspark.sql import SparkSession

    # Executors of a local master run Python workers; they must use this interpreter (the venv).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).master(config.spark.master)
    for key, value in spark_conf(config).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


@contextlib.contextmanager
def spark_session(config: Config, app_name: str, existing: SparkSession | None = None) -> Iterator[SparkSession]:
    """A command's Spark session, stopped when the command ends: one left to the JVM's shutdown
    hooks has its executors killed under it, and on a cluster (or ``local-cluster``) each of them
    logs errors as it goes. Its JVM leaves SIGTERM to the command, which finishes its work first
    (``icecdc.runtime.lifecycle``); a JVM that exited anyway has nothing left to stop. A session the
    caller passes in is the caller's to stop."""
    if existing is not None:
        yield existing
        return
    session = create_spark_session(config, app_name)
    leave_sigterm_to_the_command(session)
    try:
        yield session
    finally:
        stop_session(session)
