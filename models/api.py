"""What a learner offers a Python user beyond learning and predicting: ``recommend``, ``similar``,
``save`` and ``load`` (mixed into ``models.base.FactorizationModel``).

A sketch model keeps no list of ids (its memory is fixed by the sketch), so the items it ranks
come from a bounded record of the item ids it learned through ``learn_many``/``learn_one``
(``known_items``: at most ``MAX_KNOWN_ITEMS``, the oldest forgotten first), or from ``items=``.
In a central-DP mode the record is not kept (which items were rated is not covered by the
guarantee): give ``items=`` there. uint64 keys (what the runtime passes) are not ids and are not
recorded; the served ``stream.recommender.Recommender`` keeps its own catalogue.

``save(path)`` writes one file in the ``sketches.serial`` format the checkpoints already hold: the
model's ``to_bytes()``, its operator parts (a privacy mode's secret id key, cap counts) and the
item record; ``Model.load(path)`` rebuilds it, bit-exact.

>>> from sketchrec.models import SketchMF
>>> m = SketchMF(dim=4, capacity=50, seed=0)
>>> _ = m.learn_many(["ann", "bob", "ann"], ["up", "up", "heat"], [5.0, 4.0, 2.0])
>>> m.known_items()
['up', 'heat']
>>> [item for item, _ in m.recommend("bob", k=2)]
['up', 'heat']
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Hashable, Iterable

import numpy as np

from sketchrec.models.storage import ITEM
from sketchrec.privacy.keys import id_keys_of, restore_id_key
from sketchrec.sketches import serial

MAX_KNOWN_ITEMS = 100_000
_SAVED = "sketchrec-model"   # the serial kind of a saved file (its params name the model class)


def operator_parts(model) -> dict[str, bytes]:
    """A model's operator state outside its exported bytes (cap counts, the secret id key of a
    privacy mode), as named parts (what checkpoints and saved files store beside ``to_bytes``)."""
    state = getattr(model, "operator_state", None)
    return {**({"operator_state": state()} if state else {}), **id_keys_of(model).parts()}


def restore_operator_parts(model, parts: dict[str, bytes]) -> None:
    """Adopt the parts ``operator_parts`` wrote (the id key before anything is hashed)."""
    restore_id_key(model, parts)
    if "operator_state" in parts and hasattr(model, "load_operator_state"):
        model.load_operator_state(parts["operator_state"])


def _top(scores: np.ndarray, candidates: list, k: int) -> list[tuple[Hashable, float]]:
    order = np.argsort(-scores, kind="stable")[:max(0, int(k))]
    return [(candidates[n], float(scores[n])) for n in order]


class ModelAPI:
    """``recommend``, ``similar``, ``save``/``load`` and the item record (module docstring)."""

    def remember_items(self, items) -> None:
        """Record item ids just learned (not uint64 keys; not in a central-DP mode)."""
        if isinstance(items, np.ndarray) and items.dtype == np.uint64 or self.privacy_mode.central:
            return
        record = self.__dict__.setdefault("_known_items", {})
        fresh = [i for i in dict.fromkeys(np.asarray(items).tolist()) if i not in record]
        record.update(dict.fromkeys(fresh))
        if len(record) > MAX_KNOWN_ITEMS:   # forget the oldest (dicts keep insertion order)
            for old in list(record)[:len(record) - MAX_KNOWN_ITEMS]:
                del record[old]

    def known_items(self) -> list:
        """The item ids this model learned through its Python interface, first seen first."""
        return list(self.__dict__.get("_known_items", ()))

    def _candidates(self, items: Iterable[Hashable] | None) -> list:
        candidates = self.known_items() if items is None else list(items)
        if items is None and not candidates and self.privacy_mode.central:
            raise ValueError("a central-DP model keeps no record of the items it learned "
                             "(not covered by its guarantee): pass items=[...] to rank")
        return candidates

    def recommend(self, user: Hashable, k: int = 10, items: Iterable[Hashable] | None = None,
                  exclude: Iterable[Hashable] = ()) -> list[tuple[Hashable, float]]:
        """The ``k`` items of highest predicted rating for ``user``, as (item, score) pairs, best
        first (ties in candidate order). Candidates: ``items``, else ``known_items()``, minus
        ``exclude`` (e.g. the items the user rated: this model keeps no per-user history). The
        score is the predicted rating before clipping to the range seen."""
        skip = set(exclude)
        candidates = [i for i in self._candidates(items) if i not in skip]
        if not candidates:
            return []
        return _top(np.asarray(self.score_items(user, candidates), dtype=np.float64), candidates, k)

    def item_vectors(self, items) -> np.ndarray:
        """The latent vectors of items (``similar`` compares these)."""
        return self.factors(items, ITEM)[0]

    def similar(self, item: Hashable, k: int = 10,
                items: Iterable[Hashable] | None = None) -> list[tuple[Hashable, float]]:
        """The ``k`` items whose latent vectors are closest to ``item``'s, as (item, cosine
        similarity in [-1, 1]) pairs, best first; ``item`` itself is left out. Candidates:
        ``items``, else ``known_items()``."""
        candidates = [i for i in self._candidates(items) if i != item]
        if not candidates:
            return []
        vectors = np.asarray(self.item_vectors([item, *candidates]), dtype=np.float64)
        norms = np.linalg.norm(vectors, axis=1)
        if not vectors.shape[1] or norms[0] == 0.0:
            raise ValueError(f"{type(self).__name__} holds no latent vector for {item!r} "
                             "(a bias model has none): use a factor model (SketchMF, Mix, DenseMF)")
        scores = vectors[1:] @ vectors[0] / np.maximum(norms[1:] * norms[0], 1e-300)
        return _top(scores, candidates, k)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the whole model to one file (written aside, then renamed into place); returns it."""
        path = Path(path)
        arrays = {"model": np.frombuffer(self.to_bytes(), dtype=np.uint8),
                  **{f"part:{name}": np.frombuffer(blob, dtype=np.uint8)
                     for name, blob in operator_parts(self).items()}}
        blob = serial.pack(_SAVED, {"model_class": type(self).__name__, "items": self.known_items()},
                           arrays)
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_bytes(blob)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike):
        """The model ``save`` wrote to ``path``; ValueError when it holds another class."""
        from sketchrec.models.registry import MODELS   # the registry imports every learner
        params, arrays = serial.unpack(Path(path).read_bytes(), _SAVED)
        found = MODELS.get(params["model_class"])
        if found is None or not issubclass(found, cls):
            raise ValueError(f"{path} holds a {params['model_class']}, not a {cls.__name__}")
        model = found.from_bytes(arrays.pop("model").tobytes())
        restore_operator_parts(model, {name.split(":", 1)[1]: a.tobytes() for name, a in arrays.items()})
        if params["items"]:
            model.__dict__["_known_items"] = dict.fromkeys(params["items"])
        return model
