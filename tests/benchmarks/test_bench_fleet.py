"""The fleet benchmark's CPU accounting: a member's CPU-seconds between two moments, from samples
of /proc (the benchmark itself needs a broker and minutes: `sketchrec bench fleet`)."""

import os
import time

import numpy as np
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


def test_a_members_main_thread_is_told_from_its_other_threads():
    """The share of a member's CPU outside its main thread (its Kafka clients' threads): a thread
    that burns CPU while the main thread waits shows in the process's figure, not the main one's."""
    import threading
    pid, samples = os.getpid(), []
    samples.append((0.0, cpu_seconds(pid), cpu_seconds(pid, pid)))

    def burn():
        deadline = time.thread_time() + 0.3
        while time.thread_time() < deadline:
            pass
    worker = threading.Thread(target=burn)
    worker.start()
    worker.join()
    samples.append((1.0, cpu_seconds(pid), cpu_seconds(pid, pid)))
    assert cpu_between(samples, 0.0, 1.0) >= 0.25 and cpu_between(samples, 0.0, 1.0, column=2) < 0.1


def test_the_in_process_breakdown_counts_every_step_of_the_sync():
    from sketchrec.benchmarks.fleet import sync_breakdown
    from sketchrec.data import SyntheticStream
    data = SyntheticStream(6000, n_users=200, n_items=100, seed=0).all()
    b = sync_breakdown(data, 2, 1000, dim=8)
    assert b["members"] == 2 and b["every"] == 1000
    assert min(b["learn_cpu_us_per_rating"], b["take_cpu_us_per_rating"], b["apply_cpu_us_per_rating"],
               b["plain_cpu_us_per_rating"]) > 0
    # the ratio is the replicas' learning and syncing over the plain learner's learning
    total = b["learn_cpu_us_per_rating"] + b["take_cpu_us_per_rating"] + b["apply_cpu_us_per_rating"]
    assert b["cpu_per_rating_ratio"] == pytest.approx(total / b["plain_cpu_us_per_rating"])
    assert b["delta_bytes_per_rating"] > 0
    # syncing every 1,000 ratings, two replicas predict about as well as one learner
    assert 0.9 < b["rmse_ratio"] < 1.1


def test_the_breakdown_says_how_many_users_and_items_each_delta_carries():
    from sketchrec.benchmarks.fleet import sync_breakdown
    from sketchrec.data import Ratings
    # four users, each member holding two (user mod 2), whose ratings interleave over 300 items
    n = 4000
    rng = np.random.default_rng(3)
    users = np.arange(n) % 4
    items = rng.integers(0, 300, n)
    data = Ratings(users, items, rng.integers(1, 6, n).astype(np.float32), np.arange(n))
    sides = sync_breakdown(data, 2, 500, dim=8)["sides"]
    expected = {"user": [], "item": []}
    for k in range(2):
        part = np.flatnonzero(users % 2 == k)
        for start in range(0, len(part), 500):
            chunk = part[start:start + 500]
            expected["user"].append(len(np.unique(users[chunk])))
            expected["item"].append(len(np.unique(items[chunk])))
    assert sides["ids_per_delta"] == {side: pytest.approx(np.mean(v)) for side, v in expected.items()}
    assert sides["ids_per_delta"]["user"] == 2
    # the four users are rated often enough to be held in slots: their rows travel, a few per delta
    rows = sides["held_rows_per_rating"]
    assert 0 < rows["user"] <= 2 * len(expected["user"]) / n and rows["item"] > rows["user"]


def test_an_unknown_message_form_is_refused_in_one_line_not_left_out(capsys):
    from sketchrec.benchmarks import fleet
    with pytest.raises(SystemExit):
        fleet.main(["--forms", "single,batched"])
    assert "unknown message form(s) single" in capsys.readouterr().err
