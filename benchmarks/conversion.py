"""``python -m benchmarks conversion``: one batch's equality deletes converted into position deletes,
with the key index and by reading the partition's keys (in this process and in a Spark job), on
the same local files (docs/BENCHMARKS.md, row "Conversion with the key index").
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import string
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from icecdc.bench import out_argument
from icecdc.bench.report import pyplot
from icecdc.compactor.key_index import KeyIndex
from icecdc.compactor.key_index_loader import ParquetFiles, convert_with_index
from icecdc.compactor.plans import PartitionFiles
from icecdc.compactor.positions import Conversion, EqualityDeletes, convert_all
from icecdc.domain.files import DataFileContent, LiveDataFile, LiveDeleteFile
from icecdc.options import state_dir_argument
from icecdc.runtime.fileio import FIELD_ID

KEY_FIELD_ID, TEXT_FIELD_ID = 1, 2
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata={FIELD_ID: b"1"}),
        pa.field("note", pa.string(), metadata={FIELD_ID: b"2"}),
    ]
)
KEYS = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata={FIELD_ID: b"1"})])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=250_000, help="rows in the partition")
    parser.add_argument("--files", type=int, default=8, help="data files the partition's rows are in")
    parser.add_argument("--text-chars", type=int, default=400, help="characters of the text column")
    parser.add_argument("--changes", type=int, default=800, help="updates per batch")
    parser.add_argument("--batches", type=int, default=7)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-spark", dest="spark", action="store_false", help="leave out the Spark job way")
    out_argument(parser)
    state_dir_argument(parser)  # unused: its files are in a temporary directory


def _text(rng: random.Random, rows: int, chars: int) -> pa.Array:
    alphabet = string.ascii_letters + string.digits
    pool = ["".join(rng.choices(alphabet, k=chars)) for _ in range(512)]
    return pa.array([pool[rng.randrange(len(pool))][rng.randrange(8) :] for _ in range(rows)], pa.string())


def _write(directory: Path, table: pa.Table) -> tuple[str, int]:
    path = str(directory / f"{uuid.uuid4().hex}.parquet")
    pq.write_table(table, path)
    return path, Path(path).stat().st_size


def _key_chunk_bytes(path: str) -> int:
    metadata = pq.ParquetFile(path).metadata
    return sum(metadata.row_group(g).column(0).total_compressed_size for g in range(metadata.num_row_groups))


def main(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="icecdc-bench-conversion-") as tmp:
        root = Path(tmp)
        per_file = args.rows // args.files
        data: list[LiveDataFile] = []
        for n in range(args.files):
            ids = pa.array(range(n * per_file, (n + 1) * per_file), pa.int64())
            path, size = _write(root, pa.Table.from_arrays([ids, _text(rng, per_file, args.text_chars)], schema=SCHEMA))
            data.append(LiveDataFile(path, size, per_file, 1))
        partition_bytes = sum(f.size for f in data)
        print(f"partition: {args.rows} rows in {args.files} files, {partition_bytes / 1e6:.1f} MB")
        io: dict[str, str] = {}
        index = KeyIndex(1 << 40)
        started = time.perf_counter()
        for f in index.reconcile("p", data):
            index.add("p", f.path, f.data_sequence_number, ParquetFiles(io).data_keys(f.path, [KEY_FIELD_ID]))
        build_seconds = time.perf_counter() - started
        print(f"index built in {build_seconds:.2f}s: {index.keys} keys, {index.bytes_per_key():.1f} bytes per key")
        ways = ["reading keys", "key index", *(["reading keys, Spark job"] if args.spark else [])]
        runs: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
        spark = _local_spark() if args.spark else None
        live = list(data)
        for batch in range(args.batches):
            sequence = batch + 2
            keys = pa.array(rng.sample(range(args.rows), args.changes), pa.int64())
            new_path, new_size = _write(
                root, pa.Table.from_arrays([keys, _text(rng, args.changes, args.text_chars)], schema=SCHEMA)
            )
            delete_path, delete_size = _write(root, pa.Table.from_arrays([keys], schema=KEYS))
            delete = LiveDeleteFile(
                delete_path, DataFileContent.EQUALITY_DELETES, args.changes, delete_size, sequence, None, (KEY_FIELD_ID,)
            )
            # Each batch stands alone on the base partition: earlier batches' files are not live.
            live = [*data, LiveDataFile(new_path, new_size, args.changes, sequence)]
            files = PartitionFiles.of(live, [delete])
            convert = [f for f in files.data if f.equality_deletes]
            order = ways if batch % 2 == 0 else ways[::-1]
            for way in order:
                started = time.perf_counter()
                if way.startswith("reading keys"):
                    tasks = [
                        Conversion(
                            f.path, (EqualityDeletes(delete_path, (KEY_FIELD_ID,)),), (), str(root / f"{uuid.uuid4().hex}.pos")
                        )
                        for f in convert
                    ]
                    written = convert_all(tasks, io) if spark is None or way == "reading keys" else _on_spark(spark, tasks)
                    read = sum(_key_chunk_bytes(f.path) for f in convert) + delete_size
                    files_read = len(convert)
                else:
                    done = convert_with_index(
                        index,
                        [("p", live)],
                        convert,
                        {delete_path: delete},
                        [KEY_FIELD_ID],
                        ParquetFiles(io),
                        lambda _: str(root / f"{uuid.uuid4().hex}.pos"),
                        False,
                    )
                    assert done is not None
                    written = done.converted
                    read = _key_chunk_bytes(new_path) * done.reads.key_files + delete_size
                    files_read = done.reads.key_files
                seconds = time.perf_counter() - started
                positions = sum(c.new_positions for c in written)
                runs[way].append({"seconds": seconds, "bytes_read": read, "data_files_read": files_read, "positions": positions})
            assert {runs[way][-1]["positions"] for way in ways} == {args.changes}
    summary = _summary(runs, args, partition_bytes, build_seconds, index)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "conversion.json").write_bytes(
        orjson.dumps({"runs": runs, "args": _plain(vars(args))}, option=orjson.OPT_INDENT_2)
    )
    (args.out / "conversion.md").write_text(summary)
    _plot(runs, args.out / "conversion.png", partition_bytes)
    print(summary)
    return 0


def _plot(runs: dict[str, list[dict[str, float]]], path: Path, partition_bytes: int) -> None:
    """Seconds and MB read per batch, one bar per way (median, min-max)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ways = list(runs)
    for ax, (measure, scale, title) in zip(
        axes, (("seconds", 1.0, "seconds a batch (min-max)"), ("bytes_read", 1e-6, "MB read a batch")), strict=True
    ):
        values = [[m[measure] * scale for m in runs[way]] for way in ways]
        medians = [statistics.median(v) for v in values]
        errors = [
            [m - min(v) for m, v in zip(medians, values, strict=True)],
            [max(v) - m for m, v in zip(medians, values, strict=True)],
        ]
        ax.bar(range(len(ways)), medians, yerr=errors)
        ax.set_xticks(range(len(ways)), ways, fontsize=8)
        ax.set_title(f"{title}, a {partition_bytes / 1e6:.0f} MB partition", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _local_spark() -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the workers import icecdc and pyarrow
    return SparkSession.builder.master("local[2]").appName("bench-conversion").getOrCreate()


def _convert_task(tasks: Any) -> list[Any]:
    return convert_all(list(tasks), {})


def _on_spark(spark: Any, tasks: Sequence[Conversion]) -> list[Any]:
    """As ``rewrite.CompactionJob`` runs conversions: a few tasks per core, each several files."""
    parallel = min(len(tasks), 2 * max(1, spark.sparkContext.defaultParallelism))
    result: list[Any] = spark.sparkContext.parallelize(list(tasks), parallel).mapPartitions(_convert_task).collect()
    return result


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in values.items() if not callable(v)}


def _spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def _summary(
    runs: dict[str, list[dict[str, float]]], args: argparse.Namespace, partition_bytes: int, build: float, index: KeyIndex
) -> str:
    lines = [
        (
            f"Conversion of one batch of {args.changes} updates on a partition of {partition_bytes / 1e6:.0f} MB "
            f"({args.rows} rows, {args.files} files), {args.batches} batches, median (min-max):"
        ),
        "",
        "| way | seconds | MB read | data files read |",
        "|---|---|---|---|",
    ]
    for way, measured in runs.items():
        mb = [m["bytes_read"] / 1e6 for m in measured]
        files = [m["data_files_read"] for m in measured]
        lines.append(f"| {way} | {_spread([m['seconds'] for m in measured])} | {_spread(mb)} | {statistics.median(files):.0f} |")
    indexed = statistics.median(m["seconds"] for m in runs["key index"])
    ratios = "; ".join(
        f"{way} / key index: {statistics.median(m['seconds'] for m in measured) / indexed:.1f}x in seconds"
        for way, measured in runs.items()
        if way != "key index"
    )
    lines += [
        "",
        (
            f"{ratios}; index built in {build:.2f}s (first touch or restart), "
            f"{index.bytes_per_key():.1f} bytes per key ({index.nbytes / 1e6:.1f} MB for {index.keys} keys)"
        ),
    ]
    return "\n".join(lines) + "\n"
