"""Runs of one session on several threads at once, checked against the same runs one at a time."""

from __future__ import annotations

import sys
import threading

import numpy as np


def assert_threads_agree(sess, name: str, inputs: list[np.ndarray], rounds: int, threads: int = 4) -> None:
    """Feed each of ``inputs`` as ``name`` ``rounds`` times, split over ``threads`` threads that
    switch inside runs (a switch interval of 1 us), and require every output to equal, bit for
    bit, the same input's run on this thread beforehand: kernels that keep scratch arrays between
    runs must not share them between runs at once."""
    want = [sess.run(None, {name: x}) for x in inputs]
    runs: list[int] = []
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for _ in range(rounds):
                for j in range(i, len(inputs), threads):
                    for a, b in zip(sess.run(None, {name: inputs[j]}), want[j]):
                        np.testing.assert_array_equal(a, b)
                    runs.append(j)
        except BaseException as e:  # noqa: BLE001 (handed to the test's thread)
            errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch inside runs, not only between them
    try:
        run_threads(worker, threads)
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[0]
    assert len(runs) == rounds * len(inputs)


def run_threads(work, count: int) -> None:
    """``work(i)`` on ``count`` threads, i = 0 .. count - 1, all started, then all joined."""
    pool = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
