"""numba's NumPy generator given a whole state from fresh entropy (SGLD's noise).

The SGLD kernels draw their noise from numba's own MT19937, one state per thread. numba's
``np.random.seed`` takes a 32-bit seed: a batch's noise would then be one of 2**32 streams, which
whoever holds the model before and after that batch could search for and subtract. ``set_state``
gives the calling thread's generator a whole state (624 words) instead, through
``numba._helperlib.rnd_set_state``: an internal (numba's own tests set states with it), so it is
used only on the numba versions it was checked on; on any other the state is seeded from 32 of
the words, and ``whole`` says so (the caller logs it once).

>>> import numpy as np
>>> words = np.arange(WORDS, dtype=np.uint32)
>>> _ = set_state(words); first = draw()
>>> _ = set_state(words); draw() == first        # the words are the whole state
True
"""

from __future__ import annotations

import numpy as np
from numba import njit

CHECKED = ("0.68.",)
WORDS = 624   # MT19937's state


@njit(cache=True)
def _seed32(seed):
    np.random.seed(seed)


@njit(cache=True)
def draw() -> float:
    """One standard normal from the calling thread's numba generator (for the tests)."""
    return np.random.standard_normal()


def whole() -> bool:
    """Whether ``set_state`` sets the whole state on this numba (else a 32-bit seed)."""
    import numba
    return numba.__version__.startswith(CHECKED)


def set_state(words: np.ndarray) -> bool:
    """The calling thread's numba generator set from ``words`` (``WORDS`` uint32 values, fresh
    secret entropy); returns whether the whole state was set (``whole``)."""
    words = np.asarray(words, dtype=np.uint32)
    if words.shape != (WORDS,):
        raise ValueError(f"set_state takes {WORDS} words, not {words.shape}")
    if not whole():
        _seed32(int(words[0]))
        return False
    from numba import _helperlib   # internal: the one place it is used (see the module docstring)
    _helperlib.rnd_set_state(_helperlib.rnd_get_np_state_ptr(), (WORDS, [int(w) for w in words]))
    return True
