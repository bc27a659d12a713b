"""A gate that holds one Spark task of a writer's statement, after the statement planned its scan
and before it commits, so a test can commit something in between deterministically.

The gate is a folder shared by the driver and Spark's Python workers: ``arm()`` puts a token in
it, the first task that claims the token writes ``entered`` and waits for ``open``."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

ARMED, CLAIMED, ENTERED, OPEN = "armed", "claimed", "entered", "open"


def hold(value: int, folder: str, seconds: float) -> int:
    """Return ``value``; the call that claims the armed token first waits for the gate to open."""
    try:
        os.rename(os.path.join(folder, ARMED), os.path.join(folder, CLAIMED))
    except FileNotFoundError:
        return value
    Path(folder, ENTERED).touch()
    deadline = time.monotonic() + seconds
    while not os.path.exists(os.path.join(folder, OPEN)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


class Gate:
    def __init__(self, folder: Path, hold_seconds: float = 120.0) -> None:
        self.folder = folder
        self.hold_seconds = hold_seconds  # a task never waits longer, so a failed test cannot hang Spark
        folder.mkdir(parents=True, exist_ok=True)

    def arm(self) -> None:
        for name in (CLAIMED, ENTERED, OPEN):
            (self.folder / name).unlink(missing_ok=True)
        (self.folder / ARMED).touch()

    def wait_entered(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not (self.folder / ENTERED).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no task reached the gate in {self.folder} within {timeout} s")
            time.sleep(0.05)

    def open(self) -> None:
        (self.folder / OPEN).touch()

    def column(self, name: str) -> Column:
        """``name`` passed through the gate (a Python UDF, so it runs inside the statement's job)."""
        from pyspark import cloudpickle

        import icecdc.testbed.writers.gate as module

        # Spark's workers may not have the tests on their path: ship this function by value.
        cloudpickle.register_pickle_by_value(module)
        folder, seconds = str(self.folder), self.hold_seconds
        gated = F.udf(lambda value: hold(value, folder, seconds), LongType())
        return gated(F.col(name)).alias(name)
