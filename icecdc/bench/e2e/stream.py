"""The e2e bench's stream: the shape of its CDC stream (an orders table, small or of users'
partition sizes), its batches as a pure function of that shape, and the settle windows scaled
to its clock."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from icecdc.domain.sourcespec import BeforeImage
from icecdc.workload import ORDERS_PARTITIONING, OrdersWorkload


@dataclass(frozen=True)
class Workload:
    """The stream's shape; the batches are a pure function of it."""

    keys: int = 20_000
    changes: int = 1_500  # per micro-batch outside bursts
    updates: float = 0.7
    inserts: float = 0.2  # deletes: the rest
    late_share: float = 0.002  # a few late changes a batch: each old day reopens now and then
    batches_per_day: int = 6
    burst_share: float = 0.25
    burst_factor: float = 4.0
    seed: int = 17
    # days: yesterday's partitions settle; region and buckets: every partition written every batch.
    partitioning: str = "days"
    buckets: int = 16
    # The large workload's wide text column (0: none) and the share of updates that keep it.
    note_chars: int = 0
    note_keep: float = 0.9
    # KEY makes each update and delete a global delete where the key does not determine the partition.
    before_image: BeforeImage = BeforeImage.FULL

    @property
    def recent_keys(self) -> int:
        """How many of the newest keys the changes pick from, but for the late ones."""
        return 2 * self.changes

    @property
    def partition_by(self) -> list[str]:
        if self.partitioning == "buckets":
            return [f"bucket({self.buckets}, id)"]
        return PARTITIONINGS[self.partitioning]


SMALL_WORKLOAD = Workload()
PARTITIONINGS = {"days": ORDERS_PARTITIONING, "region": ["region"]}
# The initial load's rows per commit.
LOAD_CHUNK_ROWS = 200_000


def large_workload(rows: int, changes: int = 1_500, buckets: int = 16) -> Workload:
    """Users' partition sizes: ``rows`` over ``buckets`` partitions written every batch, with a wide
    text column most updates keep, and no late changes unless ``late_share`` is set."""
    return Workload(
        keys=rows, changes=changes, late_share=0.0, partitioning="buckets", buckets=buckets, note_chars=400, note_keep=0.9
    )


def batch_sizes(batches: int, workload: Workload) -> list[int]:
    """Changes per micro-batch: ``burst_factor`` times the base in a ``burst_share`` of them."""
    draw = random.Random(workload.seed)
    return [
        round(workload.changes * (workload.burst_factor if draw.random() < workload.burst_share else 1)) for _ in range(batches)
    ]


def new_orders(workload: Workload) -> OrdersWorkload:
    """The model of the stream's rows, before its initial load."""
    return OrdersWorkload(
        seed=workload.seed,
        today=0,
        recent_keys=workload.recent_keys,
        late_share=workload.late_share,
        note_chars=workload.note_chars,
        note_keep=workload.note_keep,
    )


def load_chunks(orders: OrdersWorkload, rows: int) -> Iterator[list[tuple[bytes, bytes]]]:
    """The initial load, made as it is written, since at users' sizes it does not fit in memory."""
    for start in range(0, rows, LOAD_CHUNK_ROWS):
        yield [c.record for c in orders.load(min(LOAD_CHUNK_ROWS, rows - start))]


def change_batches(orders: OrdersWorkload, batches: int, workload: Workload) -> list[list[tuple[bytes, bytes]]]:
    """``batches`` micro-batches of changes; ``orders`` then holds the state they leave."""
    out = []
    for number, size in enumerate(batch_sizes(batches, workload), 1):
        orders.today = number // workload.batches_per_day
        out.append([c.record for c in orders.changes(size, workload.updates, workload.inserts)])
    return out


def generate(batches: int, workload: Workload) -> tuple[list[list[tuple[bytes, bytes]]], OrdersWorkload]:
    """The initial load and ``batches`` micro-batches of changes in memory, and the state they leave."""
    orders = new_orders(workload)
    load = [record for chunk in load_chunks(orders, workload.keys) for record in chunk]
    return [load, *change_batches(orders, batches, workload)], orders


def settle_settings(batch_seconds: float) -> dict[str, float]:
    """Settle windows scaled to the bench's clock: a partition left alone for a few batches settles."""
    return {
        "cadence_multiple": 3,
        "min_seconds": 1.5 * batch_seconds,
        "initial_seconds": 3 * batch_seconds,
        "max_seconds": 6 * batch_seconds,
    }
