"""What a configured table should look like: column types, partition transforms, and the
difference between that and a table that already exists.

Pure: no Spark, no catalog. The names follow Iceberg's own spelling (the strings its Java
``Type.toString()`` and ``Transform.toString()`` print), so a live table's description can be
compared with a configured one as plain strings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from icecdc.domain.errors import UserError

# Iceberg primitive type -> Spark SQL DDL type. `timestamp` is Iceberg's zone-less timestamp
# (Spark's TIMESTAMP_NTZ); `timestamptz` is Spark's TIMESTAMP.
_PRIMITIVES: dict[str, str] = {
    "boolean": "BOOLEAN",
    "int": "INT",
    "long": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "date": "DATE",
    "timestamp": "TIMESTAMP_NTZ",
    "timestamptz": "TIMESTAMP",
    "string": "STRING",
    "binary": "BINARY",
}
_DECIMAL = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
SUPPORTED_TYPES = (*_PRIMITIVES, "decimal(P, S)")


@dataclass(frozen=True)
class DecimalType:
    precision: int
    scale: int

    def __str__(self) -> str:
        return f"decimal({self.precision}, {self.scale})"


def decimal_type(iceberg_type: str) -> DecimalType | None:
    """The precision and scale of ``decimal(P, S)`` (spaces around P and S allowed); None for
    any other type. Not range-checked: ``normalize_type`` does that for configured columns."""
    match = _DECIMAL.match(iceberg_type)
    return DecimalType(int(match.group(1)), int(match.group(2))) if match else None


def widens_to(narrow: str, wide: str) -> bool:
    """Whether Iceberg may change a column of type ``narrow`` to ``wide`` (spec, "Schema
    Evolution"): int to long, float to double, a decimal's precision up at the same scale."""
    if (narrow, wide) in {("int", "long"), ("float", "double")}:
        return True
    a, b = decimal_type(narrow), decimal_type(wide)
    return a is not None and b is not None and a.scale == b.scale and b.precision > a.precision


_TEMPORAL = {"date", "timestamp", "timestamptz"}
# Which source types each transform accepts (Iceberg spec, "Partition Transforms").
_TRANSFORM_SOURCES: dict[str, set[str] | None] = {
    # Not timestamps: a partition per microsecond is never what is meant (use hours/days), and
    # Iceberg cannot parse a timestamp partition value from its string form, which the ingester
    # relies on to build partition tuples. Not binary: that parser takes the string's own bytes,
    # so arbitrary bytes cannot round-trip (use bucket or truncate).
    "identity": {"boolean", "int", "long", "float", "double", "date", "string", "decimal"},
    "year": _TEMPORAL,
    "month": _TEMPORAL,
    "day": _TEMPORAL,
    "hour": {"timestamp", "timestamptz"},
    "bucket": {"int", "long", "date", "timestamp", "timestamptz", "string", "binary", "decimal"},
    "truncate": {"int", "long", "string", "binary", "decimal"},
}
# Spark's DDL names for the time transforms; both spellings are accepted in the config.
_TIME_TRANSFORM_ALIASES = {
    "years": "year",
    "year": "year",
    "months": "month",
    "month": "month",
    "days": "day",
    "day": "day",
    "hours": "hour",
    "hour": "hour",
}
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_FUNC = re.compile(rf"^({_IDENT})\(\s*(?:(\d+)\s*,\s*)?({_IDENT})\s*\)$")
_BARE = re.compile(rf"^{_IDENT}$")


class TableSpecError(UserError, ValueError):
    """A column type or partition transform that Iceberg would not accept."""


def normalize_type(name: str) -> str:
    """Return the Iceberg spelling of a configured column type, or raise TableSpecError."""
    text = name.strip().lower()
    if text in _PRIMITIVES:
        return text
    decimal = decimal_type(text)
    if decimal is not None:
        if not 1 <= decimal.precision <= 38 or decimal.scale > decimal.precision:
            raise TableSpecError(f"{decimal} is out of range (precision 1..38, scale <= precision)")
        return str(decimal)
    raise TableSpecError(f"unknown column type {name!r}; supported: {', '.join(SUPPORTED_TYPES)}")


def spark_type(iceberg_type: str) -> str:
    """The Spark SQL DDL spelling of a normalized Iceberg type."""
    if iceberg_type.startswith("decimal("):
        return iceberg_type.upper()
    return _PRIMITIVES[iceberg_type]


def _type_family(iceberg_type: str) -> str:
    return "decimal" if iceberg_type.startswith("decimal(") else iceberg_type


@dataclass(frozen=True)
class PartitionField:
    """One partition transform over one source column."""

    source: str
    transform: str  # identity, year, month, day, hour, bucket, truncate
    param: int | None = None  # bucket count or truncate width

    @property
    def iceberg_transform(self) -> str:
        """Iceberg's ``Transform.toString()``: ``identity``, ``day``, ``bucket[16]``."""
        return f"{self.transform}[{self.param}]" if self.param is not None else self.transform

    @property
    def spark_ddl(self) -> str:
        """The ``PARTITIONED BY`` term Spark's Iceberg DDL accepts."""
        if self.transform == "identity":
            return f"`{self.source}`"
        if self.param is not None:
            return f"{self.transform}({self.param}, `{self.source}`)"
        return f"{self.transform}s(`{self.source}`)"

    @classmethod
    def from_iceberg(cls, source: str, transform: str) -> PartitionField:
        """From a live spec's source column name and ``Transform.toString()`` (``bucket[16]``)."""
        name, _, rest = transform.partition("[")
        return cls(source, name, int(rest.rstrip("]")) if rest else None)

    def __str__(self) -> str:
        if self.transform == "identity":
            return self.source
        if self.param is not None:
            return f"{self.transform}({self.param}, {self.source})"
        return f"{self.transform}s({self.source})"


def parse_partition_field(text: str, column_types: dict[str, str] | None = None) -> PartitionField:
    """Parse ``region``, ``days(updated_at)``, ``bucket(16, id)``, ``truncate(4, name)``.

    With ``column_types`` (column -> normalized Iceberg type) the source column must exist and
    have a type the transform accepts.
    """
    spec = text.strip()
    if _BARE.match(spec):
        field = PartitionField(spec, "identity")
    else:
        match = _FUNC.match(spec)
        if not match:
            raise TableSpecError(
                f"bad partition transform {text!r}; expected a column name or one of "
                "years(col), months(col), days(col), hours(col), bucket(N, col), truncate(W, col)"
            )
        func, param, source = match.group(1).lower(), match.group(2), match.group(3)
        if func in _TIME_TRANSFORM_ALIASES:
            if param is not None:
                raise TableSpecError(f"bad partition transform {text!r}: {func} takes only a column")
            field = PartitionField(source, _TIME_TRANSFORM_ALIASES[func])
        elif func in ("bucket", "truncate"):
            if param is None or int(param) < 1:
                raise TableSpecError(
                    f"bad partition transform {text!r}: {func} needs a positive number first, e.g. {func}(16, {source})"
                )
            field = PartitionField(source, func, int(param))
        else:
            raise TableSpecError(
                f"unknown partition transform {func!r} in {text!r}; known: identity, years, months, days, hours, bucket, truncate"
            )
    if column_types is not None:
        if field.source not in column_types:
            raise TableSpecError(f"partition {text!r} names column {field.source!r}, which is not in the schema")
        allowed = _TRANSFORM_SOURCES[field.transform]
        family = _type_family(column_types[field.source])
        if allowed is not None and family not in allowed:
            raise TableSpecError(
                f"partition {text!r}: {field.transform} cannot apply to {field.source!r} of type "
                f"{column_types[field.source]} (accepts {', '.join(sorted(allowed))})"
            )
    return field


# Properties of the tables icecdc creates, under the configuration's own ``properties``. Iceberg
# merges a commit's manifests into one only once 100 of them pile up; a streaming writer adds two
# a batch (data and deletes), and every query that cannot prune by partition opens each. Merging
# on the writer's own commits at 8 keeps a point lookup's planning within the hot read budget
# (docs/BENCHMARKS.md, row "Small manifests on a lookup"). Not 2: every commit would then rewrite
# the newest manifests and slow the writer (docs/BENCHMARKS.md, row "Manifest merging on the
# writer"); the sidecar's commits merge them instead (docs/compactor.md, "Manifests while writing").
CREATED_TABLE_PROPERTIES = {"commit.manifest.min-count-to-merge": "8"}


@dataclass(frozen=True)
class TableShape:
    """The parts of a table that a configuration pins down, in comparable form."""

    columns: dict[str, str]  # name -> Iceberg type, in schema order
    identifier_fields: tuple[str, ...]
    partition: tuple[PartitionField, ...]
    format_version: int | None = None  # None: any (a created table gets 2)

    def create_table_sql(self, qualified_name: str, properties: dict[str, str], if_not_exists: bool = False) -> str:
        """Spark SQL for a format-v2 Iceberg table of this shape (identifier fields NOT NULL)."""
        cols = ",\n  ".join(
            f"`{name}` {spark_type(kind)}{' NOT NULL' if name in self.identifier_fields else ''}"
            for name, kind in self.columns.items()
        )
        sql = f"CREATE TABLE {'IF NOT EXISTS ' if if_not_exists else ''}{qualified_name} (\n  {cols}\n) USING iceberg"
        if self.partition:
            sql += f"\nPARTITIONED BY ({', '.join(f.spark_ddl for f in self.partition)})"
        props = {"format-version": str(self.format_version or 2), **CREATED_TABLE_PROPERTIES, **properties}
        rendered = ", ".join(f"'{k}'='{v}'" for k, v in props.items())
        return sql + f"\nTBLPROPERTIES ({rendered})"

    def differences(self, actual: TableShape, evolved: bool = False) -> list[str]:
        """How ``actual`` (an existing table) disagrees with this configured shape; empty if it fits.

        ``evolved``: the table follows its source's schema (``evolve_schema``), so the configured
        columns are what it started with: columns added since and types widened since are fine.
        """
        problems: list[str] = []
        for name, kind in self.columns.items():
            if name not in actual.columns:
                problems.append(f"column {name!r} ({kind}) is in the config but not in the table")
            elif actual.columns[name] != kind and not (evolved and widens_to(kind, actual.columns[name])):
                problems.append(f"column {name!r} is {actual.columns[name]} in the table but {kind} in the config")
        for name, kind in actual.columns.items():
            if name not in self.columns and not evolved:
                problems.append(f"column {name!r} ({kind}) is in the table but not in the config")
        if set(actual.identifier_fields) != set(self.identifier_fields):
            problems.append(
                f"primary key is {list(actual.identifier_fields)} in the table (identifier fields) "
                f"but {list(self.identifier_fields)} in the config"
            )
        if self.format_version is not None and actual.format_version != self.format_version:
            problems.append(
                f"format version is {actual.format_version} in the table but {self.format_version} in the config"
                + (
                    " (ALTER TABLE ... SET TBLPROPERTIES ('format-version' = '3') upgrades it, for good: engines that cannot"
                    " read format v3 then cannot read the table)"
                    if self.format_version == 3
                    else " (there is no way back from 3)"
                )
            )
        if actual.partition != self.partition:
            problems.append(
                f"partitioning is [{', '.join(map(str, actual.partition))}] in the table "
                f"but [{', '.join(map(str, self.partition))}] in the config"
            )
        return problems
