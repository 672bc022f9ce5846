"""The ranker interface every learner speaks: river's ``reco.base.Ranker`` verbs, without river.

A learner is used the way a river ranker is: ``learn_one(user, item, y)``, ``predict_one(user,
item)`` and ``rank(user, items)`` (each takes river's optional context ``x`` and ignores it), its
constructor arguments read back by ``_get_params`` and copied by ``clone``. river finds these by
name (duck typing), so ``models.river_adapters.RankerRegressor`` hands any of our learners to
``river.evaluate.progressive_val_score`` and river's metrics as before. What the learners do not
inherit from river is its import: ``river.reco`` pulls in river's optimisers and with them scipy,
which every process (a consumer, a server, each serving reader) would pay for at its start, whether
or not river's own model is used. river is imported by ``models.river_adapters`` only,
where river's model or river's evaluation is asked for.

>>> class Constant(Ranker):
...     def __init__(self, value: float = 3.0, seed: int | None = None):
...         super().__init__(seed=seed)
...         self.value = value
...     def learn_one(self, user, item, y, x=None):
...         pass
...     def predict_one(self, user, item, x=None):
...         return self.value + (item == "up")
>>> Constant(value=2.0).rank("ann", ["down", "up"])
['up', 'down']
>>> Constant(value=2.0).clone()
Constant(value=2.0, seed=None)
"""

from __future__ import annotations

import abc
import copy
import inspect
from typing import Any, Hashable, Iterable


class Ranker(abc.ABC):
    """Base of a learner with river's ranker verbs (module docstring).

    Parameters
    ----------
    seed : the random seed, kept as ``self.seed`` (as river's ``Ranker`` keeps it).

    Examples
    --------
    >>> from sketchrec import SketchMF
    >>> model = SketchMF(dim=4, capacity=50, seed=3)
    >>> model.learn_one("ann", "up", 5.0)
    >>> fresh = model.clone()
    >>> fresh.seed, fresh.n_learned
    (3, 0)
    """

    def __init__(self, seed: int | None = None):
        self.seed = seed

    @property
    def is_contextual(self) -> bool:
        """river's flag for rankers that read the context ``x``: none of ours do."""
        return False

    @abc.abstractmethod
    def learn_one(self, user: Hashable, item: Hashable, y: float, x: dict | None = None) -> None:
        """Learn one rating ``y`` of ``item`` by ``user``."""

    @abc.abstractmethod
    def predict_one(self, user: Hashable, item: Hashable, x: dict | None = None) -> float:
        """The predicted rating of ``item`` by ``user``."""

    def rank(self, user: Hashable, items: Iterable[Hashable], x: dict | None = None) -> list:
        """``items`` by decreasing predicted rating (river's default: one ``predict_one`` each)."""
        scores = {item: self.predict_one(user, item, x) for item in items}
        return sorted(scores, key=scores.__getitem__, reverse=True)

    def _get_params(self) -> dict[str, Any]:
        """The constructor's arguments, each read from the attribute of its name (river's
        ``Base._get_params``: a nested ranker as (its class, its parameters))."""
        params: dict[str, Any] = {}
        for name, param in inspect.signature(self.__init__).parameters.items():
            if param.kind == param.VAR_POSITIONAL:
                if positional := getattr(self, name, []):
                    params["_POSITIONAL_ARGS"] = positional
                continue
            values = getattr(self, name, {}).items() if param.kind == param.VAR_KEYWORD else \
                [(name, getattr(self, name))]
            for key, value in values:
                params[key] = (type(value), value._get_params()) if isinstance(value, Ranker) else value
        return params

    def clone(self, new_params: dict[str, Any] | None = None):
        """A fresh, unlearned learner with the same constructor arguments (``new_params``
        override some), as river's ``clone``: a nested ranker is cloned, anything else copied."""
        params = {**self._get_params(), **(new_params or {})}
        positional = params.pop("_POSITIONAL_ARGS", [])
        return type(self)(*positional, **{
            name: getattr(self, name).clone(value[1]) if _is_nested(value) else copy.deepcopy(value)
            for name, value in params.items()})

    def __str__(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        args = ", ".join(f"{name}={getattr(self, name, value) if _is_nested(value) else value!r}"
                         for name, value in self._get_params().items())
        return f"{type(self).__name__}({args})"


def _is_nested(value: Any) -> bool:
    return (isinstance(value, tuple) and len(value) == 2 and inspect.isclass(value[0])
            and isinstance(value[1], dict))
