"""Third-party internals, guarded by the versions they were read in.

A few features reach into a library's private objects because it has no public API for what they
need (kafka-python's record reader and connections: ``stream.kafka.internals``; uvicorn's HTTP
protocols: ``stream.serving.server``). Each library's reaches live in one module, behind one
``Checked``: the versions whose source they were read against. On any other version each feature
takes the library's public path instead and says so once, in one log line, so an upgrade loses a
speed-up or a figure but never reads changed internals into a wrong result.

>>> guard = Checked("demo", (1, 2), (1, 4), lambda: "1.5.0")
>>> guard.checked("1.2.9"), guard.checked("1.4.0"), guard.checked("1.5.0"), guard.checked("x")
(True, True, False, False)
>>> guard.usable("fast path", "the slow path"), sorted(guard.said)
(False, ['fast path'])
"""

from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger("sketchrec.versions")


class Checked:
    """The versions of ``library`` (``lowest`` to ``highest``, major.minor, both included) whose
    internals a module reaches; ``installed()`` says which version is installed.

    Parameters
    ----------
    library:
        The distribution's name, for the log line.
    lowest, highest:
        (major, minor) of the oldest and newest version read.
    installed:
        Returns the installed version's text (called at each check, so a test can pretend).

    Examples
    --------
    >>> Checked("kafka-python", (3, 0), (3, 0), lambda: "3.0.12").usable("reader", "the library's")
    True
    """

    def __init__(self, library: str, lowest: tuple[int, int], highest: tuple[int, int],
                 installed: Callable[[], str]):
        self.library, self.lowest, self.highest, self.installed = library, lowest, highest, installed
        self.said: set[str] = set()   # features whose fallback was logged (once per process)

    def checked(self, version: str | None = None) -> bool:
        """Whether ``version`` (default: the installed one) is within the versions read."""
        parts = (self.installed() if version is None else version).split(".")
        try:
            major_minor = (int(parts[0]), int(parts[1]))
        except (IndexError, ValueError):
            return False
        return self.lowest <= major_minor <= self.highest

    def span(self) -> str:
        low, high = (f"{a}.{b}" for a, b in (self.lowest, self.highest))
        return f"{low}.x" if low == high else f"{low}-{high}.x"

    def usable(self, feature: str, fallback: str) -> bool:
        """True on a version read; otherwise False and, once per feature, one log line saying the
        version, the feature not used and what is done instead."""
        if self.checked():
            return True
        if feature not in self.said:
            self.said.add(feature)
            log.warning("event=internals library=%s version=%s checked=%s feature=%r fallback=%r",
                        self.library, self.installed(), self.span(), feature, fallback)
        return False
