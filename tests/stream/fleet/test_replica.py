"""Replicas of one recommender exchanging deltas (stream.serving.replica, models.fleet_slots):
members that learn disjoint parts of a stream and apply each other's deltas, in any order, end
with the same model (heavy slots included), counts and serving structures."""

import numpy as np
import pytest

from sketchrec.data import read_ratings
from sketchrec.models import SketchMF
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.fleet.tracker import DeltaTracker, decode

N_RATINGS, MEMBERS, SYNC = 30_000, 3, 3_000


@pytest.fixture(scope="module")
def stream(ml100k):
    ratings, _ = read_ratings(ml100k)
    return ratings.users[:N_RATINGS], ratings.items[:N_RATINGS], ratings.ratings[:N_RATINGS]


def recommender(**kw) -> Recommender:
    # ML-100k's 2,625 ids; the default heavy fraction (0.7): most ids end in exact slots
    return Recommender(SketchMF(capacity=2625, seed=0, **kw), pair_capacity=100_000,
                       user_capacity=5_000, popular=50)


@pytest.fixture(scope="module")
def fleet(stream):
    """Three members on disjoint users (as Kafka partitions keyed by user), a serving replica,
    and one learner on the whole stream. Every SYNC ratings each member learns its share, applies
    the deltas of the round before in its own random order (on top of what it has not yet
    published), then takes its own; a last round applies the last deltas."""
    users, items, ratings = stream
    members = [recommender() for _ in range(MEMBERS)]
    serving, single = recommender(), recommender()
    trackers = [DeltaTracker(m, member=f"m{k}") for k, m in enumerate(members)]
    reader = DeltaTracker(serving, member="serving")
    rng = np.random.default_rng(5)
    part = users.astype(np.int64) % MEMBERS
    predictions = np.empty(len(ratings))
    blobs = []
    for start in [*range(0, len(ratings), SYNC), None]:
        for k, tracker in enumerate(trackers + [reader]):
            if start is not None and k < MEMBERS:
                rows = np.flatnonzero(part[start:start + SYNC] == k) + start
                predictions[rows] = members[k].learn_many(users[rows], items[rows], ratings[rows])
            for n in rng.permutation(len(blobs)):
                if blobs[n][0] != k:
                    tracker.apply(blobs[n][1])
        blobs = [(k, t.take()) for k, t in enumerate(trackers)] if start is not None else []
    for tracker in trackers + [reader]:
        tracker.settle()   # the popular list, re-ranked at most every RERANK_S by take/apply
    single_predictions = single.learn_many(users, items, ratings)
    return members + [serving], trackers + [reader], predictions, single, single_predictions


def test_replicas_agree_after_applying_the_same_deltas_in_different_orders(fleet, stream):
    replicas, trackers, _, _, _ = fleet
    users, items, _ = stream
    rng = np.random.default_rng(1)
    qu, qi = rng.choice(users, 1000), rng.choice(items, 1000)
    predictions = np.array([r.predict_many(qu, qi) for r in replicas])
    np.testing.assert_allclose(predictions, np.broadcast_to(predictions[0], predictions.shape),
                               rtol=0, atol=1e-6)
    for r in replicas:  # counts add up exactly, learners and the serving replica alike
        assert r.model.n_learned == N_RATINGS
        assert r.model.stats[0] == N_RATINGS
        assert r.model.global_mean == pytest.approx(float(np.mean(stream[2])), abs=1e-12)
    held = [{(k, f) for k, f in zip(r.model.heavy.keys.tolist(), r.model.heavy.families.tolist())
             if f < 2} for r in replicas]  # family 2: a free slot (models.fleet_slots.FREE)
    assert all(h == held[0] for h in held) and len(held[0]) > 500  # the heavy slots are used


def test_serving_structures_merge_exactly(fleet):
    replicas, _, _, _, _ = fleet
    first = replicas[0]
    for r in replicas[1:]:
        assert np.array_equal(r.pairs_seen.cells, first.pairs_seen.cells)
        assert np.array_equal(r.users_seen.cells, first.users_seen.cells)
        assert np.array_equal(r.popularity.sketch.cells, first.popularity.sketch.cells)
        assert r.popularity.sketch.total == N_RATINGS
        assert set(r.catalogue.snapshot()[0]) == set(first.catalogue.snapshot()[0])
        assert r.popularity.most_common(20) == first.popularity.most_common(20)


def test_a_fleet_learns_about_as_well_as_one_learner(fleet, stream):
    _, _, predictions, _, single_predictions = fleet
    ratings = stream[2]
    fleet_rmse = np.sqrt(np.mean((predictions - ratings) ** 2))
    single_rmse = np.sqrt(np.mean((single_predictions - ratings) ** 2))
    assert fleet_rmse < 1.03 * single_rmse


def test_applied_deltas_are_not_published_again_and_not_applied_twice(stream):
    users, items, ratings = stream
    a, b = recommender(), recommender()
    ta, tb = DeltaTracker(a), DeltaTracker(b)
    assert ta.take() is None  # nothing learned
    a.learn_many(users[:50], items[:50], ratings[:50])
    blob = ta.take()
    header = tb.apply(blob)
    assert header["member"] == ta.member and header["seq"] == 1
    assert tb.take() is None and b.model.n_learned == 50
    with pytest.raises(ValueError, match="already applied"):
        tb.apply(blob)
    with pytest.raises(ValueError, match="own"):
        ta.apply(blob)
    assert b.model.n_learned == 50


def test_a_small_delta_is_sparse_compressed_and_round_trips(stream):
    users, items, ratings = stream
    a, b = recommender(), recommender()
    ta, tb = DeltaTracker(a), DeltaTracker(b)
    a.learn_many(users[:2000], items[:2000], ratings[:2000])
    tb.apply(ta.take())  # announces the ids seen 8 times: they now hold heavy slots
    a.learn_many(users[2000:2010], items[2000:2010], ratings[2000:2010])
    blob = ta.take(meta={"offsets": {"0": 10}})
    dense = a.model.nbytes + a.pairs_seen.nbytes + a.users_seen.nbytes + a.popularity.sketch.nbytes
    assert len(blob) < dense / 20
    header, arrays = decode(blob)
    assert header["meta"] == {"offsets": {"0": 10}} and header["seq"] == 2
    assert "cells.d" not in arrays and "slot_rows" in arrays  # sparse cells; per-id slot rows
    assert tb.apply(blob)["meta"] == {"offsets": {"0": 10}}
    # takes and applies leave held slots' rows lagging their cells until a refresh: settled
    # replicas agree
    ta.settle()
    tb.settle()
    np.testing.assert_allclose(b.predict_many(users[:200], items[:200]),
                               a.predict_many(users[:200], items[:200]), rtol=0, atol=1e-6)
    assert ta.state_digest() != DeltaTracker(recommender()).state_digest()


@pytest.mark.parametrize("damage", ["junk", "magic", "version", "truncated", "flipped", "config"])
def test_a_bad_blob_is_one_clear_error_and_changes_nothing(stream, damage):
    users, items, ratings = stream
    a, b = recommender(), recommender()
    ta, tb = DeltaTracker(a), DeltaTracker(b)
    a.learn_many(users[:20], items[:20], ratings[:20])
    blob = ta.take()
    bad = {"junk": b"junk", "magic": b"XXXX" + blob[4:], "version": blob[:4] + b"\x09" + blob[5:],
           "truncated": blob[:len(blob) // 2],
           "flipped": blob[:40] + bytes(x ^ 0xFF for x in blob[40:60]) + blob[60:]}.get(damage)
    if damage == "config":
        tb = DeltaTracker(recommender(dim=32))
        bad = blob
    before = tb.state_digest()
    with pytest.raises(ValueError) as err:
        tb.apply(bad)
    assert "\n" not in str(err.value) and "delta" in str(err.value)
    assert tb.state_digest() == before


def test_a_model_topic_written_before_version_2_is_still_read(stream):
    """Version 1 packed the whole body (floats too): a replica rebuilt from an older model topic
    applies those deltas as it applies today's, to the same state."""
    import struct
    import zlib

    import zstandard

    from sketchrec.sketches import serial
    users, items, ratings = stream
    a, b, c = recommender(), recommender(), recommender()
    ta, tb, tc = DeltaTracker(a), DeltaTracker(b), DeltaTracker(c)
    for start in (0, 2000):   # the second delta moves held slots too
        a.learn_many(users[start:start + 2000], items[start:start + 2000], ratings[start:start + 2000])
        blob = ta.take()
        header, arrays = decode(blob)
        body = serial.pack("ModelDelta", header, arrays)
        old = b"SKRD" + struct.pack("<BBI", 1, 1, zlib.crc32(body)) + zstandard.ZstdCompressor().compress(body)
        tb.apply(blob)
        tc.apply(old)
    assert tb.state_digest() == tc.state_digest()
    with pytest.raises(ValueError, match="corrupt"):
        tc.apply(old[:-30])   # a damaged old one is refused as a new one is


def test_a_version_3_delta_without_its_body_checksum_is_refused(stream, monkeypatch):
    """The version-3 envelope keeps no CRC: its body's frame must. A body framed without one (as
    a forger or a buggy writer could) is refused; with the check skipped (the broken variant) a
    flipped float in such a body is applied without a word."""
    import struct

    from sketchrec import frame
    from sketchrec.sketches import serial
    from sketchrec.stream.fleet import envelope
    users, items, ratings = stream
    a = recommender()
    ta = DeltaTracker(a)
    a.learn_many(users[:200], items[:200], ratings[:200])
    genuine = ta.take()
    header, arrays = decode(genuine)
    body = bytearray(frame.encode(serial.MAGIC, {"kind": "ModelDelta", "params": header}, arrays,
                                  checksum=False))
    body[-3] ^= 0xFF   # a byte of the last array (a float row, left raw)
    unchecked = b"SKRD" + struct.pack("<BBI", envelope.VERSION, envelope.RAW, len(body)) + bytes(body)
    fresh = DeltaTracker(recommender())
    before = fresh.state_digest()
    with pytest.raises(ValueError, match="no checksum"):
        fresh.apply(unchecked)
    assert fresh.state_digest() == before
    honest = DeltaTracker(recommender())
    honest.apply(genuine)
    unrequired = frame.decode   # the broken variant: the frame's CRC not required
    monkeypatch.setattr(frame, "decode", lambda *args, require_crc=False, **kw: unrequired(*args, **kw))
    fresh.apply(unchecked)   # read unchecked: the flipped byte is now in the replica
    assert fresh.state_digest() != honest.state_digest()


def test_half_precision_deltas_are_smaller_and_lose_nothing_after_a_flush(stream):
    users, items, ratings = stream
    replicas = {p: (recommender(), recommender()) for p in ("float32", "float16")}
    sizes = {}
    for precision, (a, b) in replicas.items():
        ta, tb = DeltaTracker(a, precision=precision), DeltaTracker(b, precision=precision)
        for start in (0, 2000):  # the second round updates ids that now hold heavy slots
            a.learn_many(users[start:start + 2000], items[start:start + 2000],
                         ratings[start:start + 2000])
            blob = ta.take()
            sizes[precision] = len(blob)
            tb.apply(blob)
        flush = ta.take()  # the rounding the float16 deltas left behind
        assert (flush is None) == (precision == "float32")
        if flush is not None:
            tb.apply(flush)
        ta.settle()  # held slots' rows refreshed (takes and applies leave them lagging)
        tb.settle()
        np.testing.assert_allclose(b.predict_many(users[:1000], items[:1000]),
                                   a.predict_many(users[:1000], items[:1000]), rtol=0, atol=1e-6)
    assert sizes["float16"] < 0.75 * sizes["float32"]


def test_a_bitmap_that_does_not_match_its_values_is_refused():
    from sketchrec.stream.fleet.delta_codec import encode_entries, entries_of
    like = np.zeros(100, np.float32)
    good = encode_entries("x", np.arange(0, 100, 3), np.ones(34, np.float32), 100)
    assert "x.b" in good and entries_of(good, "x", like)[0].tolist() == list(range(0, 100, 3))
    for bad in ({**good, "x.v": good["x.v"][1:]}, {**good, "x.b": good["x.b"] | np.uint8(0x80)}):
        with pytest.raises(ValueError, match="bitmap"):
            entries_of(bad, "x", like)


def test_an_apply_moves_at_once_the_rows_of_the_held_slots_whose_residuals_it_moved(stream, monkeypatch):
    """A fleet replica (deferred) refreshes every held slot only every refresh_ratings ratings
    learned or applied; the rows of the slots an apply moved the residuals of move with them at once
    (a row is S + the id's estimate + local learning, and S moved), so the other members'
    learning on held ids is learned from at once: what a full refresh still changes is only what
    collisions moved in their cells. A replica whose apply left those rows as they were would
    serve and learn from rows a full refresh moves by all of the other members' learning."""
    from sketchrec.stream.fleet import slots as fleet_slots, tracker as replica
    monkeypatch.setattr(replica, "RERANK_S", 1e9)   # no re-rank: not what is measured here

    def lag_and_move() -> tuple[float, float]:
        """How far the held rows an apply moved are from a full refresh, and how far they were
        before the apply (norms over the rows)."""
        users, items, ratings = stream
        a, b = recommender(), recommender()
        ta, tb = DeltaTracker(a), DeltaTracker(b)
        slots, rows = tb._model.slots, b.model.heavy.cells
        for start in (0, 2000):   # the first round announces heavy ids, the second learns on them
            a.learn_many(users[start:start + 2000], items[start:start + 2000], ratings[start:start + 2000])
            arrays = decode(blob := ta.take())[1]
            keys, families = arrays.get("slot_keys"), arrays.get("slot_families")
            was = slots.locate(keys, families) if keys is not None else None
            before = rows[np.maximum(was, 0)].copy() if keys is not None else None
            tb.apply(blob)
        now = slots.locate(keys, families)
        kept = (was >= 0) & (now >= 0)
        assert kept.sum() > 50 and tb._model.stale   # held ids moved; the rest not yet refreshed
        after = rows[now[kept]].copy()
        slots.refresh()                                # what a full refresh makes of them
        full = rows[now[kept]]
        return float(np.linalg.norm(after - full)), float(np.linalg.norm(before[kept] - full))

    lag, move = lag_and_move()
    assert lag < 0.4 * move, (lag, move)   # the rest: what collisions moved in their cells
    def residuals_only(S, cells, view, slots, rows):   # S moved, the rows left behind
        S[slots[slots >= 0]] += rows[slots >= 0]
    monkeypatch.setattr(fleet_slots, "_add_rows", residuals_only)
    lag, move = lag_and_move()
    assert lag == move


@pytest.mark.parametrize("period, per_slot", [(3_000, 0), (3_000, 10_000), (None, 0)])
def test_a_deferred_replica_refreshes_its_held_slots_once_its_period_has_passed(stream, monkeypatch,
                                                                                 period, per_slot):
    """A fleet replica leaves the held slots' rows stale after an apply until its model learned or
    applied ``refresh_every`` ratings since the last full refresh, and ``REFRESH_SLOT_RATINGS``
    per slot held then; then the next apply refreshes them all (the rows are what a full refresh
    makes of them). With the default period, or held slots that ask for more ratings than the
    stream has here, they stay stale: the period, not the apply, decides. A refresh that never
    fired would leave the rows stale past the period; one that ignored the held slots would
    refresh them at the period set."""
    from sketchrec.stream.fleet import deltas, tracker as replica
    monkeypatch.setattr(replica, "RERANK_S", 1e9)   # no re-rank: not what is measured here
    monkeypatch.setattr(deltas, "REFRESH_SLOT_RATINGS", per_slot)
    users, items, ratings = stream
    a, b = recommender(), recommender()
    ta, tb = DeltaTracker(a), DeltaTracker(b)
    if period:
        tb.refresh_every(period)
    slots, rows = tb._model.slots, b.model.heavy.cells
    for start in (0, 2000):   # 2,000 applied (within the period), then 4,000 (past it)
        a.learn_many(users[start:start + 2000], items[start:start + 2000], ratings[start:start + 2000])
        tb.apply(ta.take())
        served, view = rows.copy(), slots.view.copy()
        slots.refresh()   # what a full refresh makes of the rows (the same as ready's)
        fresh = bool(np.array_equal(served, rows))
        rows[:], slots.view[:] = served, view
        assert fresh == (not tb._model.stale)
        assert fresh == (period is not None and not per_slot and start == 2000), (start, period)


def test_ids_heavy_in_a_batch_learn_it_in_their_slots_and_the_replicas_agree(monkeypatch):
    """A batch's ids are counted before it is learned: a user whose ratings come together (most
    users' do) takes its slot before its batch, so the batch's learning on it comes as the slot's
    change, and the replica that applies the delta predicts as the learner does. Counted after
    the batch (a broken variant), every one of those ratings went to hashed cells first."""
    from sketchrec.stream.fleet.deltas import ModelReplica
    rng = np.random.default_rng(3)
    users = np.repeat(np.arange(40), 30)              # 40 users, 30 ratings each, one after another
    items = rng.integers(0, 300, len(users))
    ratings = rng.integers(1, 6, len(users)).astype(float)

    def users_learned_in_slots() -> int:
        a, b = recommender(), recommender()
        ta, tb = DeltaTracker(a), DeltaTracker(b)
        a.learn_many(users, items, ratings)
        header, arrays = decode(blob := ta.take())
        tb.apply(blob)
        ta.settle()
        tb.settle()
        np.testing.assert_allclose(b.predict_many(users, items), a.predict_many(users, items),
                                   rtol=0, atol=1e-6)
        return int((arrays.get("slot_families", np.empty(0)) == 0).sum())   # USER

    assert users_learned_in_slots() == 40
    ahead = ModelReplica.ahead   # counted after the batch: the slots come only with the take
    monkeypatch.setattr(ModelReplica, "ahead", lambda self, u, i: None)
    monkeypatch.setattr(ModelReplica, "take", lambda self, take=ModelReplica.take: (
        ahead(self, *self._late), take(self))[1] if hasattr(self, "_late") else take(self))
    monkeypatch.setattr(ModelReplica, "touched", lambda self, u, i, touched=ModelReplica.touched: (
        setattr(self, "_late", (u, i)), touched(self, u, i))[1])
    assert users_learned_in_slots() == 0


def test_a_period_set_again_at_every_poll_keeps_the_held_slots_wait():
    """A member sets its refresh period at every poll (``refresh_every``): the wait its held slots
    gave is kept, so they are counted once per wait, not at every poll's first batch (the broken
    variant, resetting the wait to the period, counted them at nearly every poll)."""
    from sketchrec.stream.fleet.deltas import REFRESH_SLOT_RATINGS, ModelReplica
    a, b = SketchMF(dim=4, width=512, heavy_slots=64), SketchMF(dim=4, width=512, heavy_slots=64)
    ra, rb = ModelReplica(a), ModelReplica(b, deferred=True)
    rng, counted, held = np.random.default_rng(0), [], rb.slots.held
    rb.slots.held = lambda: (counted.append(1), held())[1]
    polls, batches, size = 20, 5, 50
    for _ in range(polls):
        rb.refresh_every(100)   # as a member's _pace: the same period at every poll
        for _ in range(batches):
            u, i = rng.integers(0, 40, size), rng.integers(0, 40, size)
            ra.ahead(u, i)
            a.learn_many(u, i, rng.integers(1, 6, size).astype(float))
            rb.apply(ra.take())
    waits = polls * batches * size // (REFRESH_SLOT_RATINGS * len(held()))
    # each wait: one count of the slots and one full refresh (which walks them), and the first count
    assert len(held()) > 0 and len(counted) <= 3 * waits + 1, (len(counted), waits)


def test_items_first_seen_in_a_batch_that_compacts_the_catalogue_are_published():
    """A full catalogue renumbers its rows when it compacts: the ids first learned in that batch
    (and the others learned since the last take) still reach the other replicas."""
    small, reader = (Recommender(SketchMF(capacity=64, seed=0), pair_capacity=1_000, max_items=n)
                     for n in (8, None))   # the reader's: the model's size, roomy here
    ta, tr = DeltaTracker(small, member="a"), DeltaTracker(reader, member="r")
    small.learn_many(np.arange(6), np.arange(6), np.full(6, 4.0))
    tr.apply(ta.take())
    small.learn_many(np.arange(6), np.arange(100, 106), np.full(6, 3.0))   # 12 > 8: compacts
    assert small.catalogue.generation == 1
    blob = ta.take()
    assert sorted(decode(blob)[0]["items"]) == list(range(100, 106))
    tr.apply(blob)
    assert sorted(reader.catalogue.snapshot()[0]) == [*range(6), *range(100, 106)]
    reader.learn_many([7], [200], [5.0])   # and what a replica receives it does not publish again
    assert decode(tr.take())[0]["items"] == [200]
