"""Count-sketch matrix factorization (thesis contribution B1, §4.1)."""

from __future__ import annotations

import inspect

import numpy as np

from sketchrec import frame
from sketchrec.models import steps as step_rules
from sketchrec.models._adaptive import Accumulators
from sketchrec.models._learn import sketch_learn
from sketchrec.models._sgd import LEARNED, TOTAL, sketch_factors, sketch_predict, sketch_score
from sketchrec.models.base import ITEM, LOCAL, SLOTS, USER, FactorizationModel
from sketchrec.models.private.dp_sgd import DPConfig, NoisyStepper
from sketchrec.models.heavy_filter import HeavyFilter, slot_bytes
from sketchrec.models.implicit import ImplicitHistory
from sketchrec.models.storage import FactorStore
from sketchrec.sketches.count_sketch import CountSketch, width_for_space_gain

DEFAULT_WIDTH = 1 << 16
DEFAULT_HEAVY_FRACTION = 0.7
# checkpoint names of the filter's state arrays (they predate the filter being a Sketch)
CAPS_MAGIC = b"SKUC"   # the operator state's frame: the user unit's cap counts
_FILTER_ARRAYS = {"cells": "filter_vectors", "keys": "filter_keys", "families": "filter_families",
                  "counts": "filter_counts"}


class SketchMF(FactorizationModel):
    """Biased MF whose user and item vectors live in ONE count sketch (two hash families).

    Memory is fixed by (width, depth): ``depth x width`` float32 cells for the latent vectors plus
    a ``depth x bias_width`` sketch (d = 1) for the user and item biases; it does not grow with the
    number of users or items. Give ``width`` directly, or ``capacity`` (the number of distinct
    users + items expected) and ``space_gain`` gamma, so that ``width = ceil(capacity d / (gamma k))``
    (eq. 4.9). ``depth = 1`` is feature hashing.

    The bias sketch is ``bias_width = ceil(width k / d)`` wide (= capacity / gamma): biases carry
    much of the signal in ratings data and cost only k/d of the vectors' memory (1/8 at d=32, k=4),
    so they get k times the per-row room the vectors have (a lower ML-100k holdout RMSE at gamma=1
    than the narrower ceil(capacity / (gamma k))).

    ``heavy_fraction`` of the vectors' memory holds exact slots (vector + bias) for the heaviest users
    and items (``sketches.heavy_filter``; default 0.7, and 0 in the privacy modes); ``heavy_slots``
    gives their number directly. The sketch gets the rest of the ``depth x width`` cells, and ids
    outside the filter keep their first ``light_dim`` components in it (default: as many as fill it
    about once; the others stay at the start vector). ``heavy_fraction=0`` with ``light_dim=dim`` is
    the thesis's pure count sketch.

    ``dp`` (a ``models.dp_sgd.DPConfig`` or its dict) switches learning to DP-SGD: ``learn_many``
    then takes one noisy step per ``batch_size`` consecutive ratings (stream mode) and
    ``noisy_step`` takes one on a given batch (epoch training with Poisson sampling); the global
    mean becomes a learned offset starting at the public range's midpoint. The privacy this buys
    is accounted outside the model (``privacy.accounting``), from ``dp.stream_multiplier()`` or
    ``dp.epoch_multiplier()``.

    ``implicit`` K > 0 adds SVD++'s implicit feedback (``models.implicit``): a user's vector also
    sums the implicit vectors of its last K distinct rated items, kept in a bounded history table
    (``history``) sized, like the sketch, by ``capacity`` / ``space_gain``. Off by default; not with
    DP-SGD, SGLD or loss clipping.

    ``store`` (a ``models.storage.FactorStore``) holds every learned parameter as the compiled
    kernels take it: the two sketches' cells, their salts, the start vectors' salts and the
    filter's slots.

    Parameters
    ----------
    dim : latent dimension d.
    depth, width, capacity, space_gain : the sketch's shape (above); give ``capacity`` or ``width``.
    lr, reg, bias_reg, init_std, lr_schedule_T : SGD's step, L2 weights, start vectors' std and the
        step's decay over epochs (``models.base.FactorizationModel``).
    clip_loss, dp : the privacy modes loss clipping and DP-SGD (above).
    heavy_fraction, heavy_slots, light_dim : the exact slots of the heaviest ids (above).
    steps : the step rule (``models.steps``): ``SGD(lr)``, ``AdaGrad(lr, acc0)`` (per cell),
        ``AdaGradId(lr, acc0)`` (one sum per id) or ``SGLD(lr, temperature)`` (SGD steps with
        Gaussian noise, the "sgld" privacy mode); recorded in checkpoints.
    optimizer, acc0, sgld_temperature : the older spelling of ``steps`` ("sgd", "adagrad",
        "adagrad-id"; AdaGrad's start; SGLD's tau): with ``lr`` they build the rule when
        ``steps`` is not given.
    implicit, implicit_lr, implicit_reg : SVD++'s implicit term (above).
    seed : fixes hashing and start vectors (SGLD's noise is fresh entropy: ``models.steps.SGLD``).

    Examples
    --------
    >>> from sketchrec import SketchMF
    >>> model = SketchMF(dim=8, capacity=100, seed=0)
    >>> size = model.nbytes
    >>> _ = model.learn_many(["ann", "bob", "ann"], ["up", "up", "heat"], [5.0, 4.0, 2.0])
    >>> model.nbytes == size, [item for item, _ in model.recommend("bob", k=2)]
    (True, ['up', 'heat'])
    """

    # fleet replicas (state_arrays): the filter's slots follow announcements, the implicit
    # history is one learner's; the cells, biases, AdaGrad sums and DP step count add
    STATE_MERGES = {**{saved: SLOTS for saved in _FILTER_ARRAYS.values()},
                    **{f"implicit_{n}": LOCAL for n in ("vectors", "items", "owners", "seen")}}

    def __init__(self, dim: int = 64, depth: int = 4, width: int | None = None,
                 space_gain: float = 1.0, capacity: int | None = None, lr: float = 0.03,
                 reg: float = 0.085, bias_reg: float | None = 0.05, init_std: float = 0.05,
                 lr_schedule_T: float = 20.0, sgld_temperature: float | None = None,
                 clip_loss: float | None = None, seed: int = 0, dp: DPConfig | dict | None = None,
                 heavy_fraction: float | None = None, heavy_slots: int | None = None,
                 light_dim: int | None = None, optimizer: str = "sgd", acc0: float = 1.0,
                 implicit: int = 0, implicit_lr: float = 0.005, implicit_reg: float = 0.2,
                 steps: step_rules.StepRule | dict | None = None):
        # the old keywords build the rule; with steps= they must agree with it (models.steps)
        steps = step_rules.resolve(steps, optimizer, lr, acc0, sgld_temperature, _KEYWORD_DEFAULTS)
        super().__init__(dim=dim, lr=steps.lr, reg=reg, bias_reg=bias_reg, init_std=init_std,
                         lr_schedule_T=lr_schedule_T, clip_loss=clip_loss, seed=seed, steps=steps)
        self.depth, self.space_gain, self.capacity = int(depth), float(space_gain), capacity
        if width is None:
            width = (DEFAULT_WIDTH if capacity is None
                     else width_for_space_gain(capacity, self.dim, space_gain, self.depth))
        self.width = int(width)
        bias_width = max(1, -(-self.width * self.depth // self.dim))
        self._split_memory(heavy_fraction, heavy_slots, light_dim, dp is not None)
        self.biases = CountSketch(bias_width, self.depth, 1, seed=(self.seed or 0) + 1)
        if steps.optimizer != "sgd" and dp is not None:
            raise ValueError("DP-SGD takes plain SGD steps (its noise is calibrated to them): "
                             "give steps=SGD(lr) (optimizer 'sgd')")
        self.implicit_lr, self.implicit_reg = float(implicit_lr), float(implicit_reg)
        self.history = ImplicitHistory.off(self.dim)
        self._bind_store()
        self._dp = DPConfig.of(dp)
        self.implicit = implicit
        self.dp_steps = np.zeros(1, dtype=np.int64)      # noisy steps taken (public: not a noise seed)
        self.user_counts: dict[int, int] = {}           # stream mode, user unit: ratings kept per user
        self._stepper = None
        if self._dp is not None:
            if self.sgld_temperature or self.clip_loss:
                raise ValueError("dp replaces sgld and loss clipping; give one mode")
            lo, hi = self.dp.rating_range
            # public statistics only: the offset mu (stats[TOTAL] with count 1) is learned privately
            self.stats[:] = (1.0, (lo + hi) / 2.0, lo, hi)

    def _split_memory(self, heavy_fraction: float | None, heavy_slots: int | None,
                      light_dim: int | None, dp: bool) -> None:
        """Share the vectors' k x w cells between the heavy-hitter filter and the count sketch,
        and choose how many components light ids keep in the sketch."""
        if heavy_fraction is None:
            # the privacy modes (DP-SGD, SGLD, thesis loss clipping) keep the thesis's pure count
            # sketch: exact slots fit the heavy ids' ratings closely, and the canary audit sees it
            # (ML-100k, --clip-loss 1: epsilon lower bound 0.82 with the filter, 0.00 without)
            privacy = dp or bool(self.sgld_temperature) or self.clip_loss is not None
            heavy_fraction = 0.0 if privacy else DEFAULT_HEAVY_FRACTION
        if not 0.0 <= heavy_fraction < 1.0:
            raise ValueError("heavy_fraction must lie in [0, 1)")
        if dp and (heavy_fraction > 0 or heavy_slots):
            # which ids hold a slot depends on the data itself; DP-SGD accounts only the gradients
            raise ValueError("DP-SGD keeps no heavy-hitter filter: heavy_fraction must be 0 (which "
                             "ids hold a slot is decided by the data, outside the accountant)")
        self.heavy_fraction = float(heavy_fraction)
        if heavy_slots is None:
            heavy_slots = int(self.heavy_fraction * 4 * self.width * self.depth) // slot_bytes(self.dim)
        self.heavy = HeavyFilter(heavy_slots, self.dim)
        sketch_width = max(1, self.width - -(-self.heavy.nbytes // (4 * self.depth)))
        self.vectors = CountSketch(sketch_width, self.depth, self.dim, seed=self.seed or 0)
        if light_dim is None:
            light_dim = self._fitting_light_dim()
        if not 1 <= light_dim <= self.dim:
            raise ValueError("light_dim must lie in [1, dim]")
        if dp and light_dim != self.dim:
            raise ValueError("dp sketches every component (its clipping bound covers them all): "
                             "light_dim must equal dim")
        self.light_dim = int(light_dim)

    @classmethod
    def _upgrade_params(cls, params: dict) -> dict:
        # checkpoints from before the heavy-hitter filter hold a pure count sketch of every component
        if "heavy_fraction" not in params:
            params = {**params, "heavy_fraction": 0.0, "light_dim": params["dim"]}
        return super()._upgrade_params(params)

    def _fitting_light_dim(self) -> int:
        """Components an id outside the filter keeps in the sketch: as many as let the expected
        light ids (capacity - slots) fill the sketch's k x w cells about once, at most d. At
        gamma <= 1 that is d; at higher gamma a light id keeps fewer components, each with less
        collision noise, rather than d of them drowned in it (ML-100k holdout at gamma = 4:
        0.9330 with all 64, 0.926 with 8). Without a capacity there is no estimate: d."""
        if self.capacity is None or self.heavy.n_slots == 0:
            return self.dim
        light_ids = max(1, self.capacity - self.heavy.n_slots)
        cells = self.vectors.width * self.depth
        return int(min(self.dim, max(1, round(cells / light_ids))))

    def _bind_store(self) -> None:
        """(Re)build ``store`` over the sketches' and the filter's current arrays."""
        self.store = FactorStore(
            cells=self.vectors.cells, bias_cells=self.biases.cells,
            # light ids keep only their first light_dim components in the sketch
            salts=np.stack([self.vectors.salts(f)[:, :self.light_dim] for f in (USER, ITEM)]),
            bias_salts=np.stack([self.biases.salts(USER), self.biases.salts(ITEM)]),
            init_salts=self._init_salts, heavy=self.heavy.slots(), implicit=self.history.arrays)
        if self.optimizer == "sgd":
            self.acc = Accumulators.empty()
        elif getattr(self, "acc", None) is None:
            self.acc = Accumulators.like(self.vectors.cells, self.biases.cells, self.heavy.n_slots,
                                         self.dim, per_id=self.optimizer == "adagrad-id")

    @property
    def implicit(self) -> int:
        """Items of a user's history in its vector (``models.implicit``, SVD++'s implicit
        feedback; 0: off). Can be switched on before learning (``Experts`` does it for epochs)."""
        return self.history.length

    @implicit.setter
    def implicit(self, length: int) -> None:
        if int(length) == self.history.length:
            return
        if length and (self._dp is not None or self.sgld_temperature or self.clip_loss is not None):
            raise ValueError("the privacy modes' steps are accounted for p, q and the biases "
                             "alone: implicit must be 0 with dp, SGLD or loss clipping")
        self.history = ImplicitHistory.sized(self.capacity, int(length), self.dim,
                                              self.space_gain)
        self._bind_store()

    @property
    def heavy_slots(self) -> int:
        """Slots of the heavy-hitter filter (a multiple of its bucket size)."""
        return self.heavy.n_slots

    @property
    def dp(self) -> DPConfig | None:
        """The DP-SGD configuration (None: plain SGD). Another one can be assigned to a DP model
        (e.g. the noise calibrated for an epoch plan); the next noisy step uses it."""
        return self._dp

    @dp.setter
    def dp(self, config: DPConfig | dict) -> None:
        config = DPConfig.of(config)
        if config is None or self._dp is None:
            raise ValueError("dp is chosen at construction; only its settings can change")
        self._dp, self._stepper = config, None

    def record_noisy_step(self, ratings: int, offset_step: float) -> None:
        """Count one DP-SGD step over ``ratings`` ratings (the public step counter) and move the
        learned global offset by -offset_step (``models.dp_sgd.NoisyStepper`` has written the cells)."""
        self.stats[TOTAL] -= offset_step
        self.dp_steps[0] += 1
        self.counters[LEARNED] += ratings

    def _state_arrays(self) -> dict[str, np.ndarray]:
        # the exact per-user cap counts are operator state, not model: see operator_state()
        heavy = self.heavy.state_arrays()
        adaptive = {} if self.optimizer == "sgd" else dict(zip(("acc_vectors", "acc_biases",
                                                                 "acc_heavy"), self.acc))
        return {"vectors": self.vectors.cells, "biases": self.biases.cells, "dp_steps": self.dp_steps,
                **{saved: heavy[name] for name, saved in _FILTER_ARRAYS.items()}, **adaptive,
                **self.history.state_arrays()}

    def operator_state(self) -> bytes:
        """The user unit's exact cap counts (keys: public hashes of ids), kept out of to_bytes()
        and checkpointed beside the model as operator state (a ``sketchrec.frame``)."""
        users = np.fromiter(self.user_counts.keys(), dtype=np.uint64, count=len(self.user_counts))
        counts = np.fromiter(self.user_counts.values(), dtype=np.int64, count=len(self.user_counts))
        return frame.encode(CAPS_MAGIC, {}, {"capped_users": users, "capped_counts": counts})

    def load_operator_state(self, blob: bytes) -> None:
        """Back from ``operator_state`` (or its ``np.savez`` archive of before the frame)."""
        arrays = frame.decode_arrays(blob, CAPS_MAGIC, "user cap counts").parts
        self.user_counts = dict(zip(arrays["capped_users"].tolist(), arrays["capped_counts"].tolist()))

    def _load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.vectors.load_state_arrays({"cells": arrays["vectors"]})
        self.biases.load_state_arrays({"cells": arrays["biases"]})
        self.dp_steps = arrays.get("dp_steps", self.dp_steps)
        if "filter_vectors" in arrays:
            self.heavy.load_state_arrays({name: arrays[saved] for name, saved in _FILTER_ARRAYS.items()})
        if "capped_users" in arrays:
            self.user_counts = dict(zip(arrays["capped_users"].tolist(),
                                        arrays["capped_counts"].tolist()))
        if "acc_vectors" in arrays:
            self.acc = Accumulators(arrays["acc_vectors"], arrays["acc_biases"], arrays["acc_heavy"])
        self.history.load(arrays)
        self._bind_store()
        self._stepper = None

    @property
    def nbytes(self) -> int:
        return (self.vectors.nbytes + self.biases.nbytes + self.heavy.nbytes + self.stats.nbytes
                + self.counters.nbytes + sum(a.nbytes for a in self.acc) + self.history.nbytes)

    def _learn_keys(self, ukeys, ikeys, ratings, hp, out) -> None:
        if self.dp is None:
            sketch_learn(self.store, self.acc, ukeys, ikeys, ratings, hp, self.stats, self.counters, out)
            return
        # stream mode: one noisy step per batch_size consecutive ratings (positions, not content,
        # decide the steps); over the user cap a rating is predicted but not learned
        keep = self._within_user_cap(ukeys)
        if not keep.all():
            dropped = np.flatnonzero(~keep)
            out[dropped] = self.predict_many(ukeys[dropped], ikeys[dropped])
        kept = np.flatnonzero(keep)
        size = self.dp.batch_size
        for start in range(0, kept.shape[0], size):
            idx = kept[start:start + size]
            pred = np.empty(idx.shape[0])
            self._noisy(ukeys[idx], ikeys[idx], ratings[idx], hp, pred)
            out[idx] = pred

    def _within_user_cap(self, ukeys) -> np.ndarray:
        """Which ratings stay under the user unit's cap m (exact per-user counts: a count-min
        sketch would over-count through collisions, and then adding or removing one user would
        change which OTHER users' ratings are dropped, breaking the user-level sensitivity)."""
        keep = np.ones(ukeys.shape[0], dtype=bool)
        if self.dp.unit != "user":
            return keep
        cap, counts = self.dp.user_cap, self.user_counts
        for n, key in enumerate(ukeys.tolist()):
            seen = counts.get(key, 0)
            if seen >= cap:
                keep[n] = False
            else:
                counts[key] = seen + 1
        return keep

    def _noisy(self, ukeys, ikeys, ratings, hp, out) -> None:
        if self._stepper is None:
            self._stepper = NoisyStepper(self, self.dp)
        self._stepper.step(ukeys, ikeys, ratings, hp, out)

    def noisy_step(self, users, items, ratings, epoch: int = 0) -> np.ndarray:
        """One DP-SGD step on exactly this batch (epoch training draws the batch by Poisson
        sampling); returns the predictions made at the step's start."""
        if self.dp is None:
            raise ValueError("noisy_step needs a model built with dp=...")
        ukeys, ikeys = self.id_keys.as_keys(users), self.id_keys.as_keys(items)
        r = np.ascontiguousarray(ratings, dtype=np.float64).reshape(-1)
        out = np.empty(r.shape[0])
        self._noisy(ukeys, ikeys, r, self.hyper(epoch), out)
        return out

    def _predict_keys(self, ukeys, ikeys, clip, out) -> None:
        sketch_predict(self.store, ukeys, ikeys, self.hyper(), self.stats, clip, out)

    def score_items(self, user, items) -> np.ndarray:
        ikeys = self.id_keys.as_keys(items)
        out = np.empty(ikeys.shape[0], dtype=np.float64)
        sketch_score(self.store, self.id_keys.as_keys(user)[0], ikeys, self.hyper(), self.stats, out)
        return out

    def factors(self, ids, family: int) -> tuple[np.ndarray, np.ndarray]:
        keys = self.id_keys.as_keys(ids)
        vectors = np.empty((keys.shape[0], self.dim))
        biases = np.empty(keys.shape[0])
        sketch_factors(self.store, keys, family, self.init_std, vectors, biases)
        return vectors, biases

    def user_vectors(self, users) -> np.ndarray:
        """Latent vectors of users as the model sees them (start vector + sketch estimate)."""
        return self.factors(users, USER)[0]


# the old step keywords' defaults (optimizer, lr, acc0, sgld_temperature): left at these, they defer to steps=
_KEYWORD_DEFAULTS = tuple(inspect.signature(SketchMF.__init__).parameters[name].default
                          for name in ("optimizer", "lr", "acc0", "sgld_temperature"))
