"""Whole noisy steps for a DP-SGD consumer: a poll's messages are learned up to a whole multiple of
the model's noisy batch, and the rest is held back for the next poll.

Why: a DP-SGD model in stream mode takes one noisy step per ``batch_size`` consecutive ratings of a
``learn_many`` call, and the call's last step takes what is left: the full noise over fewer
ratings. A consumer hands its model one poll at a time (a fleet member one chunk), and a poll ends
wherever the fetches did, so without this nearly every poll would end in such a partial step.

Exactly once: the messages held back are consumed but not learned, and the offset book is told
only of what was learned, so no checkpoint and no fleet delta covers them. A ``kill -9`` loses
them and whoever resumes the partition consumes them again; a rebalance drops them (the partition
is sought back to where the book stands); a stream that paused (``IDLE_SECONDS`` without a
message) has them learned in a partial step. The accounting does not change: each rating is in
exactly one noisy step, and the steps are cut by the messages' counts of valid ratings and by
pauses, which a replace-one neighbour (the ledger's relation for a stream pass, whose length is
public) leaves as they are.

>>> from types import SimpleNamespace as Msg
>>> rows = [Msg(value=b"1,2,4", offset=n, headers=[]) for n in range(7)]
>>> whole = WholeBatches(batch=3, rating_range=(1.0, 5.0))
>>> learn = whole.cut({"p0": rows[:5]})
>>> [m.offset for m in learn["p0"]], [m.offset for m in whole.held["p0"]]
([0, 1, 2], [3, 4])
>>> [m.offset for m in whole.cut({"p0": rows[5:]})["p0"]], [m.offset for m in whole.held["p0"]]
([3, 4, 5], [6])
"""

from __future__ import annotations

import threading

import numpy as np

from sketchrec.models.private.dp_sgd import DPConfig
from sketchrec.stream.kafka.intake import read_message
from sketchrec.stream.kafka.messages import parse_fast

# held-back ratings past this many noisy batches are learned anyway (a partial step): messages
# whose rating counts never add up to a whole batch must not be held without bound
MAX_HELD_BATCHES = 4
# seconds without a message before the held ones are learned in a partial step: a consumer that
# caught up with a live stream finds polls empty often, and each pause would cost a partial step
IDLE_SECONDS = 1.0


def rating_counts(messages: list, rating_range) -> np.ndarray:
    """How many ratings each message gives to a poll (``intake.read_poll``'s reading: the compiled
    form where a partition's messages have no headers, else one by one; nothing is counted)."""
    if any(msg.headers for msg in messages):
        counts = np.full(len(messages), -1, np.int64)
    else:
        counts = parse_fast([msg.value for msg in messages], rating_range)[3]
    for j in np.flatnonzero(counts < 0).tolist():
        counts[j] = len(read_message(messages[j], rating_range, lambda headers, n: None).ratings)
    return counts


class WholeBatches:
    """The messages a DP-SGD consumer holds back so that each poll it learns is a whole number of
    noisy steps (module docstring). ``cut(records)`` returns what to learn now; ``held`` is the
    rest (partition -> messages, in order); ``forget(tps)`` drops a rebalanced partition's.

    Parameters
    ----------
    batch : ratings per noisy step (the model's ``dp.batch_size``).
    rating_range : the consumer's (ratings outside it are not learned, so not counted).

    Examples
    --------
    >>> from sketchrec import SketchMF
    >>> from sketchrec.models.private.dp_sgd import DPConfig
    >>> WholeBatches.of(SketchMF(dim=4, capacity=50, dp=DPConfig(1.0, batch_size=10)), None).batch
    10
    >>> WholeBatches.of(SketchMF(dim=4, capacity=50), None) is None
    True
    """

    def __init__(self, batch: int, rating_range):
        self.batch, self.rating_range = int(batch), rating_range
        self.held: dict = {}
        self.counted = 0   # ratings of the messages handed to ``cut``, each counted once
        self.learning_all = False   # set while the held messages are learned (``KafkaLearner.learn_held``)
        self._counts: dict = {}   # partition -> the held messages' rating counts
        self._forgotten: set = set()
        self._lock = threading.Lock()   # forget() runs on the rebalance listener's thread

    @classmethod
    def of(cls, model, rating_range) -> "WholeBatches | None":
        """For a DP-SGD model (its ``dp`` a ``DPConfig``), else None: other models learn any
        batch as a whole."""
        dp = getattr(model, "dp", None)
        return cls(dp.batch_size, rating_range) if isinstance(dp, DPConfig) else None

    def forget(self, tps) -> None:
        """Partitions revoked, lost or (re)assigned: their held messages are dropped at the next
        ``cut``, since each resumes where the offset book (or the fleet's model topic) stands."""
        with self._lock:
            self._forgotten.update(tps)

    def release(self) -> dict:
        """The held messages (what ``cut`` would merge), held no longer."""
        return self.cut({}, whole=False)

    def cut(self, records: dict, whole: bool | None = None) -> dict:
        """The held messages followed by ``records`` (partition -> messages), up to the last
        message boundary at a whole multiple of ``batch`` ratings; the rest is held. Everything
        with ``whole=False`` (default: unless ``learning_all``), or when more than
        ``MAX_HELD_BATCHES`` batches would stay held."""
        with self._lock:
            forgotten, self._forgotten = self._forgotten, set()
        merged, counts = {}, {}
        for tp, msgs in self.held.items():
            if tp not in forgotten:
                merged[tp], counts[tp] = msgs, self._counts[tp]
        self.held, self._counts = {}, {}
        whole = not self.learning_all if whole is None else whole
        for tp, msgs in records.items():
            if not msgs:
                continue
            # a partition sought back re-reads what was held: the fetched copy wins
            kept = sum(m.offset < msgs[0].offset for m in merged.get(tp, ()))
            merged[tp] = list(merged.get(tp, ()))[:kept] + list(msgs)
            if whole:
                fresh = rating_counts(msgs, self.rating_range)
                self.counted += int(fresh.sum())
                counts[tp] = np.concatenate([counts.get(tp, np.empty(0, np.int64))[:kept], fresh])
        if not whole or not merged:
            return merged
        ends = np.cumsum(np.concatenate([counts[tp] for tp in merged]))
        aligned = np.flatnonzero(ends % self.batch == 0)
        learn = int(aligned[-1]) + 1 if len(aligned) else 0   # messages learned now
        if ends[-1] - (ends[learn - 1] if learn else 0) > MAX_HELD_BATCHES * self.batch:
            return merged
        out, at = {}, 0
        for tp, msgs in merged.items():
            take = min(len(msgs), max(0, learn - at))
            if take:
                out[tp] = msgs[:take]
            if take < len(msgs):
                self.held[tp], self._counts[tp] = msgs[take:], counts[tp][take:]
            at += len(msgs)
        return out
