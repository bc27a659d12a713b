"""A table's live files as plain facts: what the adapter lists, what the compactor plans with.
Content kinds are pyiceberg's ``DataFileContent`` (data, position deletes, equality deletes), the
same values the Iceberg spec and every metadata table use."""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.manifest import DataFileContent

__all__ = ["DataFileContent", "LiveDataFile", "LiveDeleteFile"]


@dataclass(frozen=True)
class LiveDataFile:
    path: str
    size: int
    records: int
    data_sequence_number: int


@dataclass(frozen=True)
class LiveDeleteFile:
    path: str
    content: DataFileContent  # POSITION_DELETES or EQUALITY_DELETES
    records: int
    size: int
    data_sequence_number: int = 0
    referenced_data_file: str | None = None  # position deletes that name their one data file
    equality_field_ids: tuple[int, ...] = ()
    # A deletion vector (format v3) is a blob in a Puffin file: where it starts, how long it is.
    content_offset: int | None = None
    content_size: int | None = None

    @property
    def is_equality(self) -> bool:
        return self.content is DataFileContent.EQUALITY_DELETES

    @property
    def is_deletion_vector(self) -> bool:
        return self.content_offset is not None
