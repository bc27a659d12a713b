"""A table's declared sort order (``ALTER TABLE ... WRITE ORDERED BY``) as plain data, and how a
rewrite applies it: which columns, in which direction, nulls where. Compactions write their output
sorted by it so that column bounds keep pruning point and range lookups on the sort key
(docs/compactor.md, "Sort order").

The arrow rewrite engine applies identity transforms only. A table whose order has any other
transform (``bucket``, ``truncate``, ``day`` ...) is rewritten by Spark's engine, whose write
sorts by every transform Iceberg knows.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


class SortDirection(enum.Enum):
    ASC = "asc"
    DESC = "desc"


class NullOrder(enum.Enum):
    NULLS_FIRST = "nulls-first"
    NULLS_LAST = "nulls-last"


# The transforms the arrow rewrite engine sorts by.
APPLICABLE_TRANSFORMS = frozenset({"identity"})


@dataclass(frozen=True)
class SortField:
    column: str | None  # the source column's current name; None when it was dropped
    transform: str  # Iceberg's spelling: identity, bucket[16], truncate[4], day, ...
    direction: SortDirection = SortDirection.ASC
    null_order: NullOrder = NullOrder.NULLS_FIRST

    @property
    def applicable(self) -> bool:
        return self.column is not None and self.transform in APPLICABLE_TRANSFORMS

    def __str__(self) -> str:
        term = self.column if self.transform == "identity" else f"{self.transform}({self.column})"
        return f"{term} {self.direction.value} {self.null_order.value}"


@dataclass(frozen=True)
class ArrowSortKey:
    """One field as pyarrow sorts by it: the column in its direction, after a null flag (true
    where the column is null) in ``null_flag`` order. The flag places nulls, because pyarrow
    before 25 places nulls once for all keys and pyarrow 25 deprecates that option."""

    column: str
    order: str  # "ascending" | "descending"
    null_flag: str  # True (null) sorts after False: "ascending" puts nulls last


@dataclass(frozen=True)
class SortOrder:
    order_id: int = 0  # 0: unsorted, as Iceberg numbers it
    fields: tuple[SortField, ...] = ()

    @property
    def is_sorted(self) -> bool:
        return bool(self.fields)

    @property
    def unsupported(self) -> tuple[SortField, ...]:
        """The fields the arrow engine cannot apply; any one of them sends rewrites to Spark's."""
        return tuple(f for f in self.fields if not f.applicable)

    @property
    def applies(self) -> bool:
        """Whether the arrow engine sorts by this order: it has fields and it can apply each one."""
        return self.is_sorted and not self.unsupported

    def __str__(self) -> str:
        return ", ".join(map(str, self.fields)) or "unsorted"

    def arrow_keys(self) -> tuple[ArrowSortKey, ...]:
        """The order for pyarrow; ``applies`` must hold."""
        if not self.applies:
            raise ValueError(f"sort order {self} cannot be applied by the arrow engine")
        return tuple(
            ArrowSortKey(
                f.column or "",
                "ascending" if f.direction is SortDirection.ASC else "descending",
                "descending" if f.null_order is NullOrder.NULLS_FIRST else "ascending",
            )
            for f in self.fields
        )


UNSORTED = SortOrder()


def sort_order_of(order_id: int, fields: Iterable[tuple[str | None, str, str, str]]) -> SortOrder:
    """A sort order from Iceberg's metadata spelling of each field: (source column name,
    transform, direction ``asc``/``desc``, null order ``nulls-first``/``nulls-last``)."""
    parsed = tuple(
        SortField(column, transform, SortDirection(direction), NullOrder(null_order))
        for column, transform, direction, null_order in fields
    )
    return SortOrder(order_id if parsed else 0, parsed)
