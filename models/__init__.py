"""Learners that keep their parameters in sketches (and the dense baseline). No I/O."""

from sketchrec.models.dense_mf import DenseMF
from sketchrec.models.sketch_mf import SketchMF
from sketchrec.models.steps import SGD, SGLD, AdaGrad, AdaGradId

__all__ = ["SGD", "SGLD", "AdaGrad", "AdaGradId", "DenseMF", "SketchMF"]
