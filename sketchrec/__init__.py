"""sketchrec: a privacy-aware, streaming recommender whose latent factors live in a count sketch.

The repository's product folders are this package's subpackages (see pyproject.toml
``[tool.setuptools.package-dir]``): ``sketchrec.sketches`` (data structures), ``sketchrec.models``
(learners), ``sketchrec.privacy`` (mechanisms, accounting, leakage), ``sketchrec.stream`` (sources,
Kafka, checkpoints, serving) and ``sketchrec.replay`` (the commands and evaluation protocols).

>>> from sketchrec import SketchMF
>>> model = SketchMF(dim=8, capacity=100, seed=0)
>>> model.learn_one("alice", "matrix", 5.0)
>>> 0.5 <= model.predict_one("alice", "matrix") <= 5.0
True
"""

from importlib.metadata import PackageNotFoundError, version

from sketchrec import _kernel_cache

_kernel_cache.choose()   # before any kernel module is imported (see its docstring)

# every model kind of models.capabilities, by its class; Mix is the default learner (its class,
# recorded in checkpoints, is models.mix.Experts)
from sketchrec.models import SGD, SGLD, AdaGrad, AdaGradId, DenseMF, SketchMF  # noqa: E402
from sketchrec.models.bias_baseline import BiasBaseline  # noqa: E402
from sketchrec.models.mix import Mix  # noqa: E402
from sketchrec.models.private.fallback import DPSGDFallback  # noqa: E402
from sketchrec.models.private.joint_als import PrivateALS  # noqa: E402


def __getattr__(name: str):
    """``RiverBiasedMF`` on first use (PEP 562): it imports river, and with it scipy, which a
    process learning or serving our own models should not pay for at its start.
    The river kind runs in ``replay`` only (``models.capabilities``), whose model is built on
    the main thread (``cli.config``), so river is never imported first in a thread."""
    if name == "RiverBiasedMF":
        from sketchrec.models.river_adapters import RiverBiasedMF
        return RiverBiasedMF
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


try:
    __version__ = version("sketchrec")
except PackageNotFoundError:  # running from a checkout that was never installed
    __version__ = "0+unknown"

__all__ = ["SGD", "SGLD", "AdaGrad", "AdaGradId", "BiasBaseline", "DPSGDFallback", "DenseMF", "Mix", "PrivateALS", "RiverBiasedMF", "SketchMF",
           "__version__"]
