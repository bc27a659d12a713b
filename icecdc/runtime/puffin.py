"""Deletion vectors (Iceberg format v3): the deleted row positions of one data file as a Roaring
bitmap in a Puffin file, written on executors as the position-delete Parquet files of v2 are.
pyiceberg has no writer, and Iceberg's Java one needs a py4j call a position, on executors that
have no JVM; the layout is the spec's (Iceberg's Puffin spec, ``deletion-vector-v1``). One file
per data file, holding every position deleted from it: two vectors for one file break a scan.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyroaring import BitMap64

from icecdc.runtime.fileio import file_io

PUFFIN_MAGIC = b"PFA1"
DV_MAGIC = bytes([0xD1, 0xD3, 0x39, 0x64])
BLOB_TYPE = "deletion-vector-v1"
# MetadataColumns.ROW_POSITION: the field a deletion vector is about.
ROW_POSITION_FIELD_ID = 2147483645
REFERENCED_DATA_FILE = "referenced-data-file"
CARDINALITY = "cardinality"


@dataclass(frozen=True)
class DeletionVectorFile:
    path: str
    size: int  # of the Puffin file
    content_offset: int  # where the blob starts
    content_size: int  # the blob's length
    cardinality: int


def blob_bytes(positions: BitMap64) -> bytes:
    """A ``deletion-vector-v1`` blob: the length of magic + vector (4 bytes, big-endian), the magic,
    the vector in Roaring's portable 64-bit form (what ``BitMap64`` serializes), and the CRC-32 of
    magic + vector (4 bytes, big-endian)."""
    positions.run_optimize()
    body = DV_MAGIC + bytes(positions.serialize())
    return len(body).to_bytes(4, "big") + body + (zlib.crc32(body) & 0xFFFFFFFF).to_bytes(4, "big")


def puffin_bytes(data_file: str, positions: pa.Array) -> tuple[bytes, int, int]:
    """A Puffin file holding one deletion vector: (file, blob offset, blob length). ``PFA1``, the
    blob, then the footer: ``PFA1``, its JSON payload, the payload's length (4 bytes
    little-endian), 4 flag bytes (uncompressed) and ``PFA1``."""
    from pyiceberg.table.puffin import Footer, PuffinBlobMetadata

    bitmap = BitMap64(positions.to_numpy(zero_copy_only=False))
    blob = blob_bytes(bitmap)
    offset = len(PUFFIN_MAGIC)
    metadata = PuffinBlobMetadata.model_validate(
        {
            "type": BLOB_TYPE,
            "fields": [ROW_POSITION_FIELD_ID],
            "snapshot-id": -1,
            "sequence-number": -1,
            "offset": offset,
            "length": len(blob),
            "properties": {REFERENCED_DATA_FILE: data_file, CARDINALITY: str(len(bitmap))},
        }
    )
    footer = Footer(blobs=[metadata], properties={"created-by": "icecdc"}).model_dump_json(by_alias=True, exclude_none=True)
    payload = footer.encode()
    tail = PUFFIN_MAGIC + payload + len(payload).to_bytes(4, "little") + bytes(4) + PUFFIN_MAGIC
    return PUFFIN_MAGIC + blob + tail, offset, len(blob)


def write_deletion_vector(path: str, data_file: str, positions: pa.Array, io_properties: Mapping[str, str]) -> DeletionVectorFile:
    """Write a new Puffin file with the deletion vector of ``data_file`` (never overwriting one)."""
    content, offset, length = puffin_bytes(data_file, positions)
    with file_io(path, io_properties).new_output(path).create(overwrite=False) as stream:
        stream.write(content)
    return DeletionVectorFile(path, len(content), offset, length, len(positions))


def read_deletion_vector(path: str, data_file: str, io_properties: Mapping[str, str]) -> pa.Array:
    """The positions the deletion vector for ``data_file`` in a Puffin file deletes."""
    from pyiceberg.table.deletion_vector import deletion_vectors_from_puffin_file
    from pyiceberg.table.puffin import PuffinFile

    with file_io(path, io_properties).new_input(path).open() as stream:
        puffin = PuffinFile(stream.read())
    for vector in deletion_vectors_from_puffin_file(puffin):
        if vector.referenced_data_file == data_file:
            return vector.to_vector().combine_chunks().cast(pa.int64())
    return pa.array([], pa.int64())
