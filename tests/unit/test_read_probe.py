"""The read probes' figures and verdict follow from the ratios measured (``icecdc.bench.read_probe``)."""

from __future__ import annotations

from icecdc.bench.read_probe import READ_RATIO_GOAL, Query, ReadRatios, ReadSample, ratio_range, reads_said, reads_verdict


def sample(t: float, count: float, aggregation: float, lookup: float, writing: bool = True) -> ReadSample:
    return ReadSample(t, writing, ReadRatios(count, aggregation, lookup))


def test_the_median_and_spread_are_over_the_probes_while_writing_or_after():
    samples = [
        sample(15, 1.2, 1.0, 1.1),
        sample(30, 1.4, 1.3, 1.0),
        sample(45, 2.0, 1.1, 0.9),
        sample(60, 3.0, 3.0, 3.0, writing=False),
    ]
    assert ratio_range(samples, Query.COUNT, True) == (1.4, 1.2, 2.0)
    assert ratio_range(samples, Query.LOOKUP, False) == (3.0, 3.0, 3.0)
    assert reads_said(samples, True) == "count 1.40x (1.20-2.00), aggregation 1.10x (1.00-1.30), lookup 1.00x (0.90-1.10)"
    assert reads_said(samples, False) == "count 3.00x, aggregation 3.00x, lookup 3.00x", "one probe: no spread"
    assert reads_said([], True) == "-"


def test_the_verdict_names_each_query_over_the_goal_by_its_median():
    within = [sample(15, 1.0, 1.2, 1.1), sample(30, 1.4, 1.6, 1.2), sample(45, 1.3, 1.4, 1.0)]
    text = reads_verdict(within)
    assert text.startswith(f"Reads while writing were within {READ_RATIO_GOAL:g}x") and "of 3 probes" in text
    over = [*within, sample(60, 2.0, 1.8, 1.0), sample(75, 2.0, 1.9, 1.0)]
    text = reads_verdict(over)
    assert "were not within" in text and "(aggregation over)" in text, "the count's median is 1.4x, the aggregation's 1.6x"
    assert reads_verdict([sample(60, 3.0, 3.0, 3.0, writing=False)]) == "No read was probed while writing."
