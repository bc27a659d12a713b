"""The e2e bench's results as markdown tables and plots."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from icecdc.bench import table_properties_said
from icecdc.bench.e2e.probe import METRICS, REFERENCE, TITLES, on_portable
from icecdc.bench.e2e.results import FINAL, WRITING, E2EResults, StrategyResult, latency_ratio
from icecdc.bench.portability import AgeSummary, ReadOutcome
from icecdc.bench.report import markdown_table, pyplot, save
from icecdc.bench.strategies import ICECDC
from icecdc.domain.sourcespec import BeforeImage

BEFORE_IMAGES = {
    BeforeImage.FULL: "the whole old row",
    BeforeImage.KEY: "the key only (where it does not determine the partition, every update and delete a global delete)",
}


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def portability_summary(results: E2EResults) -> str:
    """The sidecar table's portability: its oldest live equality delete and the readers' probes."""
    p = results.portability
    if p is None:
        return ""

    def ages_row(phase: str, ages: AgeSummary) -> list[object]:
        return [
            phase,
            f"{_seconds(ages.p50_seconds)} / {_seconds(ages.p95_seconds)} / {_seconds(ages.max_seconds)}",
            _share(ages.none_share),
            ages.samples,
        ]

    readers = ("pyiceberg", "duckdb", on_portable("pyiceberg"), on_portable("duckdb"))

    def behind(phase: str) -> str:
        seconds = [
            r.portable_seconds_behind
            for r in results.readers
            if r.portable_seconds_behind is not None and (r.t <= results.writes_ended_t) == (phase == "writing")
        ]
        if not seconds:
            return "-"
        return f"{statistics.median(seconds):.1f} / {max(seconds):.1f}"

    rows = [
        [
            *ages_row(phase, ages),
            *(_share(exact.get(r)) for r in readers),
            behind(phase),
            sum(1 for probe in results.readers if (probe.t <= results.writes_ended_t) == (phase == "writing")),
        ]
        for phase, ages, exact in (
            ("writing", p.oldest_equality_delete_writing, p.exact_writing),
            ("after", p.oldest_equality_delete_after, p.exact_after),
        )
    ]
    # Rows of samples alone, each after its phase's row: no reader probe counts in them.
    for phase_row, phase, ages in (
        (1, "after, global deletes only", p.oldest_global_delete_after),
        (0, "writing, global deletes only", p.oldest_global_delete_writing),
        (0, "writing, outside the probes", p.oldest_equality_delete_outside_probes),
    ):
        if ages is not None:
            rows.insert(phase_row + 1, [*ages_row(phase, ages), *(["-"] * (len(readers) + 1)), 0])
    sidecar = results.strategies.get(ICECDC)
    amplification = sidecar.writing_amplification if sidecar is not None else None
    staged = ""
    if results.staging_branch and (lag := p.main_behind_writing) is not None:
        staged = (
            f"Staged on branch {results.staging_branch}: readers read main, which was behind the branch's head by "
            f"{_seconds(lag.p50_seconds)} / {_seconds(lag.p95_seconds)} / {_seconds(lag.max_seconds)} s "
            f"(p50 / p95 / max, {lag.samples} samples while writing). "
        )
    return (
        f"\n{staged}The sidecar's table, portable? The age of its oldest live equality delete, sampled every "
        f"{results.age_sample_seconds:g}s (a sample with none counts as 0 s), and reads by readers that cannot apply "
        f"equality deletes, each compared with Spark's read of the same snapshot: the current one, and the newest one "
        f"with no live equality delete (`icecdc portable-snapshot`). Write amplification while writing "
        f"((sidecar + writer bytes) / writer bytes, between the first and the last batch): "
        f"{'-' if amplification is None else f'{amplification:.2f}'}{_bytes_added(sidecar)}.\n\n"
        + markdown_table(
            (
                "phase | oldest eq delete p50 / p95 / max s | samples with none live | samples | pyiceberg exact | "
                "DuckDB exact | pyiceberg exact on the newest portable snapshot | DuckDB exact on it | "
                "it behind the current one, median / max s | reader probes"
            ),
            rows,
        )
        + "\n"
    )


def _ratios(results: E2EResults, strategy: str, metric: str) -> str:
    return " / ".join(
        "-" if (r := latency_ratio(results, strategy, metric, phase)) is None else f"{r:.2f}x" for phase in (WRITING, FINAL)
    )


def summary(results: E2EResults) -> str:
    rows = []
    for strategy, m in results.strategies.items():
        settled = m.settle_to_compacted
        last = m.series[-1]
        rows.append(
            [
                strategy,
                *(_ratios(results, strategy, k) for k in ("count_ms", "aggregate_ms", "lookup_ms")),
                last.data_files,
                last.equality_delete_files,
                last.position_delete_files,
                last.manifests,
                f"{m.rewritten_bytes / 1e6:.1f}",
                f"{m.write_amplification:.2f}",
                "-" if m.writing_amplification is None else f"{m.writing_amplification:.2f}",
                m.compaction_commits,
                f"{m.maintenance.conflicts}/{m.maintenance.runs}",
                f"{m.writer_commit_p50 * 1000:.0f} / {m.writer_commit_p99 * 1000:.0f}",
                len(m.writer_failures),
                f"{settled.compacted}/{settled.settled_partitions}",
                "-" if settled.median_seconds is None else f"{settled.median_seconds:.0f}",
                m.settled_partitions_with_equality_deletes,
            ]
        )
    reference = results.reference[-1]
    ingested = next(iter(results.strategies.values())).ingested_bytes
    return (
        (
            ""
            if results.load_compacted_seconds is None
            else f"The initial load compacted by the sidecar in {results.load_compacted_seconds:.0f}s before the stream; "
        )
        + f"{results.batches} micro-batches, one every {results.batch_seconds:g}s, then {results.drained_seconds:.0f}s "
        f"of drain; workload {results.workload_name}; {results.workload.keys:,} starting keys"
        + (f" with a {results.workload.note_chars}-character note" if results.workload.note_chars else "")
        + f"; {results.workload.late_share:.1%} of updates and deletes on any row, the rest on the "
        f"{results.workload.recent_keys:,} most recent keys; partitioned by {', '.join(results.workload.partition_by)}; "
        f"before-images: {BEFORE_IMAGES[results.workload.before_image]}; "
        f"format v{results.format_version}; hot read budget {results.hot_read_budget or 'default'}; "
        + table_properties_said(results.table_properties)
        + f"probes every {results.probe_seconds:g}s; "
        f"{results.machine}. Bytes ingested per table: {ingested / 1e6:.1f} MB. "
        f"Latency columns: each query's latency over the compacted copy's in the same probe, the median over the "
        f"probes wholly in the second half of the writes / in the final probe, after the drain (final copy: "
        f"{reference.count_ms:.0f} ms count, {reference.aggregate_ms:.0f} ms aggregation, {reference.lookup_ms:.0f} ms "
        f"lookup, {reference.data_files} files, {reference.manifests} manifests).\n\n"
        + markdown_table(
            (
                "strategy | count vs compacted, writing / final | aggregation vs compacted | lookup vs compacted | "
                "data files at end | eq-delete files at end | pos-delete files at end | manifests at end | "
                "MB rewritten | write amplification | (maintenance + writer) / writer while writing | "
                "compaction commits | conflicts / attempts | writer commit p50 / p99 ms | writer failures | "
                "settled partitions compacted | last write to compacted, median s | "
                "settled partitions with eq deletes"
            ),
            rows,
        )
        + "\n"
        + portability_summary(results)
    )


def plot(results: E2EResults, path: Path) -> None:
    """``path``: every metric on one page; beside it one PNG per metric (``e2e-<metric>.png``)."""
    plt = pyplot()
    lines = {**{s: r.series for s, r in results.strategies.items()}, REFERENCE: results.reference}

    def draw(ax: Any, metric: str) -> None:
        for strategy, series in lines.items():
            ax.plot(
                [p.t for p in series],
                [getattr(p, metric) for p in series],
                marker=".",
                label=strategy,
                linestyle="--" if strategy == REFERENCE else "-",
            )
        ax.axvline(results.writes_ended_t, color="grey", linestyle=":", linewidth=1)  # the last batch
        ax.set_title(TITLES[metric], fontsize=9)
        ax.set_xlabel("seconds into the run", fontsize=8)
        ax.grid(alpha=0.3)

    fig, axes = plt.subplots(3, 3, figsize=(15, 10))
    for ax, metric in zip(axes.flat, METRICS, strict=True):
        draw(ax, metric)
    save(plt, fig, path, axes.flat[0], dpi=100)
    for metric in METRICS:
        fig, ax = plt.subplots(figsize=(7, 4))
        draw(ax, metric)
        save(plt, fig, path.with_name(f"e2e-{metric}.png"), ax, dpi=100)
    fig, ax = plt.subplots(figsize=(7, 4))
    for strategy, result in results.strategies.items():
        ax.plot(
            [t for t, _ in result.commit_seconds],
            [s * 1000 for _, s in result.commit_seconds],
            marker=".",
            linestyle="",
            label=strategy,
        )
    _save_one(plt, fig, ax, "writer commit latency (ms)", path.with_name("e2e-writer_commit_ms.png"))
    plot_portability(results, path.with_name("e2e-portability.png"))
    plot_amplification(results, path.with_name("e2e-amplification.png"))


def _bytes_added(sidecar: StrategyResult | None) -> str:
    """Where the bytes of the amplification went: `` (writer data 1,234 KB, ...)``."""
    if sidecar is None or not sidecar.bytes_added_writing:
        return ""
    return " (" + ", ".join(f"{kind} {size / 1000:,.0f} KB" for kind, size in sidecar.bytes_added_writing.items()) + ")"


def plot_amplification(results: E2EResults, path: Path) -> None:
    """Each strategy's write amplification while writing, so far, after each commit."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for strategy, result in results.strategies.items():
        series = result.amplification_so_far
        ax.plot([t for t, _ in series], [a for _, a in series], label=strategy)
    title = "write amplification so far, (maintenance + writer) / writer bytes"
    _save_one(plt, fig, ax, title, path, xlabel="seconds since the first batch")


def plot_portability(results: E2EResults, path: Path) -> None:
    """The sidecar table's oldest live equality delete over the run (0: none live), and its oldest
    global one when the source sends key-only before-images, on a staged table how far main was
    behind its branch, and each reader probe's outcome at its time."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([t for t, _ in results.equality_delete_ages], [a or 0.0 for _, a in results.equality_delete_ages], label="age (s)")
    if results.workload.before_image is BeforeImage.KEY:
        ages = results.global_delete_ages
        ax.plot([t for t, _ in ages], [a or 0.0 for _, a in ages], label="age of the oldest global delete (s)", linewidth=1)
    if results.staging_branch:
        lag = [(t, b) for t, b in results.main_behind if b is not None]
        ax.plot([t for t, _ in lag], [b for _, b in lag], label=f"main behind {results.staging_branch} (s)")
    for offset, reader in enumerate(sorted({r for p in results.readers for r in p.outcomes})):
        for outcome, marker in ((ReadOutcome.EXACT, "o"), (ReadOutcome.REFUSED, "x"), (ReadOutcome.WRONG, "s")):
            times = [p.t for p in results.readers if p.outcomes.get(reader) is outcome]
            if times:
                ax.plot(times, [-1.0 - offset] * len(times), marker=marker, linestyle="", label=f"{reader} {outcome.value}")
    ax.axvline(results.writes_ended_t, color="grey", linestyle=":", linewidth=1)
    where = "in the sidecar's table's main" if results.staging_branch else "in the sidecar's table"
    _save_one(plt, fig, ax, f"oldest live equality delete {where} (s); reader probes below 0", path, legend_size=7)


def _save_one(
    plt: Any, fig: Any, ax: Any, title: str, path: Path, *, xlabel: str = "seconds into the run", legend_size: int = 8
) -> None:
    """A one-plot figure's title and axis, saved to ``path`` and closed."""
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    save(plt, fig, path, ax, legend=legend_size, dpi=100)
