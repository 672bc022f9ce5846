"""The live model in shared memory: the learner writes it in place, reader processes map the pages.

A ``SketchMF`` (or the default ``mix`` of such learners, or a DP-SGD one with its private fallback:
``binding``) and the serving
filters are fixed-size arrays, so they can live in ONE ``multiprocessing.shared_memory`` segment
(``SharedBlock``): the learner's arrays are rebound to views of it (its numba kernels then write
there), and every reader process builds a model and two Bloom filters over views of the same
pages: no copy, no reload, no GIL shared with learning.

What is not a fixed-size array is published by the learner every ``PUBLISH_S`` seconds:
the catalogue's new ids (appended to a key buffer and an id buffer in the segment, with their
count), the popular list, and the service's figures (/stats, /privacy, health), as one JSON
document behind a sequence lock (``publish`` / ``read_meta``).

Consistency a reader gets:
- model cells, stats and counters: live, per cell. A query may combine cells written before and
  after one SGD step (a float32 cell is written whole on every platform numpy runs on); that is
  the asynchrony Hogwild-style SGD already tolerates, and every value read is finite as long as
  the learner's are (the readers still guard: a non-finite score is never answered).
- seen-pairs and seen-users Bloom filters: live; a bit set late only makes a pair look unseen
  until the write lands (the learner sets them right after learning the rating).
- catalogue, popular list and figures: a consistent snapshot at most ``PUBLISH_S`` plus the
  reader's poll interval old (about 75 ms by default). The seen-pairs filter is never older than
  the catalogue, so an item a user rated before the snapshot is never recommended to them.
The sequence lock relies on stores not being reordered with stores nor loads with loads (x86-64's
memory model; CPython does not reorder them either).

The learner also beats a heartbeat into the block (``beat``: the monotonic clock, system-wide on
Linux, every ``PUBLISH_S``) and names its pid in the header (``learner_pid``): a reader judges the
learner's liveness from them (``heartbeat_age``), whoever started it.

>>> from sketchrec.models import SketchMF
>>> from sketchrec.stream.recommender import Recommender
>>> rec = Recommender(SketchMF(capacity=50, dim=4, width=64), pair_capacity=100, user_capacity=100)
>>> block = SharedBlock.create(rec)
>>> _ = rec.learn_many(["ann"], ["film"], [4.0])     # written into the shared pages
>>> reader = SharedBlock.attach(block.name)
>>> model = reader.model()
>>> model.n_learned, bool(model.predict_one("ann", "film") == rec.model.predict_one("ann", "film"))
(1, True)
>>> block.publish({"catalogue": block.mirror(["film"], rec.catalogue.snapshot()[1])})
>>> reader.read_meta(0)[1]["catalogue"]
[1, 7]
>>> block.unlink()
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from sketchrec.models.registry import MODELS
from sketchrec.privacy.keys import ID_KEY_PART, id_keys_of, restore_id_key
from sketchrec.sketches import BloomFilter
from sketchrec.stream.serving.workers.binding import (RELEASED, bind_model, header_of, model_arrays,
                                                      reader_model, shareable_model)

PREFIX = "sketchrec-"   # segment names: /dev/shm/sketchrec-<pid>-<n> on Linux
PUBLISH_S = 0.05        # the learner publishes catalogue, popular list and figures this often
HEADER_BYTES = 1 << 16
SEQ, LENGTH, CLOSED, HEARTBEAT = 0, 1, 2, 3   # control words (int64) after the header
_CTL_WORDS = 64
_ALIGN = 64
_names = itertools.count()
_created: set[str] = set()   # segments this process made (its resource tracker unlinks them on a crash)


def _attach_segment(name: str) -> shared_memory.SharedMemory:
    """A handle on the segment ``name`` that this process's resource tracker leaves alone (it
    would unlink the segment when a reader exits, and the learner owns it). Python 3.13 says so
    publicly (``track=False``); 3.11 and 3.12 (``requires-python``) register every attached
    segment, so the registration is undone by the private name the constructor registered: the
    one reach into ``multiprocessing``'s internals, on the versions that need it."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name, track=False)
    shm = shared_memory.SharedMemory(name)
    if shm.name not in _created:
        resource_tracker.unregister(shm._name, "shared_memory")
    return shm


def shareable(recommender) -> bool:
    """Whether this recommender's state is all fixed-size arrays a ``SharedBlock`` can hold."""
    from sketchrec.stream.recommender import Recommender
    # a fleet replica (a DeltaTracker observing it) keeps state beside the arrays (slot residuals,
    # announcements) that readers would not see: it serves from its own process
    return (type(recommender) is Recommender and shareable_model(recommender.model)
            and not recommender.observers)


class SharedBlock:
    """One shared-memory segment: a JSON header naming where each array lies, control words,
    the arrays, the catalogue buffers and the published document (see module docstring)."""

    def __init__(self, shm: shared_memory.SharedMemory, header: dict, owner: bool):
        self.shm, self.header, self.owner = shm, header, owner
        self.name = shm.name
        self.ctl = np.ndarray(_CTL_WORDS, np.int64, shm.buf, HEADER_BYTES)
        self._mirrored = (0, 0)   # owner: catalogue ids and id bytes written so far

    # building -----------------------------------------------------------------------------------
    @classmethod
    def create(cls, recommender, *, extra: dict | None = None, catalogue_capacity: int = 1 << 20,
               id_bytes: int = 1 << 26, meta_bytes: int = 1 << 22) -> "SharedBlock":
        """A new segment holding ``recommender``'s model and filters, whose arrays are rebound to
        it (learning writes there from now on). The buffers are sized generously: pages are only
        allocated when touched. ``extra`` goes into the header for the readers."""
        model = recommender.model
        arrays = {f"model.{n}": a for n, a in model_arrays(model).items()}
        arrays |= {"pairs_seen": recommender.pairs_seen.cells, "users_seen": recommender.users_seen.cells}
        specs, offset = {}, HEADER_BYTES + 8 * _CTL_WORDS
        for name, a in [*arrays.items(), ("catalogue_keys", np.empty(catalogue_capacity, np.uint64)),
                        ("catalogue_ids", np.empty(id_bytes, np.uint8)),
                        ("popular_term", np.empty(catalogue_capacity, np.float64)),
                        ("meta", np.empty(meta_bytes, np.uint8))]:
            offset = -(-offset // _ALIGN) * _ALIGN
            specs[name] = [offset, a.dtype.str, list(a.shape)]
            offset += a.nbytes
        header = {**header_of(model), "arrays": specs,
                  "learner_pid": os.getpid(),
                  "pairs_seen": recommender.pairs_seen.params(),
                  "users_seen": recommender.users_seen.params(), **(extra or {}),
                  # the secret id key of a privacy mode: readers key ids as the learner does (the
                  # segment is the learner's operator state, like its cells; never served)
                  **{name: blob.hex() for name, blob in id_keys_of(model).parts().items()}}
        raw = json.dumps(header).encode()
        if len(raw) + 8 > HEADER_BYTES:
            raise ValueError("shared block header too large")
        shm = shared_memory.SharedMemory(f"{PREFIX}{os.getpid()}-{next(_names)}", create=True, size=offset)
        shm.buf[:8] = len(raw).to_bytes(8, "little")
        shm.buf[8:8 + len(raw)] = raw
        block = cls(shm, header, owner=True)
        block.beat()
        _created.add(shm.name)
        views = {name: block.view(name) for name in arrays}
        for name, a in arrays.items():
            views[name][...] = a
        bind_model(model, {n[6:]: v for n, v in views.items() if n.startswith("model.")}, block)
        for name in ("pairs_seen", "users_seen"):
            bloom = getattr(recommender, name)
            bloom.cells, bloom._shared_block = views[name], block
        return block

    @classmethod
    def attach(cls, name: str) -> "SharedBlock":
        """A reader's view of the segment ``name`` (it never unlinks it)."""
        shm = _attach_segment(name)
        hlen = int.from_bytes(shm.buf[:8], "little")
        return cls(shm, json.loads(bytes(shm.buf[8:8 + hlen])), owner=False)

    def view(self, name: str) -> np.ndarray:
        offset, dtype, shape = self.header["arrays"][name]
        return np.ndarray(tuple(shape), np.dtype(dtype), self.shm.buf, offset)

    def model(self):
        """A model over the shared arrays (reader side)."""
        cls = MODELS[self.header["model_class"]]
        model = cls(**cls._upgrade_params(self.header["params"]))
        if ID_KEY_PART in self.header:
            restore_id_key(model, {ID_KEY_PART: bytes.fromhex(self.header[ID_KEY_PART])})
        views = {name[6:]: self.view(name) for name in self.header["arrays"] if name.startswith("model.")}
        wrapped = views.pop(RELEASED, None)   # a private fallback's releases: its reader's wrapper's
        bind_model(model, views, self)
        return reader_model(model, self.header, wrapped)

    def bloom(self, name: str) -> BloomFilter:
        """The Bloom filter ``name`` ("pairs_seen" or "users_seen") over the shared bits."""
        bloom = BloomFilter(**self.header[name])   # np.zeros: its pages are never touched
        bloom.cells, bloom._shared_block = self.view(name), self
        return bloom

    # the catalogue --------------------------------------------------------------------------------
    def mirror(self, ids: list, keys: np.ndarray, generation: int = 0) -> list[int]:
        """Owner: append the catalogue's ids beyond those already mirrored (a catalogue only grows
        within a generation; a compacted one, ``stream.catalogue``, is mirrored afresh); [count,
        id bytes] (and the generation, past 0) to publish. Beyond the buffers' capacity the
        readers keep the prefix."""
        if generation != getattr(self, "_generation", 0):
            self._mirrored, self._generation = (0, 0), generation
        n, used = self._mirrored
        key_buf, id_buf = self.view("catalogue_keys"), self.view("catalogue_ids")
        if len(ids) > n:
            new = min(len(ids), len(key_buf))
            text = "".join(json.dumps(i) + "\n" for i in ids[n:new]).encode()
            if used + len(text) <= len(id_buf):
                key_buf[n:new] = keys[n:new]
                id_buf[used:used + len(text)] = np.frombuffer(text, np.uint8)
                self._mirrored = n, used = new, used + len(text)
        return self.mirrored

    @property
    def mirrored(self) -> list[int]:
        """Owner: [catalogue ids, id bytes] mirrored so far (and the catalogue's generation, past 0)."""
        generation = getattr(self, "_generation", 0)
        return list(self._mirrored) + ([generation] if generation else [])

    def read_ids(self, start: int, end: int) -> list:
        """The ids held by id bytes [start, end) (reader side)."""
        text = self.view("catalogue_ids")[start:end].tobytes().decode()
        return json.loads("[" + ",".join(text.splitlines()) + "]")

    # the published document (sequence lock) ---------------------------------------------------------
    def publish(self, meta: dict | str) -> None:
        """Owner: replace the published document, a dict or its JSON (readers never see half of one)."""
        raw = (meta if isinstance(meta, str) else json.dumps(meta, default=plain)).encode()
        buf = self.view("meta")
        if len(raw) > len(buf):
            raise ValueError(f"published document too large ({len(raw)} bytes)")
        self.ctl[SEQ] += 1          # odd: being written
        self.ctl[LENGTH] = len(raw)
        buf[:len(raw)] = np.frombuffer(raw, np.uint8)
        self.ctl[SEQ] += 1          # even: complete

    def read_meta(self, seen: int) -> tuple[int, dict | None]:
        """(sequence, document) if a document newer than ``seen`` is published, else (seen, None)."""
        buf = self.view("meta")
        for _ in range(1000):
            seq = int(self.ctl[SEQ])
            if seq == seen:
                return seen, None
            if seq % 2:
                time.sleep(0.0005)
                continue
            raw = buf[:int(self.ctl[LENGTH])].tobytes()
            if int(self.ctl[SEQ]) == seq:
                return seq, json.loads(raw)
        return seen, None

    # the learner's liveness ---------------------------------------------------------------------
    def beat(self) -> None:
        """Owner: the learner is alive now."""
        self.ctl[HEARTBEAT] = time.monotonic_ns()

    def heartbeat_age(self) -> float:
        """Seconds since the learner's last ``beat``."""
        return (time.monotonic_ns() - int(self.ctl[HEARTBEAT])) / 1e9

    @property
    def closed(self) -> bool:
        return bool(self.ctl[CLOSED])

    def unlink(self) -> None:
        """Owner: mark closed and remove the segment's name (mappings stay valid until dropped)."""
        if self.owner:
            self.ctl[CLOSED] = 1
            try:
                self.shm.unlink()
            except FileNotFoundError:
                pass


def plain(value):
    """JSON for numpy scalars and other figures json does not know."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)
