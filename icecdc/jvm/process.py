"""The JVM process behind a command's Spark session: who handles its stop signal, whether it is
still there, and stopping the session when it may not be.

PySpark starts the JVM as a child of the command, in the command's process group. A SIGTERM sent
to the group (systemd's default ``KillMode=control-group``, ``tini -g``, a terminal's job
control) reaches the JVM too, which would run its shutdown hooks and exit at once, under the
batch or compaction the command is finishing, and the command's ``session.stop()`` would then
end in a py4j traceback. So the JVM ignores SIGTERM and leaves stopping to the command that owns
it: the command finishes its work and stops the session, and the JVM exits when the command
does (PySpark's gateway exits when its stdin, a pipe from the command, closes), even if the
command is killed outright.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def leave_sigterm_to_the_command(spark: SparkSession) -> None:
    """Make the session's JVM ignore SIGTERM (see the module's docstring). SIGINT it ignores
    already: PySpark starts it so, for a terminal's Ctrl-C."""
    jvm = spark.sparkContext._jvm
    if jvm is None or _process(spark) is None:  # a JVM this process did not start is not ours to change
        return
    signals = jvm.sun.misc
    signals.Signal.handle(signals.Signal("TERM"), signals.SignalHandler.SIG_IGN)


def _process(spark: SparkSession) -> object | None:
    """The JVM's process (a ``Popen``) when this process started it; None when PySpark connected
    to a running gateway (``PYSPARK_GATEWAY_PORT``)."""
    gateway = spark.sparkContext._gateway
    return getattr(gateway, "proc", None)


def jvm_exited(spark: SparkSession) -> bool:
    """Whether the JVM this process started has exited (killed, or crashed); False while it runs
    and for a JVM this process did not start."""
    process = _process(spark)
    poll = getattr(process, "poll", None)
    return poll is not None and poll() is not None


def stop_session(spark: SparkSession) -> None:
    """``spark.stop()``, unless the JVM has already exited: nothing is left to stop then, and
    PySpark's stop would fail on the gateway ("SparkSession does not exist in the JVM")."""
    if jvm_exited(spark):
        log.warning("the Spark JVM had already exited; nothing left to stop")
        return
    try:
        spark.stop()
    except Exception:
        if not jvm_exited(spark):
            raise
        log.warning("the Spark JVM exited while its session was stopping")
