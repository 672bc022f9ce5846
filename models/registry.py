"""The model classes by name, and the defaults the commands and experiments share.

``MODELS`` maps the class name a checkpoint records (``model_class``) to the class.
``DEFAULTS`` are read from ``SketchMF.__init__`` (tuned on ML-100k, see docs/defaults.md), so
they cannot drift from the model; ``DP_DEFAULTS`` are DP-SGD's own, tuned separately.

>>> DEFAULTS["dim"], DP_DEFAULTS["dim"]
(64, 16)
>>> MODELS["SketchMF"].__name__
'SketchMF'
"""

from __future__ import annotations

import inspect

from sketchrec.models.bias_baseline import BiasBaseline
from sketchrec.models.dense_mf import DenseMF
from sketchrec.models.mix import DEFAULT_MEMBERS, Experts
from sketchrec.models.private.fallback import DPSGDFallback
from sketchrec.models.sketch_mf import SketchMF

MODELS: dict[str, type] = {"SketchMF": SketchMF, "DenseMF": DenseMF, "BiasBaseline": BiasBaseline,
                           "Experts": Experts, "DPSGDFallback": DPSGDFallback}

# the tuned hyper-parameters (the others, e.g. seed or capacity, are per run)
_TUNED = ("dim", "depth", "space_gain", "lr", "reg", "bias_reg", "init_std")
DEFAULTS: dict[str, float] = {name: param.default for name, param
                              in inspect.signature(SketchMF.__init__).parameters.items() if name in _TUNED}

# the default learner's (mix's) factor member: its own lr and reg, one pass and epochs
MIX_FACTOR_MEMBER: dict = next(m for m in DEFAULT_MEMBERS if m["model"] == "SketchMF")

# one sketch learner with AdaGrad steps (--model sketch --optimizer adagrad): its eta is
# AdaGrad's, and lr 0.2 / reg 0.085 was the best of a grid over ML-100k and ml-latest-small that
# also holds up over 20 holdout epochs (docs/results.md, "Defaults: how they were chosen")
ADAGRAD_DEFAULTS: dict[str, float] = {**DEFAULTS, "lr": 0.2, "reg": 0.085}

# DP-SGD was tuned on its own (d, lr, reg); it keeps no heavy-hitter filter (membership in it is
# decided by the data, which its accountant does not cover)
DP_DEFAULTS: dict[str, float] = {"lr": 0.01, "dim": 16, "reg": 0.1, "clip": 1.0, "batch": 1000,
                                 "delta": 1e-5}
