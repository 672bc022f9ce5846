"""Faster IR inlining in numba's compiler (compile time only: the generated code is the same).

Our kernels IR-inline (``@njit(inline="always")``) small helpers that themselves inline others.
numba's ``InlineWorker`` then spends much of a first run's compilation in two places that grow
faster than a helper's size: at every call site it rebuilds the helper's IR from bytecode (the
untyped pipeline, with the helper's own inlining), and it copies that IR block by block, each
block's deep copy taking its own copy of the helper's whole variable scope. Here a helper's
untyped IR is built once (per helper and the two pipeline flags the untyped passes read) and
handed to every call site (``inline_ir`` copies its input before changing anything), and the
blocks of one IR copied inside ``inline_ir`` share one memo: one scope copy for all of them, as
numba builds an IR in the first place.

Installed only on the numba versions it was checked on; any other keeps numba's own code (the
same kernels, compiled more slowly).
"""

from __future__ import annotations

import copy
import types

CHECKED = ("0.68.",)
run_untyped = inline_ir = None   # numba's own, kept by install()
_built: dict = {}
_memos: list[dict] = []   # per running inline_ir: a deep-copy memo per source scope


def install() -> bool:
    """Patch numba's ``InlineWorker``; returns whether it is patched."""
    global run_untyped, inline_ir
    import numba
    from numba.core import inline_closurecall as icc
    if getattr(icc.InlineWorker, "_sketchrec", False):
        return True
    if not numba.__version__.startswith(CHECKED):
        return False
    from numba.core import ir

    def deepcopy(x, memo=None):
        if memo is None and _memos and isinstance(x, ir.Block):
            memo = _memos[-1].setdefault(id(x.scope), {})
        return copy.deepcopy(x, memo)

    icc.copy = types.SimpleNamespace(deepcopy=deepcopy, copy=copy.copy)   # its only uses of copy
    run_untyped, inline_ir = icc.InlineWorker.run_untyped_passes, icc.InlineWorker.inline_ir
    icc.InlineWorker.inline_ir = _inline_ir
    icc.InlineWorker.run_untyped_passes = _run_untyped_once
    icc.InlineWorker._sketchrec = True
    return True


def _inline_ir(self, *args, **kwargs):
    _memos.append({})
    try:
        return inline_ir(self, *args, **kwargs)
    finally:
        _memos.pop()


def _run_untyped_once(self, func, enable_ssa=False):
    key = (func, enable_ssa, bool(self.flags.no_rewrites))
    if key not in _built:
        _built[key] = run_untyped(self, func, enable_ssa)
    self.flags.enable_ssa = enable_ssa   # as numba's own does to the caller's flags, built or not
    return _built[key]
