"""Deltas of a ``SketchMF``'s learned state: what one replica learned since its last report, as
arrays that any replica of the same configuration adds to its own (a fleet of learners sharing
one model).

An SGD step on a count sketch is an addition to its cells, so most of a model is additive: the
vector and bias cells, the rating count and sum, the learned/skipped counters, the DP step
count. A ``ModelReplica`` keeps a copy of the state it last published (its *base*); ``take``
returns ``now - base`` (only the entries that changed) and moves the base to now; ``apply`` adds
another replica's delta to the model and to the base alike, so it is not published again. A take
compares every entry (O(cells)), or with ``tracked`` only the cells of the ids learned outside a
heavy slot and the slots of those learned in one (O(ratings x depth x d) plus a bitmap scan).

The heavy-hitter slots are not additive in a single learner (an id's admission is a local
decision that moves its estimate out of the cells); a replica runs them in fleet mode
(``models.fleet_slots``): membership decided by announcements that every replica applies alike,
a slot holding a residual on top of the id's sketch estimate. A delta then carries the cells'
changes, the per-id residual changes of held ids and the ids announced.
"""

from __future__ import annotations

import numpy as np

from sketchrec.models.base import ITEM, SLOTS, USER
from sketchrec.privacy.mode import mode_of
from sketchrec.stream.fleet.array_replica import ArrayReplica, merge_stats  # noqa: F401 (its home was here)
from sketchrec.stream.fleet.compose_biases import ItemBiases
from sketchrec.stream.fleet.delta_codec import add_entries, distinct, entries_of, publish, written_indices
from sketchrec.stream.fleet.slots import FAMILIES, FROZEN, FleetSlots
from sketchrec.sketches.count_sketch import cell_indices

_EMPTY = np.empty(0, np.uint64)
# the state arrays a ModelReplica walks itself (cells and slots tracked by id, below); the
# others of ``state_arrays()`` (statistics, counters, DP steps, AdaGrad's sums) go through an
# ArrayReplica beside it
_WALKED = ("vectors", "biases")
# deferred replicas: by default, ratings the replica's model learned or applied (its n_learned)
# between two refreshes of every held slot's row (the refresh hashes every held id's cells: on a
# fleet member it cost more than learning, py-spy). A fleet member sets its own from its sync
# interval (``refresh_every``, ``pace.full_refresh_ratings``: from three members on, 8 x the model's
# drift budget); this is the period of a replica no member paces
FULL_REFRESH_RATINGS = 16_000
# ... and at least REFRESH_SLOT_RATINGS x the held slots, whatever the period set: a full refresh
# costs O(held slots) (each hashes and reads its id's depth x light_dim cells, less than half of
# what learning a rating costs: two ids hashed, their cells or slots read and written, the step's
# arithmetic), so a period that does not grow with the model made the refresh's cost per rating
# grow with it. A replica counts every rating of the fleet (learned or applied) and learns 1/M of
# them, so this keeps a member's refreshes under M / (2 x REFRESH_SLOT_RATINGS) of its learning
# at any model size (a sixteenth at four members). What a held row lags between refreshes, what
# collisions moved in its id's cells, grows with the ratings spread over the cells in between:
# with the period in proportion to the slots (so to the model's memory) it stays about constant
# as the model grows (``sketchrec bench fleet --breakdown`` and ``--accuracy`` measure both)
REFRESH_SLOT_RATINGS = 32
# a take finds the cells to compare by sorting their indices while they are fewer than
# 1 / _SORTED_BELOW of the cells, by a bitmap's scan (O(cells)) beyond: where the two cost alike
# (once most ids are held in slots, a take's ids address few cells, and the scan was most of it)
_SORTED_BELOW = 8


class ModelReplica:
    """The published state of one ``SketchMF`` and the delta arithmetic on it (see module doc).
    ``admit_after``: local sightings after which an id is announced for a heavy slot;
    ``precision`` of the published cell and slot changes: "float32" (the cells' own) or
    "float16" (half the bytes; each delta carries the rounding left by the previous one, so
    nothing is lost: a member's replica runs ahead of the published state by < 2^-11 of its
    last changes, and takes without new learning shrink that by 2^-11 each).

    >>> from sketchrec.models import SketchMF
    >>> a, b = SketchMF(dim=4, width=512, heavy_slots=16), SketchMF(dim=4, width=512, heavy_slots=16)
    >>> ra, rb = ModelReplica(a), ModelReplica(b)
    >>> _ = a.learn_many([1, 2], [7, 7], [4.0, 3.0])
    >>> rb.apply(ra.take())
    >>> b.n_learned, float(b.global_mean), ra.take()
    (2, 3.5, {})
    """

    def __init__(self, model, admit_after: int = 8, precision: str = "float32",
                 tracked: bool = False, deferred: bool = False):
        if precision not in ("float32", "float16"):
            raise ValueError("precision must be float32 or float16")
        self.dtype = np.float16 if precision == "float16" else None
        if not hasattr(model, "heavy") or not hasattr(model, "vectors"):
            raise TypeError(f"replicas need a SketchMF, not {type(model).__name__}")
        if getattr(model, "implicit", 0):
            raise ValueError("replicas exchange the sketch's cells and slots: a learner with an "
                             "implicit history (implicit > 0) keeps state they would not carry")
        self.model = model
        self.slots = FleetSlots(model, admit_after) if model.heavy.n_slots else None
        m = model
        self._cells, self._bias = m.vectors.cells.copy(), m.biases.cells.copy()
        self.extra = ArrayReplica({name: state for name, state in m.state_arrays().items()
                                   if name not in _WALKED and state.merge != SLOTS}, type(m).__name__)
        # tracked: every learned batch's keys come through touched(), so a take compares only the
        # cells and slots they address (DP-SGD puts noise on every cell: always a full pass)
        self._touched: list | None = [] if tracked and not mode_of(m).dp_sgd else None
        self.biases = ItemBiases(m)   # the item biases' moves, composed at a take (fleet_size)
        self._batches: list = []   # touched() since the last membership change, not yet sorted
        self._rows = 0             # rows touched since the last take
        # float16: where the last take left rounding behind (compared again at the next take)
        self._carry = (np.empty(0, np.int64),) * 2 + (np.empty(0, np.uint64), np.empty(0, np.uint8))
        self._masks: tuple | None = None
        # deferred: a take or apply leaves the held slots' rows stale, for ready() to refresh,
        # which it does every refresh_ratings (or when told: settle, a snapshot)
        self.deferred, self.stale, self._refreshed_at = deferred, False, model.n_learned
        self.refresh_ratings = self._wait = FULL_REFRESH_RATINGS   # _wait: see _due
        self._admitted = 0   # of slots.pending, admitted ahead of a batch (ahead) already

    def touched(self, ukeys: np.ndarray, ikeys: np.ndarray) -> None:
        """Record the ids of a learned batch (all rows, canaries included) for ``tracked``: an id
        held in a heavy slot while it was learned changed its slot only, any other its cells.
        Sorted out at the next change of membership (``_sort_touched``), and not at all once the
        take is to be a full pass (``_full``)."""
        self.biases.touched(ukeys, ikeys)
        if self._touched is None:
            return
        self._rows += len(ukeys)
        if self._full():
            self._batches = []
        else:
            self._batches.append((ukeys, ikeys))

    def fleet_size(self, members: float) -> None:
        """Members learning concurrently: a take composes this replica's item-bias moves with
        theirs (``compose_biases``). Never a noisy step rule's: a scale set from raw per-item
        counts is no post-processing of DP-SGD's noised steps, and it would shrink SGLD's
        Langevin noise with the gradient (the sampler's temperature)."""
        noisy = mode_of(self.model).dp_sgd or self.model.sgld_temperature is not None
        self.biases.fleet_size(1 if noisy else members)

    def _full(self) -> bool:
        """Whether the cells the rows touched since the last take address (with repeats) are as
        many as there are cells: a full pass then costs no more than finding them (a take of a
        few thousand ratings of a small catalogue moves most cells). Never with float16, whose
        rounding (in numpy) costs more per entry than the finding."""
        salts = self.model.store.salts
        return (self.dtype is None and self._rows * 2 * salts.shape[1] * salts.shape[2]
                >= self.model.vectors.cells.size)

    def _sort_touched(self) -> None:
        """The ids of the batches touched since the last change of membership, by whether they
        are held (before ids are admitted or evicted)."""
        if not self._batches:
            return
        ukeys, ikeys = (distinct(np.concatenate(keys)) for keys in zip(*self._batches))
        self._batches = []
        if self.slots is None:
            self._touched.append((ukeys, ikeys, _EMPTY, _EMPTY))
            return
        held = [self.slots.locate(k, np.full(len(k), f, np.uint8)) >= 0
                for f, k in zip(FAMILIES, (ukeys, ikeys))]
        self._touched.append((ukeys[~held[0]], ikeys[~held[1]], ukeys[held[0]], ikeys[held[1]]))

    def _where(self) -> tuple:
        """(cell indices, bias indices, held slots) the ids touched since the last take address;
        (None, None, None): everything. Cells only for ids learned outside a slot (and ids evicted
        since), slots only for ids learned in one: O(what changed) plus one scan of a bitmap."""
        full = self._touched is None or self._full()
        self._rows = 0
        if full:
            if self._touched is not None:
                self._touched, self._batches = [], []
            if self.slots is not None:
                self.slots.spilled = []  # a full pass finds them anyway
            return None, None, None
        self._sort_touched()
        m = self.model
        touched = self._touched + [(_EMPTY,) * 4]
        if self.slots is not None and self.slots.spilled:  # their unpublished part is in the cells
            keys, families = np.array(self.slots.spilled, dtype=np.uint64).reshape(-1, 2).T
            self.slots.spilled = []
            touched.append((keys[families == USER], keys[families == ITEM], _EMPTY, _EMPTY))
        self._touched = []
        keys = [distinct(np.concatenate([t[n] for t in touched])) for n in range(4)]
        if self._masks is None:  # reused: allocating and zeroing one per take costs more
            self._masks = (np.zeros(m.vectors.cells.size, bool), np.zeros(m.biases.cells.size, bool))
        where = []
        for cells, salts, carried, mask in ((m.vectors.cells, m.store.salts, self._carry[0], self._masks[0]),
                                            (m.biases.cells, m.store.bias_salts, self._carry[1], self._masks[1])):
            found = [cell_indices(salts[f], keys[n], cells.shape[1]) for n, f in enumerate(FAMILIES)]
            found = np.concatenate(found + [carried])
            if len(found) * _SORTED_BELOW < mask.size:   # few (most ids held): sorted
                where.append(distinct(found))
                continue
            mask[found] = True   # many, and they repeat: a bitmap beats sorting them
            idx = np.flatnonzero(mask)
            mask[idx] = False
            where.append(idx)
        slots = None
        if self.slots is not None:
            slots = np.concatenate([self.slots.locate(keys[2 + n], np.full(len(keys[2 + n]), f, np.uint8))
                                    for n, f in enumerate(FAMILIES)] + [self.slots.locate(*self._carry[2:])])
            slots = distinct(slots[slots >= 0])
        return where[0], where[1], slots

    def ahead(self, ukeys: np.ndarray, ikeys: np.ndarray) -> None:
        """Count the ids of a batch about to be learned (its real rows) and admit at once those
        that became due; a no-op without slots. They are announced all the same (published with
        the next take, which admits them again: a no-op here, what every other replica does when
        it applies them). Admission moves nothing (S = 0: the row is the id's estimate), so to
        the others admitting before the batch or at the take is the same, except that the
        batch's learning on the id comes as its slot's change instead of its cells'. Counted
        after the batch, a user whose ratings come together (most do) would have learned all of
        them in hashed cells before its slot (docs/scaling.md)."""
        if self.slots is None:
            return
        self.slots.observe(ukeys, ikeys)
        self.slots.announce()
        due = self.slots.pending[self._admitted:]
        if not due:
            return
        self._admitted = len(self.slots.pending)
        keys, families = np.array(due, dtype=np.uint64).reshape(-1, 2).T
        if self._touched is not None:
            self._sort_touched()   # by the membership they were learned under
        self.slots.admit(keys, families.astype(np.uint8), (self._cells, self._bias))

    # --- take ---------------------------------------------------------------------------------------
    def take(self) -> dict[str, np.ndarray]:
        """The arrays of everything learned since the base ({} if nothing); the base moves to now."""
        m = self.model
        out: dict[str, np.ndarray] = {}
        self.biases.scale(self.slots, self._bias)   # before anything is compared: kept as published
        cells, bias, slots = self._where()
        if self.slots is not None:
            keys, families, rows = self.slots.harvest(self.dtype, slots)
            if len(keys):
                out.update({"slot_keys": keys, "slot_families": families, "slot_rows": rows})
        out.update(publish(m.vectors.cells, self._cells, "cells", self.dtype, cells))
        out.update(publish(m.biases.cells, self._bias, "bias", self.dtype, bias))
        if self.dtype is not None and self._touched is not None:
            self._carry = (written_indices(out, "cells"), written_indices(out, "bias"),
                           out.get("slot_keys", np.empty(0, np.uint64)),
                           out.get("slot_families", np.empty(0, np.uint8)))
        out.update(self.extra.take())
        if self.slots is not None:
            self.slots.announce()
        if self.slots is not None and self.slots.pending:
            keys, families = np.array(self.slots.pending, dtype=np.uint64).reshape(-1, 2).T
            self.slots.pending, self._admitted = [], 0
            out.update({"announce_keys": keys, "announce_families": families.astype(np.uint8)})
            self.slots.admit(keys, families.astype(np.uint8), (self._cells, self._bias))
        if self.slots is not None and out:
            self._went_stale()
        return out

    def refresh_every(self, ratings: int) -> None:
        """A deferred replica refreshes every held slot once its model learned or applied
        ``ratings`` ratings since the last refresh (a fleet member: ``pace.full_refresh_ratings``)."""
        ratings = max(1, int(ratings))
        # a member sets it at every poll: the wait the slots last gave is kept (see _due)
        self._wait = max(self._wait, ratings) if ratings == self.refresh_ratings else ratings
        self.refresh_ratings = ratings

    def _went_stale(self) -> None:
        self.stale = True
        self.ready()

    def ready(self, full: bool = False) -> None:
        """Refresh the held slots' rows where a take or apply left them stale. Not deferred: at
        once. Deferred: once the model learned or applied ``refresh_ratings`` ratings since
        the last refresh (and ``REFRESH_SLOT_RATINGS`` per held slot), or now if ``full``
        (before the state is read as a whole: a digest, a snapshot, a settled replica). Until
        then a held id's row lags only what collisions moved in its cells (learning on a held id
        goes to its slot, and an apply moves the rows whose residuals it moved at once: route);
        its local learning is kept either way (a refresh adds it back on). ``full`` also sets the
        slots' counts back to FROZEN: the learning kernel counts each sighting of a held id
        (RAP's count), a member its own ids' only, so replicas would differ there and nowhere
        else, in a count RAP never compares against FROZEN anyway."""
        learned = self.model.n_learned
        if full and self.slots is not None:
            self.model.heavy.counts[:] = FROZEN
        if self.stale and (full or not self.deferred or self._due(learned - self._refreshed_at)):
            self.slots.refresh()
            self.stale, self._refreshed_at = False, learned

    def _due(self, since: int) -> bool:
        """Whether ``since`` ratings learned or applied make a deferred replica's full refresh due
        (``refresh_ratings``, and ``REFRESH_SLOT_RATINGS`` per held slot). The slots are counted
        only once the last count's wait has passed (it runs at every batch's ``ready``): fleet
        mode never frees a slot, so the wait only grows."""
        if since < self._wait:
            return False
        self._wait = max(self.refresh_ratings, REFRESH_SLOT_RATINGS * len(self.slots.held()))
        return since >= self._wait

    # --- apply --------------------------------------------------------------------------------------
    def apply(self, arrays: dict[str, np.ndarray]) -> None:
        """Add another replica's ``take`` to the model and to the base (ValueError if it does not
        fit this model's shape; then nothing has changed)."""
        m = self.model
        found, extra = self._check(arrays), self.extra.check(arrays)
        self.extra.apply(arrays, extra)
        if self.slots is not None and ("announce_keys" in arrays or "slot_keys" in arrays):
            self._sort_touched()   # by the membership they were learned under
        for target, base, entries in zip((m.vectors.cells, m.biases.cells), (self._cells, self._bias), found):
            add_entries(target, entries, base)
        if self.slots is None:
            return
        bases = (self._cells, self._bias)
        for prefix in ("announce", "slot"):
            if prefix + "_keys" in arrays:
                self.slots.admit(arrays[prefix + "_keys"], arrays[prefix + "_families"], bases)
        if "slot_keys" in arrays:
            # held ids' changes to S, and to their rows at once (route); the others' to the cells
            self.slots.route(arrays["slot_keys"], arrays["slot_families"], arrays["slot_rows"], bases)
        self._went_stale()

    def _check(self, arrays: dict[str, np.ndarray]) -> list:
        """The delta's cell and bias entries (``entries_of``), checked."""
        m = self.model
        found = [entries_of(arrays, name, like) for name, like in (
            ("cells", m.vectors.cells), ("bias", m.biases.cells))]
        for prefix, width in (("slot", m.dim + 1), ("announce", None)):
            if prefix + "_keys" not in arrays:
                continue
            if self.slots is None:
                raise ValueError("delta has heavy slots, this model none")
            keys, families = arrays[prefix + "_keys"], arrays[prefix + "_families"]
            if (keys.dtype != np.uint64 or families.shape != keys.shape or keys.ndim != 1
                    or families.dtype != np.uint8 or (families > ITEM).any()
                    or (width and (arrays["slot_rows"].shape != (len(keys), width)
                                   or arrays["slot_rows"].dtype not in (np.float32, np.float16)))):
                raise ValueError(f"delta's {prefix} ids do not fit this model")
        return found
