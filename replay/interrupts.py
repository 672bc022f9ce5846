"""Ctrl-C between batches, never inside one.

A served replay's batch is learned in steps: the model's kernel (after which /stats counts the
batch), then the serving structures (catalogue, popularity, Bloom filters) and the errors. A
KeyboardInterrupt raised between those steps left the batch learned by the model but missing
from the replay's summary ("0 learned" while /stats said 100). So the protocol learns each batch
whole: a SIGINT that arrives during a batch is held until the batch is counted, then raised; a
second SIGINT during the same batch is raised at once (the operator insists).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def batch_whole() -> Iterator[None]:
    """Run the body with SIGINT held until it ends, then deliver it as the previous handler
    would (the default one raises KeyboardInterrupt). Outside the main thread, or when SIGINT is
    ignored or left to the OS, the body runs as it is (no Python handler to defer).

    Examples
    --------
    >>> with batch_whole():
    ...     learned = 100   # a held Ctrl-C is raised here, after the batch is counted
    >>> learned
    100
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return
    held: list[int] = []

    def hold(signum, frame):
        if held:   # a second Ctrl-C within one batch: stop now
            previous(signum, frame)
        held.append(signum)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        previous(held[0], None)
