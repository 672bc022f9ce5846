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
from sketchrec.sketches.hashing import mix64

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
    n_slots = max(1, slot_families.shape[0])
    longest, start = 0, 0
    for seg in range(ends.shape[0]):
        longest, start = max(longest, ends[seg] - start), ends[seg]
    table = _table(longest)
    n_out, start = 0, 0
    for seg in range(ends.shape[0]):
        end, salt = ends[seg], family_salt[families[seg]]
        if end == start:
            continue
        # a segment's keys repeat (a user's ratings come together): counted per distinct key,
        # which adds the same integers to the count-min as one by one, and only the distinct
        # ones sorted (sorting every key was most of the announcing)
        n = _count_distinct(keys[start:end], table)
        found, counts = table[1][:n], table[2][:n]
        count_min._add_many(cms_cells, cms_salts, found ^ salt, counts, False)
        total += end - start
        threshold = due_after(admit_after, total, n_slots)
        distinct = np.sort(found) ^ salt
        estimates = np.empty(n, np.int64)
        count_min._estimate_many(cms_cells, cms_salts, distinct, estimates)
        ready = estimates >= threshold
        if not ready.all():   # first sightings into a free way (RAP's free slot)
            ready |= free_ways(distinct ^ salt, families[seg], slot_families)
        due = distinct[ready]
        known = np.empty(due.shape[0], np.bool_)
        bloom._contains_many(words, due, salt1, salt2, n_hashes, m_bits, known)
        due = due[~known]
        bloom._add_many(words, due, salt1, salt2, n_hashes, m_bits)
        for k in due:
            out_keys[n_out], out_families[n_out] = k ^ salt, families[seg]
            n_out += 1
        start = end
    return n_out, total


@njit(inline="always", cache=True)
def _table(longest):
    """An open-addressing table for segments of up to ``longest`` keys, at most half full:
    (the slot each distinct key took, the distinct keys, their counts, each slot's entry + 1,
    0 when empty)."""
    size = 1
    while size < 2 * longest:
        size *= 2
    return (np.empty(longest, np.int64), np.empty(longest, np.uint64), np.empty(longest, np.int64),
            np.zeros(size, np.int64))


@njit(inline="always", cache=True)
def _count_distinct(keys, table):
    """The distinct keys, first seen first, and how often each occurs, into the table's arrays
    (its slots are left empty again); how many."""
    taken, distinct, counts, entry = table
    mask = np.uint64(entry.shape[0] - 1)
    n = 0
    for key in keys:
        at = mix64(key) & mask
        while entry[at] and distinct[entry[at] - 1] != key:
            at = (at + np.uint64(1)) & mask
        if entry[at] == 0:
            distinct[n], counts[n], taken[n] = key, 0, at
            n += 1
            entry[at] = n
        counts[entry[at] - 1] += 1
    for i in range(n):
        entry[taken[i]] = 0
    return n
