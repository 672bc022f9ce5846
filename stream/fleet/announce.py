"""When a fleet member announces an id for a heavy slot (``slots.FleetSlots.announce``).

A plain learner admits by the Randomized Admission Policy (``models.heavy_filter``): an id seen
for the first time takes a free way of its bucket at once, and only a full bucket makes it compete
(replacing the smallest count with probability 1/(c + 1)). A fleet member's announcements follow
the same two cases: at its *first* sighting an id is announced if its bucket has a free way here
(nothing announced fills it yet), else once it has been seen ``due_after`` times in this member's
stream. Whether to announce is a local decision either way: membership is the ``WAYS`` smallest
(key, family) of the announced set, the same on every replica whatever the order the
announcements arrive in, so replicas stay exact. Announcing after a number of sightings only (the
rule before) left the ids of a stream's start, and every id of a sparse stream, in hashed cells
while a plain learner held them in slots: most of what a one-member fleet lost against a plain
learner (docs/fleet.md, "How close to one learner").

>>> from sketchrec.models.heavy_filter import WAYS
>>> families = np.full(2 * WAYS, FREE, np.uint8)        # two buckets, nothing held
>>> bool(free_ways(np.array([5], np.uint64), 1, families)[0])
True
>>> families[:] = 0                                     # every way taken
>>> bool(free_ways(np.array([5], np.uint64), 1, families)[0])
False
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sketchrec.models.heavy_filter import WAYS, _bucket_start
from sketchrec.sketches import bloom, count_min

FREE = 2           # family of an empty slot in fleet mode (find() matches no id to it)


@njit(nogil=True, cache=True)
def due_after(admit_after, sightings, n_slots):
    """``FleetSlots.threshold``'s rule: ``admit_after``, or half the mean sightings per slot."""
    return max(admit_after, -(-sightings // (2 * n_slots)))


@njit(nogil=True, cache=True)
def free_ways(keys, family, slot_families):
    """Whether each id's bucket has a free way (``slot_families``: the heavy filter's)."""
    out = np.zeros(keys.shape[0], np.bool_)
    for n in range(keys.shape[0]):
        start = _bucket_start(keys[n], family, slot_families.shape[0])
        for s in range(start, start + WAYS):
            if slot_families[s] == FREE:
                out[n] = True
                break
    return out


@njit(nogil=True, cache=True)
def announce_ids(keys, ends, families, family_salt, cms_cells, cms_salts, total, admit_after,
             slot_families, words, salt1, salt2, n_hashes, m_bits, out_keys, out_families):
    """``FleetSlots.announce`` over segments of ``keys`` (ending at ``ends``, one family each):
    each segment's keys are counted in the sightings count-min, then its distinct keys (in key
    order) whose count reaches the threshold or whose bucket has a free way, and that the
    announced Bloom filter does not hold, are added to it and written out. Returns (how many,
    the count-min's new total)."""
    ones = np.ones(keys.shape[0], np.int64)
    n_slots = max(1, slot_families.shape[0])
    n_out, start = 0, 0
    for seg in range(ends.shape[0]):
        end, salt = ends[seg], family_salt[families[seg]]
        if end == start:
            continue
        salted = keys[start:end] ^ salt
        count_min._add_many(cms_cells, cms_salts, salted, ones[:end - start], False)
        total += end - start
        threshold = due_after(admit_after, total, n_slots)
        raw = np.sort(keys[start:end])
        distinct = np.empty(raw.shape[0], np.uint64)
        n = 0
        for i in range(raw.shape[0]):
            if i == 0 or raw[i] != raw[i - 1]:
                distinct[n] = raw[i] ^ salt
                n += 1
        counts = np.empty(n, np.int64)
        count_min._estimate_many(cms_cells, cms_salts, distinct[:n], counts)
        ready = counts >= threshold
        if not ready.all():   # first sightings into a free way (RAP's free slot)
            ready |= free_ways(distinct[:n] ^ salt, families[seg], slot_families)
        due = distinct[:n][ready]
        known = np.empty(due.shape[0], np.bool_)
        bloom._contains_many(words, due, salt1, salt2, n_hashes, m_bits, known)
        due = due[~known]
        bloom._add_many(words, due, salt1, salt2, n_hashes, m_bits)
        for k in due:
            out_keys[n_out], out_families[n_out] = k ^ salt, families[seg]
            n_out += 1
        start = end
    return n_out, total
