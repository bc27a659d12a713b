"""The benches' CPU readings from /proc: the JIT compilers' share of a JVM's, thread by thread."""

from __future__ import annotations

import pytest

from benchmarks.harness import JIT_THREAD, jit_cpu_between, jit_cpu_seconds


def test_the_jit_threads_are_told_by_their_names():
    assert JIT_THREAD.match("C2 CompilerThre") and JIT_THREAD.match("C1 CompilerThre")
    assert not JIT_THREAD.match("GC Thread#0") and not JIT_THREAD.match("Thread-4")


def test_jit_cpu_between_two_readings_counts_thread_by_thread_and_never_negative():
    before = {"11": 5.0, "12": 3.0}
    # 11 compiled 0.5 s more, 12 ended (its 3 s are not taken back), 13 started and compiled 0.2 s.
    assert jit_cpu_between(before, {"11": 5.5, "13": 0.2}) == pytest.approx(0.7)
    assert jit_cpu_between(before, before) == 0.0


def test_a_process_without_jit_threads_reads_none():
    assert jit_cpu_seconds("self") == {}
