"""Two machine-level helpers for the learner's kernel, written as numba intrinsics (LLVM IR).

``borrow(a)``: the same array with no reference count. numba counts references to an array with
an atomic add on its meminfo at every copy (a view, a tuple of arrays indexed by a runtime
position, an argument handed to an inlined helper) and drops the pairs it can prove redundant,
but not in a loop as large as the learner's: there, many atomic adds per rating remained,
each a full memory barrier that waits for the rating's pending stores. On an array without a
meminfo numba's increments and decrements test a null pointer and return. A kernel borrows only
what its caller holds for the whole call (its arguments): a borrowed array must not outlive it.

``prefetch(a, index)``: ask the CPU for the cache line of ``a[index]`` ahead of its use (LLVM's
``llvm.prefetch``; a hint that changes no value). The learner asks for the slots and sketch cells
of the ratings a few places ahead, so their loads overlap the current rating's arithmetic.

>>> import numpy as np
>>> from numba import njit
>>> @njit
... def first(a):
...     b = borrow(a)
...     prefetch(b, (0, 1))
...     b[0, 1] = 7.0
...     return b[0].sum()
>>> a = np.zeros((2, 3))
>>> float(first(a)), float(a[0, 1])
(7.0, 7.0)
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_PARTS = ("parent", "nitems", "itemsize", "data", "shape", "strides")


@intrinsic
def borrow(typingctx, array):
    """``array`` without its meminfo (module docstring); the caller keeps the array alive."""
    if not isinstance(array, types.Array):
        return None

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        source = context.make_array(aryty)(context, builder, args[0])
        borrowed = context.make_array(aryty)(context, builder)
        for part in _PARTS:
            setattr(borrowed, part, getattr(source, part))
        borrowed.meminfo = context.get_constant_null(types.MemInfoPointer(aryty.dtype))
        return borrowed._getvalue()

    return array(array), codegen


@intrinsic
def prefetch(typingctx, array, index):
    """Hint: fetch the cache line of ``array[index]`` (an int, or a tuple of ints for a 2-d array;
    no bounds check, no effect on any value)."""
    ndim = len(index) if isinstance(index, types.BaseTuple) else 1
    if not (isinstance(array, types.Array) and array.ndim == ndim):
        return None

    def codegen(context, builder, signature, args):
        aryty, indexty = signature.args
        view = context.make_array(aryty)(context, builder, args[0])
        if isinstance(indexty, types.BaseTuple):
            where = [context.cast(builder, v, t, types.intp)
                     for v, t in zip(cgutils.unpack_tuple(builder, args[1]), indexty)]
        else:
            where = [context.cast(builder, args[1], indexty, types.intp)]
        at = cgutils.get_item_pointer(context, builder, aryty, view, where, wraparound=False,
                                      boundscheck=False)
        byte = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32]), "llvm.prefetch.p0i8")
        # read (0), keep in all cache levels (3), data cache (1)
        builder.call(fn, [builder.bitcast(at, byte), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(array, index), codegen
