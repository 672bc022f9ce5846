"""Learners that keep their parameters in sketches (and the dense baseline). No I/O.

The names below load on first use (PEP 562): a process that needs one learner (a serving reader
answering from a ``SketchMF``) does not import the dense baseline's river and scipy.
"""

import importlib

_WHERE = {"DenseMF": "sketchrec.models.dense_mf", "SketchMF": "sketchrec.models.sketch_mf"}

__all__ = ["DenseMF", "SketchMF"]


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
