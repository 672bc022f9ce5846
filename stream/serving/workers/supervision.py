"""How a reader process makes sure it never outlives its learner (nor holds the port after it).

Two independent guards, since either alone has a gap:

- ``die_with_parent``: the kernel SIGKILLs the reader when the thread that started it ends
  (Linux ``prctl(PR_SET_PDEATHSIG)``); a parent that died before the call is caught by comparing
  the parent pid with the one the learner passed down. Immediate, but only for the process that
  started the reader, and Linux only.
- ``orphaned`` (polled by the reader's follower thread): the learner named in the block's header
  is gone (no such pid, or a zombie), or its heartbeat in the block is older than ``WATCHDOG_S``:
  covers a reader started by another process, other platforms, and a learner frozen for good.
  A learner that is stopped for less than ``WATCHDOG_S`` keeps its readers, which answer
  /healthz 503 meanwhile (``reader.ReplicaHealth``).

Until its server takes over the signals, a reader ends quietly on SIGINT or SIGTERM
(``quiet_signals``): a Ctrl-C or a stop during start-up prints no KeyboardInterrupt traceback.

>>> learner_alive(os.getpid()), learner_alive(None)
(True, True)
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1     # <sys/prctl.h>
WATCHDOG_ENV = "SKETCHREC_READER_WATCHDOG_S"
WATCHDOG_S = 30.0        # a learner without a heartbeat this long is taken for dead


def die_with_parent(expected_parent: int | None) -> bool:
    """Ask the kernel to SIGKILL this process when its parent ends; False when the parent is
    already gone (it is not ``expected_parent`` any more): the caller exits at once."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass   # no prctl: the watchdog still ends the reader
    return expected_parent is None or os.getppid() == expected_parent


def quiet_signals() -> None:
    """End this process at once and silently on SIGINT or SIGTERM (it holds nothing to save:
    the shared block is the learner's)."""
    def leave(signum, frame):
        os._exit(0)

    signal.signal(signal.SIGINT, leave)
    signal.signal(signal.SIGTERM, leave)


def learner_alive(pid: int | None) -> bool:
    """Whether process ``pid`` runs (a zombie does not; None: unknown, taken as alive)."""
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True   # it exists, under another user
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return True   # no procfs: the signal check said it exists


def watchdog_s() -> float:
    """The heartbeat age after which the learner is taken for dead (``$SKETCHREC_READER_WATCHDOG_S``)."""
    try:
        return float(os.environ.get(WATCHDOG_ENV, WATCHDOG_S))
    except ValueError:
        return WATCHDOG_S


def orphaned(block, limit: float) -> str | None:
    """Why this reader's learner is gone (None: it is not): its process ended, or its heartbeat
    is older than ``limit`` seconds."""
    pid = block.header.get("learner_pid")
    if not learner_alive(pid):
        return f"learner {pid} ended"
    age = block.heartbeat_age()
    if age > limit:
        return f"no heartbeat from learner {pid} for {age:.0f} s"
    return None


PARENT_ENV = "SKETCHREC_READER_PARENT"   # the pid of the process that started the reader


def guard() -> None:
    """A reader's first steps: quiet signals, then die with the parent (exit now if it is gone)."""
    quiet_signals()
    parent = os.environ.get(PARENT_ENV)
    if not die_with_parent(int(parent) if parent and parent.isdigit() else None):
        os._exit(0)


if __name__ == "__main__":
    # started by path (``WorkerPool``): the guards run before the package's imports (seconds of
    # numba start-up during which a reader would hold the port of a learner already gone)
    del sys.path[0]   # this folder: its module names must not shadow others
    guard()
    from sketchrec.stream.serving.workers.reader import reader_main
    sys.exit(reader_main(sys.argv[1:]))
