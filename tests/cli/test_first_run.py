"""The first run: compiling the kernels is a step of its own before the timed loop, so the
throughput a run reports never includes compilation."""

from __future__ import annotations

import sys

import pytest

from sketchrec.cli.config import ReplayConfig
from sketchrec.cli.replay import build_parser, execute, prepare


def _signatures() -> dict[str, int]:
    """Compiled (or cache-loaded) signatures of every numba kernel of the package loaded so far."""
    from numba.core.registry import CPUDispatcher
    found = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("sketchrec") and module is not None:
            for attr, value in vars(module).items():
                if isinstance(value, CPUDispatcher):
                    found[f"{name}.{attr}"] = len(value.signatures)
    return found


# 24000 ratings: past the privacy monitor's first probe, which re-predicts learned ratings
@pytest.mark.parametrize("options", [[], ["--synthetic-ratings", "24000"], ["--no-monitor"],
                                     ["--model", "sketch"], ["--model", "dense"],
                                     ["--holdout", "0.2", "--epochs", "2"],
                                     ["--holdout", "0.2", "--epochs", "2", "--model", "sketch"]])
def test_no_kernel_is_compiled_inside_the_timed_loop(monkeypatch, options):
    import sketchrec.replay.protocols as protocols
    seen = {}
    protocol = "holdout" if "--holdout" in options else "prequential"
    timed = getattr(protocols, protocol)

    def watched(*args, **kwargs):
        seen["before"] = _signatures()
        out = timed(*args, **kwargs)
        seen["after"] = _signatures()
        return out
    monkeypatch.setattr(protocols, protocol, watched)
    args = build_parser("replay").parse_args(["--synthetic-ratings", "3000", "--synthetic-users", "100",
                                              "--synthetic-items", "50", "--quiet", *options])
    execute(prepare(ReplayConfig.from_args(args, "replay")))
    before, after = seen["before"], seen["after"]
    grown = {k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)}
    assert grown == {}, f"compiled while timed: {grown}"


def test_the_check_sees_a_kernel_first_called_in_the_loop():
    # the test above would pass vacuously if _signatures missed the package's kernels
    import numpy as np

    from sketchrec.privacy import monitor
    before = _signatures()
    assert "sketchrec.privacy.monitor._ring_push" in before
    monitor._ring_push(np.zeros(4), 0, np.zeros(2, dtype=np.float32), 0)   # a new signature
    assert _signatures()["sketchrec.privacy.monitor._ring_push"] == before[
        "sketchrec.privacy.monitor._ring_push"] + 1
