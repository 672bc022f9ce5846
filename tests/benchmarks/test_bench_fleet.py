"""The fleet benchmark's CPU accounting: a member's CPU-seconds between two moments, from samples
of /proc (the benchmark itself needs a broker and minutes: `sketchrec bench fleet`)."""

import os
import time

import pytest

from sketchrec.benchmarks.fleet import cpu_between, cpu_seconds


def test_cpu_between_interpolates_the_samples_at_the_learning_span():
    samples = [(10.0, 1.0), (11.0, 1.5), (12.0, 3.5), (13.0, 3.6)]
    # start-up before 10.5 and the idle tail after 12.0 are not counted
    assert cpu_between(samples, 10.5, 12.0) == pytest.approx(3.5 - 1.25)
    assert cpu_between(samples, None, 12.0) == 0.0 and cpu_between([], 10.0, 12.0) == 0.0


def test_cpu_seconds_counts_this_process_work_and_nothing_once_gone():
    before = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:   # burn CPU, measured by CPU (not wall) time
        pass
    assert cpu_seconds(os.getpid()) - before >= 0.2
    assert cpu_seconds(2 ** 22 + 7) is None   # beyond pid_max's default: no such process
