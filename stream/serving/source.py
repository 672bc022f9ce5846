"""What the HTTP app serves: the one protocol every served thing implements.

``create_app`` (``stream.serving.http``) takes a ``ServingSource`` and reads nothing else of it.
Four things implement it today: the in-process learning model (``stream.service.LearningService``,
also ``serve --checkpoint``'s read replica, built ``read_only`` from a checkpoint, and the fleet's
``FleetService``), the joint-DP model trained in one batch (``stream.serving.joint.JointService``),
and a reader process over the learner's shared memory (``workers.reader.ReplicaService``).
A source declares how it takes posted ratings (``feedback``: a route, a ``Refusal`` with the
capability table's line, or None to let the app pick: learned directly, or refused when
``read_only``) instead of the app guessing from which attributes it happens to have.

>>> class Missing:
...     recommender = None
>>> missing_members(Missing())[:3]
['checkpoint', 'checkpoints', 'feedback']
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["ServingSource", "missing_members", "require_source"]


@runtime_checkable
class ServingSource(Protocol):
    """The members the HTTP app reads of what it serves.

    Parameters
    ----------
    recommender : answers ``predict``, ``recommend`` and ``similar`` (``stream.recommender``); read
        per request, so a source may swap it (a reloaded checkpoint, a reader moved to a new block).
    health : ``ready``, ``problems()`` and ``checkpoint_error`` for ``/healthz`` (``stream.health``).
    read_only : True when nothing served learns (a checkpoint replica, a batch-trained model).
    checkpoints : where ``checkpoint()`` writes (None: nowhere, ``POST /checkpoint`` says so).
    origin : how the learned ratings arrived (``perturbed_on_device``: the local-DP mode).
    feedback : how ``POST /ratings`` is taken (``stream.feedback``), or None (module docstring).

    Examples
    --------
    >>> from sketchrec.models import SketchMF
    >>> from sketchrec.stream.recommender import Recommender
    >>> from sketchrec.stream.service import LearningService
    >>> service = LearningService(Recommender(SketchMF(dim=4, capacity=50), pair_capacity=100))
    >>> isinstance(service, ServingSource)
    True
    """

    recommender: Any
    health: Any
    read_only: bool
    checkpoints: Any
    origin: dict
    feedback: Any

    def stats(self) -> dict:
        """The figures of ``/stats`` before the release boundary (``privacy.release``)."""

    def privacy(self) -> dict:
        """The figures of ``/privacy`` before the release boundary."""

    def checkpoint(self) -> dict:
        """Write a checkpoint now (admin ``POST /checkpoint``); what was written."""

    def pause(self) -> None:
        """Stop learning until ``resume`` (admin ``POST /pause``)."""

    def resume(self) -> None:
        """Learn again after ``pause``."""

    def warm_up(self) -> None:
        """Compile (or load) the kernels that answering needs, before the first request."""


_MEMBERS = sorted(name for name in ServingSource.__annotations__) + sorted(
    name for name, value in vars(ServingSource).items() if callable(value) and not name.startswith("_"))


def missing_members(source: object) -> list[str]:
    """The ``ServingSource`` members ``source`` lacks, sorted (empty: it is one)."""
    return sorted(name for name in _MEMBERS if not hasattr(source, name))


def require_source(source: object) -> None:
    """TypeError (one line) unless ``source`` has every member the app reads."""
    missing = missing_members(source)
    if missing:
        raise TypeError(f"{type(source).__name__} is not a ServingSource: it lacks "
                        f"{', '.join(missing)} (stream.serving.source)")
