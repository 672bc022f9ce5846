"""numba's IR inlining, made faster (sketchrec/_fast_inline): a helper's untyped IR is built once
per helper, not once per call site, and the kernels it compiles into compute what numba's own
inlining gives."""

from numba import njit
from numba.core import inline_closurecall as icc

from sketchrec import _fast_inline


@njit(inline="always")
def _leaf(x):
    return x * 3 + 1


@njit(inline="always")
def _mid(x, out):
    for i in range(out.shape[0]):   # a loop and a nested inline: several blocks, a scope to copy
        out[i] += _leaf(x + i)
    return _leaf(x) - _leaf(x + 1)


def _kernel_source():
    import numpy as np

    def kernel(n):
        out = np.zeros(3)
        total = 0
        for x in range(n):   # _mid inlined at three sites, _leaf at nine
            total += _mid(x, out) + _mid(x + 1, out) + _mid(x + 2, out)
        return total, out.sum()
    return kernel


def test_a_helper_is_built_once_and_the_kernel_computes_what_numba_computes(monkeypatch):
    assert _fast_inline.install()   # the numba this project pins is a checked one
    built = []
    real = _fast_inline.run_untyped   # numba's own, kept by install()
    monkeypatch.setattr(_fast_inline, "run_untyped", lambda *a: built.append(a[1].__name__) or real(*a))
    patched = njit(_kernel_source())(20)
    assert sorted(built) == ["_leaf", "_mid"]   # once each (numba's: 3 _mid and 9 _leaf builds)
    assert patched == _kernel_source()(20)      # the same numbers as the plain Python


def test_the_patch_is_in_place_before_any_kernel_compiles():
    import sketchrec   # noqa: F401 (its import chooses the kernel cache and installs the patch)
    assert getattr(icc.InlineWorker, "_sketchrec", False)
