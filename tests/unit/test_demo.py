"""The demo's final check says what differs between the table and the expected rows."""

from icecdc.demo import row_differences

EXPECTED = [(1, "eu", 10), (2, "us", 20), (3, "apac", 30)]


def test_equal_rows_have_no_differences():
    assert row_differences(EXPECTED, list(EXPECTED)) == []


def test_missing_extra_and_changed_rows_are_each_named_with_examples():
    actual = [(1, "eu", 10), (2, "us", 21), (4, "latam", 40)]
    assert row_differences(EXPECTED, actual) == [
        "1 rows missing, e.g. [(3, 'apac', 30)]",
        "1 rows that should not be there, e.g. [(4, 'latam', 40)]",
        "1 rows with other values, e.g. expected (2, 'us', 20), found (2, 'us', 21)",
    ]


def test_a_key_held_twice_is_a_difference_even_when_one_copy_is_right():
    assert row_differences(EXPECTED, [*EXPECTED, (3, "apac", 30)]) == ["1 keys held more than once"]


def test_examples_are_bounded():
    (missing,) = row_differences([(k, k) for k in range(100)], [], examples=2)
    assert missing == "100 rows missing, e.g. [(0, 0), (1, 1)]"
