"""What size a file counts as, in one place: the statistics from metadata, the commit events'
deltas, the rewrite plan and the benchmarks all classify files by it.

Amoro's defaults: a file under ``target / small_file_ratio`` is a small fragment (bin-packed), one
of at least ``large_file_ratio * target`` is large (left whole: deletes on it become position
deletes), and the rest are medium (rewritten when deletes apply to them).
"""

from __future__ import annotations

import enum

from icecdc.runtime.config import CompactorConfig


class SizeClass(enum.Enum):
    SMALL = "small"
    MEDIUM = "medium"
    LARGE = "large"


def size_class(size: int, settings: CompactorConfig) -> SizeClass:
    if size < settings.small_file_bytes:
        return SizeClass.SMALL
    if size < settings.large_file_bytes:
        return SizeClass.MEDIUM
    return SizeClass.LARGE
