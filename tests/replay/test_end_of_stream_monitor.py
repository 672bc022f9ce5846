"""A replay's monitor read at the end only skips the probes a later one replaces, and reports the
figures of the monitor that probes every time; a stream that ends early is probed when read."""

from __future__ import annotations

import numpy as np

from sketchrec.cli.config import MonitorSettings
from sketchrec.models import SketchMF
from sketchrec.privacy.monitor import PrivacyMonitor
from sketchrec.replay.monitor import EndOfStreamMonitor

# uneven batches, 1,030 ratings: the last probe comes before the last batch is learned
SIZES = [70, 130, 45, 300, 10, 200, 95, 150, 30]


def stream(monitors, sizes=SIZES):
    """Learn the batches on one model, every monitor fed each batch; the model."""
    rng = np.random.default_rng(4)
    model = SketchMF(capacity=400, dim=4, seed=1)
    for n in sizes:
        keys = [model.id_keys.as_keys(rng.integers(1, 200, n)) for _ in range(2)]
        ratings = rng.integers(1, 6, n).astype(float)
        predictions = model.learn_many(*keys, ratings)
        for monitor in monitors:
            monitor.observe(model, *keys, ratings, predictions)
    return model


def test_the_figures_are_those_of_a_monitor_probing_every_time():
    full = PrivacyMonitor(window=300, reservoir=50, probe_every=100, seed=2)
    skipping = EndOfStreamMonitor(sum(SIZES), window=300, reservoir=50, probe_every=100, seed=2)
    stream([full, skipping])
    assert skipping.figures() == full.figures()
    assert skipping.figures()["seen_sample"] == 50
    assert skipping.probes == 1   # of the full monitor's seven


def test_the_broken_variant_that_probes_once_at_the_end_reports_another_sample():
    class AtTheEnd(EndOfStreamMonitor):
        def probe(self, model):   # every probe left to the reading: the model has learned more
            self._since_probe, self._pending = 0, model
    full = PrivacyMonitor(window=300, reservoir=50, probe_every=100, seed=2)
    late = AtTheEnd(sum(SIZES), window=300, reservoir=50, probe_every=100, seed=2)
    stream([full, late])
    assert late.figures()["seen_error_mean"] != full.figures()["seen_error_mean"]


def test_a_stream_that_ends_early_is_probed_when_read():
    skipping = EndOfStreamMonitor(10 * sum(SIZES), window=300, reservoir=50, probe_every=100, seed=2)
    model = stream([skipping])
    assert skipping.probes == 0
    figures = skipping.figures()   # probed now, with the model as it ends
    now = PrivacyMonitor(window=300, reservoir=50, probe_every=100, seed=2)
    stream([now])
    now.probe(model)
    assert figures["seen_sample"] == 50 and figures == now.figures()


def test_replay_skips_only_when_nothing_reads_the_figures_during_the_stream():
    assert isinstance(MonitorSettings().build(0, 1_000), EndOfStreamMonitor)
    assert type(MonitorSettings().build(0)) is PrivacyMonitor                  # served
    assert type(MonitorSettings(alert=0.5).build(0, 1_000)) is PrivacyMonitor  # alerts
    assert MonitorSettings(enabled=False).build(0, 1_000) is None
