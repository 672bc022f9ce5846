"""Probabilistic data structures: numpy-backed, seeded, mergeable, serialisable. No I/O."""

from sketchrec.sketches.bloom import BloomFilter
from sketchrec.sketches.count_min import CountMinSketch, HeavyHitters
from sketchrec.sketches.count_sketch import CountSketch, width_for_space_gain
from sketchrec.sketches.hashing import key_of, keys_of, pair_keys

__all__ = ["BloomFilter", "CountMinSketch", "CountSketch", "HeavyHitters", "key_of", "keys_of",
           "pair_keys", "width_for_space_gain"]
