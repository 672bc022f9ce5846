"""The contract every sketch keeps, run over every public class in ``sketchrec.sketches``.

A stream is a list of (id, weight) pairs. Each ``Case`` says how to feed a stream to one sketch,
how to read its answers and which guarantee those answers keep; the tests below then check, for
every case that defines the verb:

- add then estimate: the answers keep the structure's guarantee for the stream;
- merge: the sketch of two halves, merged, is the sketch of the whole (or keeps the guarantee,
  where the structure only promises that: conservative count-min);
- bytes: ``from_bytes(to_bytes())`` rebuilds an equal sketch that answers and keeps learning alike;
- seeds: the same seed gives the same bytes, another seed hashes differently;
- memory: ``nbytes`` does not move as items arrive.

A new public class in ``sketchrec.sketches`` must get a case (``test_every_public_sketch_class_has_a_case``).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchrec.sketches
from sketchrec.sketches import BloomFilter, CountMinSketch, CountSketch, HeavyHitters, key_of
from sketchrec.sketches.base import Sketch
from sketchrec.sketches.cosine import CosineSketch
from sketchrec.models.heavy_filter import HeavyFilter

ids = st.one_of(st.integers(min_value=-(2**62), max_value=2**62), st.text(max_size=12))
streams = st.lists(st.tuples(ids, st.integers(1, 5)), max_size=40)
PROBES = list(range(10**6, 10**6 + 50))  # ids no stream holds: answers must agree on them too
DIRECTION = np.array([1.0, -2.0])  # CountSketch adds weight * DIRECTION (integers: exact in float32)


def _ids(stream):
    return [u for u, _ in stream]


def _weights(stream) -> np.ndarray:
    return np.array([w for _, w in stream], dtype=np.int64)


def _totals(stream) -> dict[int, int]:
    """Summed weight per id key (5 and "5" are the same id)."""
    out: dict[int, int] = {}
    for u, w in stream:
        out[key_of(u)] = out.get(key_of(u), 0) + w
    return out


def _vectors(stream) -> np.ndarray:
    """A fixed pseudo-random 8-d vector per id, for the encoder (CosineSketch)."""
    return np.array([np.random.default_rng(key_of(u)).standard_normal(8) for u in stream] or
                    np.empty((0, 8)))


# --- how each sketch is fed, read and judged -------------------------------------------------------

def _count_sketch_check(s: CountSketch, stream) -> None:
    # wide and deep enough that the median of 5 rows is exact for a few dozen ids
    keys = list(_totals(stream))
    expected = np.array([t * DIRECTION for t in _totals(stream).values()]).reshape(-1, 2)
    assert np.array_equal(s.read_many(np.array(keys, dtype=np.uint64), estimator="median"), expected)


def _count_min_check(s: CountMinSketch, stream) -> None:
    totals = _totals(stream)
    est = s.estimate_many(np.array(list(totals), dtype=np.uint64))
    assert (est >= np.array(list(totals.values()), dtype=np.int64)).all()  # never under-counts
    assert s.total == sum(totals.values())


def _bloom_check(s: BloomFilter, stream) -> None:
    assert s.contains_many(_ids(stream)).all()  # no false negatives


def _heavy_hitters_check(h: HeavyHitters, stream) -> None:
    totals = _totals(stream)
    top = h.most_common()
    assert len(top) == len(h) <= h.capacity == 8
    assert len(h) == min(len(totals), h.capacity)
    assert all(count >= totals[key_of(u)] for u, count in top)
    counts = [c for _, c in top]
    assert counts == sorted(counts, reverse=True)


def _cosine_check(c: CosineSketch, stream) -> None:
    if stream:
        X = _vectors(_ids(stream))
        own = np.diag(c.estimate_cosine(X, c.encode(X)))
        assert (own > 0.7).all()  # a 32-bit code of an 8-d vector points close to it


@dataclass(frozen=True)
class Case:
    name: str
    cls: type
    make: Callable[[int], Any]                      # seed -> empty sketch
    add: Callable[[Any, list], None] | None         # feed a stream (None: an encoder, nothing to add)
    answer: Callable[[Any, list], Any]              # answers for a list of ids
    check: Callable[[Any, list], None]              # the structure's guarantee for a stream
    merge: str | None = "exact"                     # "exact", "bound" (keeps the guarantee) or None
    serial: bool = True                             # to_bytes / from_bytes
    fixed_memory: bool = True                       # nbytes

    def fed(self, seed: int, stream):
        sketch = self.make(seed)
        if self.add is not None and stream:
            self.add(sketch, stream)
        return sketch

    def state(self, sketch) -> bytes:
        """What the sketch learned, as bytes, without its parameters (which name the seed)."""
        if self.serial:
            return sketch.cells.tobytes()
        if isinstance(sketch, HeavyHitters):
            return repr(sketch.most_common()).encode() + sketch.sketch.cells.tobytes()
        return sketch.W.tobytes()


def _cms(conservative: bool) -> Callable[[int], CountMinSketch]:
    return lambda seed: CountMinSketch(width=64, depth=3, seed=seed, conservative=conservative)


CASES = [
    Case("CountSketch", CountSketch, lambda seed: CountSketch(width=1 << 16, depth=5, dim=2, seed=seed),
         lambda s, st_: s.update_many(_ids(st_), _weights(st_)[:, None] * DIRECTION),
         lambda s, u: s.read_many(u, estimator="median"), _count_sketch_check),
    Case("CountMinSketch", CountMinSketch, _cms(False),
         lambda s, st_: s.add_many(_ids(st_), _weights(st_)), CountMinSketch.estimate_many, _count_min_check),
    # conservative update keeps the bound through a merge but not the cells of the whole stream
    Case("CountMinSketch-conservative", CountMinSketch, _cms(True),
         lambda s, st_: s.add_many(_ids(st_), _weights(st_)), CountMinSketch.estimate_many, _count_min_check,
         merge="bound"),
    Case("BloomFilter", BloomFilter, lambda seed: BloomFilter(capacity=50, fp_rate=0.05, seed=seed),
         lambda s, st_: s.add_many(_ids(st_)), BloomFilter.contains_many, _bloom_check),
    Case("HeavyHitters", HeavyHitters, lambda seed: HeavyHitters(8, _cms(False)(seed)),
         lambda h, st_: h.add_many(_ids(st_), counts=_weights(st_)),
         lambda h, u: h.most_common(), _heavy_hitters_check, merge=None, serial=False, fixed_memory=False),
    Case("CosineSketch", CosineSketch, lambda seed: CosineSketch(dim=8, bits=32, seed=seed),
         None, lambda c, u: c.encode(_vectors(u)), _cosine_check,
         merge=None, serial=False, fixed_memory=False),
]


def cases(**want) -> list:
    """The cases that define the verbs asked for, as pytest params named after the case."""
    chosen = [c for c in CASES if all(bool(getattr(c, k)) == v for k, v in want.items())]
    return [pytest.param(c, id=c.name) for c in chosen]


def same_answers(a, b) -> bool:
    return np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b


# --- the contract ----------------------------------------------------------------------------------

def test_every_public_sketch_class_has_a_case():
    package = sketchrec.sketches
    public = set()
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        module = importlib.import_module(info.name)
        public |= {obj for name, obj in vars(module).items() if inspect.isclass(obj)
                   and obj.__module__ == module.__name__ and not name.startswith("_")}
    public -= {Sketch}
    assert public == {c.cls for c in CASES}
    # and every Sketch subclass anywhere in the library keeps the bytes, merge and memory verbs,
    # except the heavy-hitter slots, which keep bytes and refuse merge (test below)
    assert set(Sketch.__subclasses__()) - {HeavyFilter} <= {c.cls for c in CASES if c.serial and c.merge}


def test_the_heavy_filter_round_trips_its_bytes_and_refuses_to_merge():
    """Its slots hold learned vectors admitted by a data-dependent coin: two filters' slots cannot
    be added, so merge must refuse rather than return a wrong model."""
    from sketchrec.models import SketchMF
    model = SketchMF(dim=4, capacity=50, seed=1)
    users, items = np.arange(200) % 7, np.arange(200) % 11
    model.learn_many(users, items, np.full(200, 4.0))
    heavy = model.heavy
    assert heavy.n_used > 0
    again = HeavyFilter.from_bytes(heavy.to_bytes())
    assert again == heavy and again.nbytes == heavy.nbytes
    with pytest.raises(TypeError):
        heavy.merge(again)


@pytest.mark.parametrize("case", cases())
@settings(max_examples=40, deadline=None)
@given(stream=streams)
def test_added_items_are_estimated_within_the_guarantee(case, stream):
    case.check(case.fed(7, stream), stream)


@pytest.mark.parametrize("case", cases(merge=True))
@settings(max_examples=40, deadline=None)
@given(stream=streams, cut=st.integers(0, 40))
def test_merge_of_two_halves_is_the_sketch_of_the_whole(case, stream, cut):
    left, right = case.fed(3, stream[:cut]), case.fed(3, stream[cut:])
    whole = case.fed(3, stream)
    merged = left + right  # a new sketch; the halves stay as they were
    assert left == case.fed(3, stream[:cut])
    case.check(merged, stream)
    if case.merge == "exact":
        assert merged == whole and merged.to_bytes() == whole.to_bytes()
        queries = _ids(stream) + PROBES
        assert same_answers(case.answer(merged, queries), case.answer(whole, queries))
    left.merge(right)  # and in place
    assert left == merged


@pytest.mark.parametrize("case", cases(merge=True))
def test_merge_refuses_another_seed(case):
    with pytest.raises(ValueError):
        case.make(0).merge(case.make(1))


@pytest.mark.parametrize("case", cases(serial=True))
@settings(max_examples=40, deadline=None)
@given(stream=streams, later=streams)
def test_bytes_round_trip_answers_and_keeps_learning_alike(case, stream, later):
    sketch = case.fed(11, stream)
    blob = sketch.to_bytes()
    back = type(sketch).from_bytes(blob)
    assert back == sketch and back.to_bytes() == blob and back.nbytes == sketch.nbytes
    queries = _ids(stream) + PROBES
    assert same_answers(case.answer(back, queries), case.answer(sketch, queries))
    case.check(back, stream)
    if later:
        case.add(back, later)
        case.add(sketch, later)
    assert back.to_bytes() == sketch.to_bytes()
    assert same_answers(case.answer(back, _ids(later) + queries), case.answer(sketch, _ids(later) + queries))


@pytest.mark.parametrize("case", cases())
def test_same_seed_same_bytes_and_another_seed_hashes_differently(case):
    stream = [(f"id-{n}", 1 + n % 3) for n in range(30)]
    first, again, other = case.fed(5, stream), case.fed(5, stream), case.fed(6, stream)
    assert case.state(first) == case.state(again)
    if case.serial:
        assert first.to_bytes() == again.to_bytes()
    assert same_answers(case.answer(first, _ids(stream) + PROBES), case.answer(again, _ids(stream) + PROBES))
    assert case.state(first) != case.state(other)  # the seed moved the hashing, not just a label


@pytest.mark.parametrize("case", cases(fixed_memory=True))
@settings(max_examples=20, deadline=None)
@given(stream=st.lists(st.tuples(ids, st.integers(1, 5)), min_size=1, max_size=40))
def test_memory_is_fixed_as_items_arrive(case, stream):
    sketch = case.make(2)
    empty = sketch.nbytes
    case.add(sketch, stream)
    case.add(sketch, [(f"new-{n}", 1) for n in range(200)])  # many ids never seen
    assert sketch.nbytes == empty > 0
    assert len(sketch.to_bytes()) < empty + 1024  # the blob is the state plus a small header
