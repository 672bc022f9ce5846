"""What both factorization learners share: hyper-parameters, running statistics, river's ranker
verbs (``models.ranker``) on top of a batch interface on numpy arrays."""

from __future__ import annotations

import abc
import dataclasses
import logging
import math
from typing import Callable, Hashable, Iterable, NamedTuple

import numpy as np

from sketchrec.models import steps as step_rules
from sketchrec.models._adaptive import OPTIMIZERS
from sketchrec.models.api import ModelAPI
from sketchrec.models._sgd import (ACC0, BIAS_REG, CLIP_LOSS, COUNT, IMPLICIT_LR, IMPLICIT_REG,
                                   INIT_STD, LEARNED, LR, OPTIMIZER, REG, RMAX, RMIN, SGLD_TAU, SKIPPED_CLIP,
                                   SKIPPED_DIVERGED, TOTAL)
from sketchrec.models.ranker import Ranker
from sketchrec._numba_rng import WORDS, set_state
from sketchrec.models.storage import ITEM, USER
from sketchrec.sketches import serial
from sketchrec.sketches.hashing import salt_table

_INIT_FAMILY_OFFSET = 100  # salts of the start vectors, apart from the addressing families

# how replicas of one model (a fleet's members) combine a state array: what each rule means
ADD, RANGE, SLOTS, KEYED, LOCAL = "add", "range", "slots", "keyed", "local"
MERGES = {
    ADD: "additive: a replica's change (now - base) is added by every other (sketch cells, sums, "
         "counts, counters, discounted loss sums)",
    RANGE: "rating statistics [count, sum, min, max]: count and sum add, the range is the union",
    SLOTS: "a heavy filter's exact slots: which id holds one is decided by announcements every "
           "replica applies alike, a slot's change is a residual (stream.fleet.slots)",
    KEYED: "rows per id that grow with the ids: no fixed shape to add changes to",
    LOCAL: "one learner's own (a user's recent items): not shared",
}


def fresh_sgld_noise() -> None:
    """Give the generator SGLD's noise comes from a whole fresh state, in the calling thread: the
    kernels draw it from numba's generator, one state per thread, which a seed would make
    regenerable. Its 624 words come from a generator keyed by a fresh 128-bit secret from the OS
    CSPRNG (``privacy.entropy``), at every batch (``sketchrec._numba_rng``; on a numba it was not
    checked on, a fresh 32-bit seed, logged once)."""
    from sketchrec.privacy.entropy import fresh_generator
    global _SEEDED_ONLY
    if not set_state(fresh_generator().integers(0, 1 << 32, WORDS, dtype=np.uint32)) and not _SEEDED_ONLY:
        _SEEDED_ONLY = True
        logging.getLogger(__name__).warning(
            "SGLD noise: this numba's generator state cannot be set whole; each batch's noise "
            "comes from a fresh 32-bit seed")


_SEEDED_ONLY = False


class CountWeighted(NamedTuple):
    """How a rating moves an id's entries of a state array: by its error / (min(n, horizon) + 1 +
    damping), n the id's count read from the state array ``counts`` on the same addresses (a
    damped running mean, e.g. the bias baseline's). Replicas that learn concurrently and add
    their changes need it (``stream.fleet.compose``): M members that step one item k times
    each move it by M (1 - (1 - a)^k) of its error, one learner by 1 - (1 - a)^(M k).

    Parameters
    ----------
    counts : the name of the state array holding the counts.
    damping : (users', items') damping, by family (``USER``, ``ITEM``): pseudo-ratings of
        residual 0.
    horizon : the largest count a move is averaged over.
    cells : (keys, family) -> the flat indices of the entries those ids address (one per hash
        row, with repeats).
    """

    counts: str
    damping: tuple[float, float]
    horizon: float
    cells: Callable[[np.ndarray, int], np.ndarray]


class StateArray(NamedTuple):
    """One array of a model's learnable state (``FactorizationModel.state_arrays``): the live
    array (learning writes it in place), how replicas merge it (a ``MERGES`` key) and, for an
    array of damped running means, how a rating's move is weighted by counts (``CountWeighted``;
    None: steps of their own)."""

    array: np.ndarray
    merge: str
    weighted: CountWeighted | None = None


class FactorizationModel(ModelAPI, Ranker):
    """Biased matrix factorization learned online by a step rule (``models.steps``: SGD, SGLD,
    AdaGrad on the sketch), one rating at a time.

    Subclasses decide where the parameters live (``SketchMF``: one count sketch; ``DenseMF``:
    growing per-id arrays) by implementing the abstract methods: ``_learn_keys``,
    ``_predict_keys``, ``factors``, ``nbytes`` and the state arrays of a checkpoint. ``recommend``,
    ``similar``, ``save`` and ``load`` come from ``models.api.ModelAPI``. Their
    constructor arguments are read back by name from attributes (``params``).

    ``state_arrays()`` is the one public walk of the learnable state: name -> ``StateArray``
    (the live array and its merge rule, ``MERGES``). A fleet's replicas exchange deltas of the
    additive arrays through it (``stream.fleet``); a kind whose arrays are all additive or
    rating statistics runs in a fleet without code of its own. A subclass names the rules of
    its non-additive arrays in ``STATE_MERGES``.

    Parameters common to both: ``steps`` the step rule (``models.steps``; ``lr``, ``optimizer``,
    ``acc0`` and ``sgld_temperature`` read it), its rate eta decayed as eta_t = eta / (1 + t /
    lr_schedule_T) over epochs t; ``lr`` and ``sgld_temperature`` tau (None: plain SGD) the older
    spelling that builds the rule when ``steps`` is not given; ``reg`` and ``bias_reg`` the L2
    weights; ``init_std`` the std of the start vectors; ``clip_loss`` epsilon of the thesis's data
    clipping (skip a rating when (r - r^)^2 > epsilon); ``seed`` fixes hashing and start vectors
    (never SGLD's noise: fresh entropy, ``models.steps.SGLD``).

    Examples
    --------
    >>> from sketchrec import BiasBaseline
    >>> model = BiasBaseline(capacity=100)
    >>> {name: state.merge for name, state in model.state_arrays().items()}
    {'stats': 'range', 'counters': 'add', 'biases': 'add', 'counts': 'add'}
    >>> _ = model.learn_many(["ann"], ["up"], [4.0])
    >>> int(model.state_arrays()["counters"].array[0])   # the live arrays, not copies
    1
    """

    STATE_MERGES: dict[str, str] = {}   # a state array's merge rule where it is not ADD

    def __init__(self, dim: int = 64, lr: float = 0.03, reg: float = 0.085,
                 bias_reg: float | None = 0.05, init_std: float = 0.05, lr_schedule_T: float = 20.0,
                 sgld_temperature: float | None = None, clip_loss: float | None = None,
                 seed: int = 0, steps: step_rules.StepRule | None = None):
        super().__init__(seed=seed)
        if dim < 1:
            raise ValueError("dim must be positive")
        if lr <= 0 or reg < 0 or init_std < 0 or lr_schedule_T <= 0:
            raise ValueError("lr and lr_schedule_T must be positive; reg and init_std non-negative")
        if clip_loss is not None and clip_loss <= 0:
            raise ValueError("clip_loss must be positive")
        # a subclass that takes steps= resolves it with its own keywords (models.steps.resolve)
        self.steps = step_rules.of(steps) if steps is not None else step_rules.noisy(
            step_rules.SGD(float(lr)), sgld_temperature)
        self.dim, self.reg = int(dim), float(reg)
        self.bias_reg = self.reg if bias_reg is None else float(bias_reg)
        self.init_std, self.lr_schedule_T = float(init_std), float(lr_schedule_T)
        self.clip_loss = clip_loss
        self.stats = np.zeros(4, dtype=np.float64)        # count, sum, min, max of learned ratings
        self.counters = np.zeros(3, dtype=np.int64)       # learned, skipped: loss clipping, divergence
        # (2, dim): one row of start-vector salts per family
        self._init_salts = np.stack([salt_table(self.seed or 0, fam + _INIT_FAMILY_OFFSET, 1,
                                                self.dim)[0] for fam in (USER, ITEM)])

    # --- the step rule -------------------------------------------------------------------------------
    @property
    def lr(self) -> float:
        """The step rule's eta. Assigning it (an epoch plan's rate) gives the rule the new rate, so
        the rule a checkpoint records is always the steps taken."""
        return self.steps.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.steps = dataclasses.replace(self.steps, lr=float(value))

    @property
    def optimizer(self) -> str:
        """The step rule's name in the kernels' table ("sgd", "adagrad", "adagrad-id"; SGLD's
        steps are "sgd")."""
        return self.steps.optimizer

    @property
    def acc0(self) -> float:
        """AdaGrad's start (the step rule's; 1 with plain SGD, which does not read it)."""
        return float(self.steps.acc0)

    @property
    def sgld_temperature(self) -> float | None:
        """SGLD's temperature tau (the step rule's; None without noise)."""
        return self.steps.temperature

    # --- figures -----------------------------------------------------------------------------------
    @property
    def privacy_mode(self):
        """The privacy mode this learner trains in (``privacy.mode.PrivacyMode``), from its settings."""
        from sketchrec.privacy.mode import learner_mode
        return learner_mode(getattr(self, "dp", None), self.clip_loss, self.sgld_temperature)

    @property
    def id_keys(self):
        """How this learner turns ids into keys (``privacy.keys.IdKeys``): under a secret key in a
        privacy mode (operator state, checkpointed as its own part, never in ``to_bytes``), the
        public hash otherwise. Drawn on first use, so a mode set after construction is honoured."""
        keys = self.__dict__.get("_id_keys")
        if keys is None or (not keys.keyed and self.privacy_mode.private):
            from sketchrec.privacy.keys import IdKeys
            debug = getattr(getattr(self, "dp", None), "debug_noise_seed", None)
            keys = self.__dict__["_id_keys"] = IdKeys.for_mode(self.privacy_mode, debug_seed=debug)
        return keys

    @id_keys.setter
    def id_keys(self, keys) -> None:   # a restored checkpoint's key
        self.__dict__["_id_keys"] = keys

    @property
    def n_learned(self) -> int:
        return int(self.counters[LEARNED])

    @property
    def n_skipped_clip(self) -> int:
        return int(self.counters[SKIPPED_CLIP])

    @property
    def n_skipped_diverged(self) -> int:
        """Steps skipped because they would have written inf/NaN (learning rate too high)."""
        return int(self.counters[SKIPPED_DIVERGED])

    @property
    def global_mean(self) -> float:
        return float(self.stats[TOTAL] / self.stats[COUNT]) if self.stats[COUNT] else 0.0

    @property
    def rating_range(self) -> tuple[float, float] | None:
        return (float(self.stats[RMIN]), float(self.stats[RMAX])) if self.stats[COUNT] else None

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes of learned state."""

    def hyper(self, epoch: int = 0) -> np.ndarray:
        """The kernels' hyper-parameter vector for one epoch (learning-rate schedule applied)."""
        hp = np.empty(10, dtype=np.float64)
        decay = 1.0 / (1.0 + epoch / self.lr_schedule_T)
        hp[LR] = self.lr * decay
        hp[REG], hp[BIAS_REG], hp[INIT_STD] = self.reg, self.bias_reg, self.init_std
        hp[CLIP_LOSS] = math.inf if self.clip_loss is None else self.clip_loss
        hp[SGLD_TAU] = 0.0 if self.sgld_temperature is None else self.sgld_temperature
        hp[OPTIMIZER] = OPTIMIZERS[self.optimizer]
        hp[ACC0] = self.acc0
        hp[IMPLICIT_LR] = getattr(self, "implicit_lr", 0.0) * decay
        hp[IMPLICIT_REG] = getattr(self, "implicit_reg", 0.0)
        return hp

    # --- state <-> bytes (checkpoints) ---------------------------------------------------------------
    def params(self) -> dict:
        """Constructor arguments that rebuild an empty model of the same shape: river's
        ``_get_params`` (each ``__init__`` parameter read from the attribute of its name, so a
        subclass keeps one for each, resolved: the width chosen, not None), configurations as dicts."""
        return {name: dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
                for name, value in self._get_params().items()}

    def state_arrays(self) -> dict[str, StateArray]:
        """The learnable state by name, each array live (learning writes it in place) with its
        merge rule (``MERGES``): the rating statistics (``RANGE``), the counters and the
        checkpoint's arrays (``ADD`` unless ``STATE_MERGES`` says otherwise). What a replica of
        a fleet publishes and adds is walked from here."""
        arrays = {"stats": self.stats, "counters": self.counters, **self._state_arrays()}
        return {name: StateArray(array, RANGE if name == "stats" else self.STATE_MERGES.get(name, ADD))
                for name, array in arrays.items()}

    @abc.abstractmethod
    def _state_arrays(self) -> dict[str, np.ndarray]:
        """The learned state beside stats and counters, by name (what a checkpoint holds)."""

    @abc.abstractmethod
    def _load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Adopt arrays written by ``_state_arrays`` (perhaps by an older version)."""

    def to_bytes(self) -> bytes:
        """The whole learned state, bit-exact (see ``sketches.serial``)."""
        return serial.pack(type(self).__name__, self.params(),
                           {"stats": self.stats, "counters": self.counters, **self._state_arrays()})

    @classmethod
    def from_bytes(cls, blob: bytes):
        params, arrays = serial.unpack(blob, cls.__name__)
        model = cls(**cls._upgrade_params(params))
        model.stats, model.counters = arrays.pop("stats"), arrays.pop("counters")
        model._load_state_arrays(arrays)
        return model

    @classmethod
    def _upgrade_params(cls, params: dict) -> dict:
        """Constructor arguments of a blob written by an older version, in today's terms: an SGLD
        model's rule was recorded as plain SGD beside ``sgld_temperature`` before SGLD was one."""
        steps, tau = params.get("steps"), params.get("sgld_temperature")
        if isinstance(steps, dict) and steps.get("rule") == "sgd" and tau:
            params = {**params, "steps": {"rule": "sgld", "lr": steps.get("lr", params.get("lr")),
                                          "temperature": tau}}
        return params

    # --- batch interface (numpy arrays; what the runtime uses) --------------------------------------
    def learn_many(self, users, items, ratings, epoch: int = 0) -> np.ndarray:
        """Learn ratings in order; return the prediction made for each just before it was learned.

        ``users`` and ``items`` are ids (ints or strings) or uint64 keys from ``self.id_keys``.
        """
        ukeys, ikeys = self.id_keys.as_keys(users), self.id_keys.as_keys(items)
        r = np.ascontiguousarray(ratings, dtype=np.float64).reshape(-1)
        if not (ukeys.shape == ikeys.shape == r.shape):
            raise ValueError("users, items and ratings must have the same length")
        if not np.isfinite(r).all():
            raise ValueError("ratings must be finite")
        out = np.empty(r.shape[0], dtype=np.float64)
        if self.sgld_temperature:
            fresh_sgld_noise()
        self._learn_keys(ukeys, ikeys, r, self.hyper(epoch), out)
        self.remember_items(items)   # the ids recommend and similar rank by default (models.api)
        return out

    def predict_many(self, users, items, clip: bool = True) -> np.ndarray:
        """Predicted ratings for aligned arrays of users and items, clipped to the range seen
        unless ``clip`` is False (scores for ranking)."""
        ukeys, ikeys = self.id_keys.as_keys(users), self.id_keys.as_keys(items)
        if ukeys.shape != ikeys.shape:
            raise ValueError("users and items must have the same length")
        out = np.empty(ukeys.shape[0], dtype=np.float64)
        self._predict_keys(ukeys, ikeys, clip, out)
        return out

    @abc.abstractmethod
    def factors(self, ids, family: int) -> tuple[np.ndarray, np.ndarray]:
        """(latent vectors, biases) of ids of one family (USER or ITEM) as the model sees them."""

    def score_items(self, user, items) -> np.ndarray:
        """Unclipped scores of many items for one user (for ranking)."""
        ikeys, ukey = self.id_keys.as_keys(items), self.id_keys.as_keys(user)[0]
        return self.predict_many(np.full(ikeys.shape[0], ukey, dtype=np.uint64), ikeys, clip=False)

    @abc.abstractmethod
    def _learn_keys(self, ukeys, ikeys, ratings, hp, out) -> None:
        """Learn uint64-keyed ratings in order with hyper-parameters hp; out gets the predictions."""

    @abc.abstractmethod
    def _predict_keys(self, ukeys, ikeys, clip, out) -> None:
        """Predictions for uint64-keyed pairs into out."""

    # --- river's reco.base.Ranker interface ---------------------------------------------------------
    def learn_one(self, user: Hashable, item: Hashable, y: float, x: dict | None = None) -> None:
        self.learn_many([user], [item], [float(y)])

    def predict_one(self, user: Hashable, item: Hashable, x: dict | None = None) -> float:
        return float(self.predict_many([user], [item])[0])

    def rank(self, user: Hashable, items: Iterable[Hashable], x: dict | None = None) -> list:
        """Items by decreasing predicted rating for this user (scored in one batch)."""
        items = list(items)
        if not items:
            return []
        scores = self.score_items(user, items)
        return [items[n] for n in np.argsort(-scores, kind="stable")]
