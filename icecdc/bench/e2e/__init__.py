"""``icecdc bench e2e``: what each maintenance strategy does to reads, to the bill and to the writer
over one CDC run. Here: the arguments; the stream in ``stream``, the probes in ``probe``, the run
in ``runner``, snapshot logs in ``snapshots``, results in ``results``, output in ``summaries``.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from icecdc.bench import out_argument, positive_numbers, table_properties, table_property_argument
from icecdc.bench.e2e.runner import RunSettings, run
from icecdc.bench.e2e.stream import Workload, large_workload
from icecdc.bench.e2e.summaries import summary
from icecdc.domain.errors import UserError
from icecdc.domain.sourcespec import BeforeImage
from icecdc.options import embedded_stack_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    embedded_stack_arguments(parser)
    parser.add_argument("--minutes", type=float, default=10, help="how long the stream is written (default: 10)")
    parser.add_argument("--keys", type=int, default=20_000, help="rows in the initial load (default: 20000)")
    parser.add_argument("--changes", type=int, default=1500, help="changes per micro-batch outside bursts (default: 1500)")
    parser.add_argument(
        "--mix",
        default="0.7,0.2",
        metavar="UPDATES,INSERTS",
        help="shares of updates and inserts; deletes are the rest (default: 0.7,0.2)",
    )
    parser.add_argument("--batch-seconds", type=float, default=10, help="one micro-batch every this many seconds (default: 10)")
    parser.add_argument("--probe-seconds", type=float, default=60, help="measure every table this often (default: 60)")
    parser.add_argument(
        "--cron-seconds",
        default="30,120",
        metavar="K[,K...]",
        help="periods of the cron strategies, one table each (default: 30,120)",
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=90,
        help="how long maintenance runs on after the last batch, at least (default: 90)",
    )
    parser.add_argument(
        "--drain-max-seconds",
        type=float,
        help="the drain goes on until the sidecar has answered every partition, at most this long "
        "(default: --drain-seconds + 300)",
    )
    parser.add_argument("--lookups", type=int, default=100, help="point lookups per table per probe (default: 100)")
    parser.add_argument(
        "--strategies",
        metavar="S[,S...]",
        help="only these strategies (icecdc always; fewer tables, more probes while writing); default: all",
    )
    parser.add_argument(
        "--partitioning",
        choices=("days", "region"),
        help="days: region and day, yesterday's partitions settle; region: four partitions written every batch, "
        "none settles while the stream runs (default: days on the small workload; on the large one bucket(N, id), "
        "see --buckets)",
    )
    parser.add_argument("--format-version", type=int, choices=(2, 3), default=2, help="Iceberg format of the tables (default: 2)")
    parser.add_argument(
        "--workload",
        choices=("small", "large"),
        default="small",
        help="small: the orders stream of --keys rows, --partitioning; large: users' partition sizes, --rows rows over "
        "--buckets partitions (bucket(N, id)) or --partitioning, all written every batch, a 400-character note nine updates in ten keep, "
        "--changes a batch (default: small)",
    )
    parser.add_argument(
        "--rows",
        type=int,
        default=20_000_000,
        help="rows in the large workload's initial load (default: 20000000, about 230 MB a partition; the bench holds "
        "the model of the rows in memory, about 0.5 KB a row)",
    )
    parser.add_argument(
        "--buckets",
        type=int,
        default=16,
        help="partitions of the large workload (bucket(N, id)); fewer make each partition larger for the same --rows, "
        "e.g. --rows 11000000 --buckets 2 for about 1 GB a partition (default: 16)",
    )
    parser.add_argument(
        "--late-share",
        type=float,
        help="share of updates and deletes on any existing row rather than on the most recent keys (twice --changes "
        "of them): late changes reopen old partitions (days) and reach the old data files of a partition (default: "
        "0.002 on the small workload; 0 on the large one, whose changes then never touch the rows of its load)",
    )
    parser.add_argument(
        "--before-image",
        choices=[b.value for b in BeforeImage],
        default=BeforeImage.FULL.value,
        help="what the tables trust of the stream's old rows (the table's before_image): full, the whole old row "
        "(MySQL's default); key, the key only (PostgreSQL's default, REPLICA IDENTITY DEFAULT), which makes every "
        "update and delete a global delete where the key does not determine the partition (days, region) and "
        "samples their age apart (default: full)",
    )
    parser.add_argument(
        "--age-sample-seconds",
        type=float,
        default=2.0,
        help="sample the age of the sidecar table's oldest live equality delete this often (default: 2)",
    )
    parser.add_argument(
        "--staging-branch",
        metavar="NAME",
        help="stage the sidecar's table on this branch (the table's staging_branch): readers read main, which the "
        "sidecar moves to the branch's newest snapshot without equality deletes (default: none, everything on main)",
    )
    parser.add_argument(
        "--hot-read-budget", type=float, help="the sidecar's compactor.hot_read_budget (default: the configuration's default)"
    )
    table_property_argument(parser)
    out_argument(parser, "plots")


def main(args: argparse.Namespace) -> int:
    try:
        updates, inserts = (float(x) for x in args.mix.split(","))
    except ValueError:
        raise UserError(f"--mix wants two shares, updates and inserts, like 0.7,0.2; got {args.mix!r}") from None
    if min(updates, inserts) < 0 or updates + inserts > 1:
        raise UserError(f"--mix: the shares must be at least 0 and add up to at most 1; got {args.mix!r}")
    cron_seconds = positive_numbers(args.cron_seconds, "--cron-seconds")
    if args.buckets < 1:
        raise UserError(f"--buckets wants at least one partition; got {args.buckets}")
    if args.late_share is not None and not 0 <= args.late_share <= 1:
        raise UserError(f"--late-share is a share, from 0 to 1; got {args.late_share}")
    if args.workload == "large":
        workload = replace(large_workload(args.rows, args.changes, args.buckets), updates=updates, inserts=inserts)
        if args.partitioning is not None:  # not by the key: with --before-image key, updates make global deletes
            workload = replace(workload, partitioning=args.partitioning)
    else:
        workload = Workload(
            keys=args.keys, changes=args.changes, updates=updates, inserts=inserts, partitioning=args.partitioning or "days"
        )
    if args.late_share is not None:
        workload = replace(workload, late_share=args.late_share)
    workload = replace(workload, before_image=BeforeImage(args.before_image))
    strategies = [s.strip() for s in args.strategies.split(",")] if args.strategies else None
    settings = RunSettings(
        batches=max(2, round(args.minutes * 60 / args.batch_seconds)),
        workload=workload,
        batch_seconds=args.batch_seconds,
        probe_seconds=args.probe_seconds,
        cron_seconds=cron_seconds,
        drain_seconds=args.drain_seconds,
        drain_max_seconds=args.drain_max_seconds if args.drain_max_seconds is not None else args.drain_seconds + 300.0,
        lookups=args.lookups,
        strategies=strategies,
        format_version=args.format_version,
        hot_read_budget=args.hot_read_budget,
        age_sample_seconds=args.age_sample_seconds,
        staging_branch=args.staging_branch,
        table_properties=table_properties(args),
    )
    results = run(settings, args.minutes, args.out, args.state_dir.resolve(), args.workload)
    print(summary(results))
    print(f"results: {args.out / 'e2e.json'}, plots: {args.out / 'e2e*.png'}, summary: {args.out / 'e2e.md'}")
    return 0
