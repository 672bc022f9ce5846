"""Ratings posted over HTTP (``POST /ratings``): read like a message of the topic, then taken by
the service's one way in.

- ``read_posted`` reads a request body with the topic's own parser (``kafka.messages``: JSON, one
  rating object or a list), so a posted rating is accepted or set aside for the same named reasons
  as a consumed one; it never raises on the body's content.
- ``KafkaFeedback`` (a service that consumes a topic: ``consume``) produces the good ratings to
  that topic in the codec its consumer reads, keyed by user as ``sketchrec produce`` keys them, and
  answers once the broker acknowledged them: they are learned when consumed, exactly once in
  state like every other rating of the topic (dead letters, checkpoints, the DP pass included).
- ``DirectFeedback`` (``replay --serve``) learns them at once through the service's recommender,
  the path every replayed rating takes: a DP-SGD model's noisy steps, user cap and private
  fallback. The ratings posted to a service form a stream of their own, so in a DP-SGD mode their
  pass is charged to the service's ledger (``LearningService.begin_private_pass``, as ``consume``
  charges its pass) before the first of them is learned; when that pass does not fit the budget
  they are refused and counted.
- ``ForwardedFeedback`` (a ``--workers`` reader process, which only reads the model): the request
  is relayed as it came, its credentials with it, to the learner's own loopback endpoint, whose
  route above takes it (checks the tokens, counts what it sets aside, learns or produces) exactly as
  one process would; the learner's answer is the reader's.
- ``Refusal``: what cannot take ratings says why, in the capability table's line
  (``models.capabilities.FEEDBACK``): a read-only replica, an epoch-planned DP run.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass

import numpy as np

from sketchrec.models.capabilities import FEEDBACK
from sketchrec.stream.kafka.intake import finite_errors, ids
from sketchrec.stream.kafka.messages import Parsed, encode_batch, parse_message

MAX_POSTED = 10_000        # ratings one request may hold
MAX_BODY = 2 << 20         # bytes of one request body
ACK_TIMEOUT_S = 15.0       # how long a produced batch may wait for the broker's acknowledgement
BUDGET_SPENT = "privacy budget spent"

# A reader reaches its learner on loopback only. urllib's default opener honours http_proxy even
# for 127.0.0.1, which would hand users' tokens and ratings to a proxy: this opener has none.
LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def loopback_call(request: urllib.request.Request, timeout: float) -> tuple[int, dict]:
    """Send ``request`` to a process on loopback (``LOOPBACK``: no proxy) and return its (status,
    JSON answer). An HTTP error is an answer too: its status and its JSON body (or its reason as
    ``detail`` when the body is not JSON). A request that got no answer raises (``OSError``), and so
    does a success whose body is not JSON (``ValueError``): the caller decides what each means.

    Examples
    --------
    >>> loopback_call(urllib.request.Request("http://127.0.0.1:1/"), 1)   # nothing listens there
    Traceback (most recent call last):
    ...
    urllib.error.URLError: <urlopen error [Errno 111] Connection refused>
    """
    try:
        with LOOPBACK.open(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:   # the other process's refusal (401, 403, 409, 507, ...)
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {"detail": str(exc.reason)}


class FeedbackRefused(Exception):
    """Ratings the service does not take now: an HTTP ``status`` and one line saying why."""

    def __init__(self, status: int, line: str):
        super().__init__(line)
        self.status, self.line = status, line


def read_posted(body: bytes, rating_range: tuple[float, float] | None = None) -> Parsed:
    """The ratings of a request body (JSON: one rating object or a list of them) and its rejected
    parts as (index, reason, text), by the topic's own rules. A body that is not JSON is rejected
    whole (a topic also takes CSV lines; an HTTP client sends JSON).

    >>> read_posted(b'[{"user": 1, "item": 2, "rating": 4}, {"user": 1, "item": 2, "rating": 9}]', (0.5, 5)).rejected
    [(1, 'rating out of range', '{"user": 1, "item": 2, "rating": 9}')]
    >>> read_posted(b"1,2,4").rejected[0][1]
    'not JSON (send a rating object or a list of them)'
    """
    if not body.lstrip()[:1] in (b"[", b"{"):
        return Parsed(rejected=[(0, "not JSON (send a rating object or a list of them)", "")])
    return parse_message(body, rating_range)


def columns(rows: list[tuple]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """users, items, ratings of parsed (user, item, rating, timestamp) rows, ids typed as the
    consumer types them (``kafka.intake.ids``)."""
    return (ids([r[0] for r in rows]), ids([r[1] for r in rows]),
            np.array([r[2] for r in rows], dtype=np.float64))


@dataclass
class Refusal:
    """A service that takes no ratings over HTTP: ``route`` names its ``FEEDBACK`` cell."""

    route: str
    rating_range: tuple[float, float] | None = None

    def take(self, rows: list[tuple]) -> dict:
        raise FeedbackRefused(409, FEEDBACK[self.route].line())


class ForwardedFeedback:
    """A reader process's way in: ``relay`` sends a posted request to the learner's loopback
    endpoint ``url`` (see the module docstring) and returns its (status, JSON answer).

    Parameters
    ----------
    url: the learner's loopback address (``http://127.0.0.1:PORT``).
    rating_range: the learner's (what the reader reads the request by before relaying it).
    timeout: seconds the learner may take to answer (above its own wait for the broker).

    Examples
    --------
    >>> ForwardedFeedback("http://127.0.0.1:1").relay(b"[]", None, None)[0]   # nothing listens there
    503
    """

    route = "forwarded"

    def __init__(self, url: str, rating_range: tuple[float, float] | None = None,
                 timeout: float = ACK_TIMEOUT_S + 5):
        self.url, self.rating_range, self.timeout = url.rstrip("/"), rating_range, timeout

    def relay(self, body: bytes, token: str | None, authorization: str | None) -> tuple[int, dict]:
        import urllib.parse
        query = f"?{urllib.parse.urlencode({'token': token})}" if token is not None else ""
        headers = {"Content-Type": "application/json",
                   **({"Authorization": authorization} if authorization is not None else {})}
        request = urllib.request.Request(f"{self.url}/ratings{query}", data=body, method="POST",
                                         headers=headers)
        try:
            return loopback_call(request, self.timeout)   # the learner's answer, refusals included
        except (OSError, ValueError) as exc:
            if isinstance(getattr(exc, "reason", exc), ConnectionRefusedError):   # never sent
                return 503, {"detail": "the learner is not listening (ConnectionRefusedError); "
                                       "nothing was taken, send the ratings again"}
            # sent, then a timeout, a reset or an unreadable answer: the learner may have taken them
            return 504, {"detail": f"the learner's answer was lost ({type(exc).__name__}); the "
                                   "ratings may have been taken, check before sending them again"}


def _refusal(acknowledged: int, total: int, concerned: dict, what: str, failed: dict | None = None) -> str:
    """One line: how many of ``total`` ratings the broker acknowledged, and which users' are
    ``what`` (a few named; with ``failed`` besides, those users' ratings were not taken)."""
    def users(keys) -> str:
        names = [key.decode(errors="replace") for key in keys]
        return ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    error = type(next(iter(concerned.values()))).__name__
    line = (f"the broker acknowledged {acknowledged} of {total} ratings ({error}); the ratings of "
            f"users {users(concerned)} were {what}")
    if failed:
        line += f"; those of users {users(failed)} were not taken: send them again"
    return line


class DirectFeedback:
    """Learns posted ratings through ``service.recommender`` (see the module docstring).

    Parameters
    ----------
    service: the ``LearningService`` whose model learns them.
    rating_range: ratings outside it are set aside (None: any finite rating).
    unit, delta, budget: a DP-SGD service's privacy unit, delta and epsilon budget, for the pass
        of the posted ratings.

    Examples
    --------
    >>> from sketchrec.models import SketchMF
    >>> from sketchrec.stream.recommender import Recommender
    >>> from sketchrec.stream.service import LearningService
    >>> service = LearningService(Recommender(SketchMF(dim=4, capacity=100)))
    >>> DirectFeedback(service).take([("ann", "up", 4.0, 0)]), service.ratings_learned
    ({'learned': 1}, 1)
    """

    route = "direct"

    def __init__(self, service, rating_range: tuple[float, float] | None = None,
                 unit: str = "rating", delta: float = 1e-5, budget: float | None = None):
        self.service, self.rating_range = service, rating_range
        self.unit, self.delta, self.budget = unit, delta, budget
        self._pass_begun = False
        self._lock = threading.Lock()

    def take(self, rows: list[tuple]) -> dict:
        service = self.service
        if not service.recommender.learning.is_set():   # learning would wait for /resume
            raise FeedbackRefused(503, "learning is paused (POST /resume); nothing was learned")
        users, items, ratings = columns(rows)
        with self._lock:
            if not self._pass_begun:
                self._begin_pass()
            if service.budget_stopped:
                service.record_skipped({BUDGET_SPENT: len(rows)})
                raise FeedbackRefused(409, "the privacy budget is spent: one more pass of posted "
                                      "ratings would exceed it; nothing was learned")
            predictions = service.recommender.learn_many(users, items, ratings)
            service.errors.add(*finite_errors(predictions, ratings))
        return {"learned": len(rows)}

    def _begin_pass(self) -> None:
        """Charge the posted ratings' pass to the ledger (a DP-SGD model; else nothing), made
        durable first when the service checkpoints, as ``consume`` does with its pass."""
        service = self.service
        self._pass_begun = True
        if service.begin_private_pass(self.unit, self.delta, self.budget) \
                and service.ledger is not None and service.checkpoints is not None:
            service.checkpoint()


class KafkaFeedback:
    """Produces posted ratings to the topic a service consumes (see the module docstring).

    Parameters
    ----------
    bootstrap, topic: the broker and the topic the service's consumer reads.
    rating_range: ratings outside it are set aside before they are sent (the consumer's range).

    Examples
    --------
    >>> KafkaFeedback("127.0.0.1:9092", "ratings").route
    'kafka'
    """

    route = "kafka"

    def __init__(self, bootstrap: str, topic: str, rating_range: tuple[float, float] | None = None):
        self.bootstrap, self.topic, self.rating_range = bootstrap, topic, rating_range
        self._producer = None
        self._lock = threading.Lock()

    def _open(self):
        with self._lock:
            if self._producer is None:
                from kafka import KafkaProducer

                from sketchrec.stream.kafka.consumer import kafka_config
                self._producer = KafkaProducer(**kafka_config(self.bootstrap), acks="all", linger_ms=0)
            return self._producer

    def take(self, rows: list[tuple]) -> dict:
        """Produce ``rows``, one message per user, and wait for the broker's acknowledgements.
        A refusal names the users concerned: 504 when some were handed to the producer and not
        acknowledged (in time, or with an error that came after they were sent: the broker may
        have written them, and the producer may still deliver them; check before sending them
        again, or they would be learned twice), else 503 for those never handed to it (send
        them again)."""
        from kafka.errors import KafkaError
        by_user: dict = {}
        for row in rows:   # one user's ratings stay in order on one partition
            by_user.setdefault(str(row[0]).encode(), []).append(row)
        acknowledged, unsent, unsure, sent = 0, {}, {}, []
        try:
            producer = self._open()
        except KafkaError as exc:
            producer, unsent = None, {key: exc for key in by_user}
        for key, group in (by_user.items() if producer is not None else ()):
            try:
                sent.append((key, producer.send(self.topic, key=key, value=encode_batch(group)), len(group)))
            except KafkaError as exc:   # refused before the producer took it
                unsent[key] = exc
        for key, future, n in sent:   # every batch handed over is waited for, whatever came before
            try:
                future.get(timeout=ACK_TIMEOUT_S)
                acknowledged += n
            except KafkaError as exc:
                unsure[key] = exc
        if unsure:
            raise FeedbackRefused(504, _refusal(
                acknowledged, len(rows), unsure, "not acknowledged: they may still be taken, "
                "check before sending them again", unsent))
        if unsent:
            raise FeedbackRefused(503, _refusal(acknowledged, len(rows), unsent,
                                                "not taken: send them again"))
        return {"produced": len(rows), "topic": self.topic}

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(timeout=5)
