"""The privacy monitor of a replay whose figures are read once, at the end of the stream.

A monitor re-predicts its reservoir of learned ratings every ``probe_every`` ratings, and each
probe replaces the last one's seen-error sample. When nothing reads the figures before the end
(no server, no dashboard, no alert threshold), only the last probe is ever seen: a probe that a
later one will certainly replace is skipped, which is most of the monitor's time in a long
replay, and the figures at the end are the same.
"""

from __future__ import annotations

from sketchrec.privacy.monitor import PrivacyMonitor


class EndOfStreamMonitor(PrivacyMonitor):
    """A ``PrivacyMonitor`` for a stream of ``total`` ratings whose figures are read at its end
    only: a probe is skipped while at least ``probe_every`` ratings remain (another probe then
    comes, and replaces its sample). A stream that ends early (interrupted) is probed when its
    figures are read, with the model as it is then.

    Parameters
    ----------
    total : the ratings the stream will bring (fewer is safe: a probe is then skipped less often)
    **settings : ``PrivacyMonitor``'s (window, reservoir, probe_every, seed); no alert threshold,
        since an alert is read during the stream

    Examples
    --------
    >>> import numpy as np
    >>> from sketchrec.models import SketchMF
    >>> model, ids = SketchMF(capacity=50, dim=4), np.arange(1, 9)
    >>> full, skipping = PrivacyMonitor(probe_every=8), EndOfStreamMonitor(24, probe_every=8)
    >>> for _ in range(3):
    ...     keys = model.id_keys.as_keys(ids)
    ...     predictions = model.learn_many(keys, keys, np.full(8, 3.0))
    ...     for monitor in (full, skipping):
    ...         monitor.observe(model, keys, keys, np.full(8, 3.0), predictions)
    >>> skipping.probes, skipping.figures() == full.figures()
    (1, True)
    """

    def __init__(self, total: int, **settings) -> None:
        super().__init__(**settings)
        self.remaining, self.probes = int(total), 0
        self._pending = None   # the model of a skipped probe not yet replaced by a later one

    def observe(self, model, ukeys, ikeys, ratings, predictions) -> None:
        self.remaining -= len(ratings)
        super().observe(model, ukeys, ikeys, ratings, predictions)

    def probe(self, model) -> None:
        if self.remaining >= self.probe_every:   # a later probe replaces this one's sample
            self._since_probe, self._pending = 0, model
            return
        self._pending, self.probes = None, self.probes + 1
        super().probe(model)

    def figures(self) -> dict:
        if self._pending is not None:   # the stream ended before the probe that replaces it
            model, self._pending = self._pending, None
            super().probe(model)
        return super().figures()
