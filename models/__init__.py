"""Learners that keep their parameters in sketches (and the dense baseline). No I/O."""

from models.dense_mf import DenseMF
from models.sketch_mf import SketchMF

__all__ = ["DenseMF", "SketchMF"]
