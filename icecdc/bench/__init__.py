"""``icecdc bench ...``: benchmarks that compare icecdc with the alternatives side by side, in
one run, on the same data; results are medians, written as JSON, a plot and a markdown table."""
