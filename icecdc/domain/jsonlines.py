"""JSON documents held in an Arrow column, handed to Arrow's JSON reader as one buffer of lines
without a Python object per document."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def json_lines(documents: pa.Array) -> pa.Buffer:
    """The documents (none null, none holding a line break: compact JSON escapes them), one a
    line."""
    lines = pc.binary_join_element_wise(documents.cast(pa.binary()), b"", b"\n")
    offsets = np.frombuffer(lines.buffers()[1], np.int32)[lines.offset : lines.offset + len(lines) + 1]
    return lines.buffers()[2][int(offsets[0]) : int(offsets[-1])]
