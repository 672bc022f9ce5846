"""Which ids a fleet member announces (``stream.fleet.announce``), against the rule written out
key by key: every sighting counted, each segment's distinct ids taken in key order."""

import numpy as np
import pytest

from sketchrec.models.heavy_filter import _FAMILY_SALT, WAYS
from sketchrec.sketches import BloomFilter, CountMinSketch
from sketchrec.stream.fleet.announce import FREE, announce_ids, due_after, free_ways


def _by_rule(segments, families, cms, bloom, admit_after, slot_families):
    """The rule one key at a time: (key, family) announced, in order."""
    out = []
    for keys, family in zip(segments, families):
        salt = _FAMILY_SALT[family]
        for key in keys:   # one sighting at a time
            cms.add_many(np.array([key ^ salt], np.uint64))
        threshold = due_after(admit_after, cms.total, max(1, len(slot_families)))
        distinct = np.unique(keys)
        ready = (cms.estimate_many(distinct ^ salt) >= threshold) | free_ways(distinct, family,
                                                                              slot_families)
        for key in distinct[ready]:
            if not bloom.contains_many(np.array([key ^ salt], np.uint64))[0]:
                bloom.add_many(np.array([key ^ salt], np.uint64))
                out.append((int(key), family))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_announcements_follow_the_rule_key_by_key(seed):
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 2**64, 300, dtype=np.uint64)
    # segments whose keys repeat (a user's ratings come together), of uneven lengths, one empty
    segments = [pool[rng.zipf(1.3, n) % len(pool)] for n in (500, 40, 0, 1200, 7, 300)]
    families = [0, 1, 0, 1, 0, 1]
    slot_families = np.ones(16 * WAYS, np.uint8)   # every way taken but one in 4 buckets
    slot_families[::4 * WAYS] = FREE
    state = [(CountMinSketch(width=4096, depth=3, seed=7), BloomFilter(512, 0.01, seed=8))
             for _ in range(2)]
    expected = _by_rule(segments, families, *state[0], 3, slot_families)
    cms, bloom = state[1]
    keys = np.concatenate(segments)
    out_keys, out_families = np.empty(len(keys), np.uint64), np.empty(len(keys), np.uint8)
    n, total = announce_ids(keys, np.cumsum([len(s) for s in segments]),
                            np.array(families, np.uint8), _FAMILY_SALT, cms.cells, cms._salts,
                            0, 3, slot_families, bloom.cells, bloom._salt1, bloom._salt2,
                            bloom.n_hashes, bloom.m_bits, out_keys, out_families)
    assert list(zip(out_keys[:n].tolist(), out_families[:n].tolist())) == expected
    assert total == state[0][0].total
    assert (cms.cells == state[0][0].cells).all() and (bloom.cells == state[0][1].cells).all()
    seen = {(key, family) for keys, family in zip(segments, families) for key in keys.tolist()}
    assert 0 < n < len(seen) / 2   # some announced, most not: a rule that tells them apart
