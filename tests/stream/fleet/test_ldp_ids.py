"""A fleet member meeting a perturbed message (an LDP header) with a model whose ids use the public
hash (a fleet started without --ldp-debias) refuses the chunk in one line before learning any of
it, as one learner would key its ids there; a fleet whose first snapshot keyed ids learns it."""

from __future__ import annotations

from types import SimpleNamespace

from kafka import TopicPartition

from sketchrec.models import SketchMF
from sketchrec.privacy.keys import id_keys_of, key_local_ids
from sketchrec.privacy.ldp import HEADER, DeviceRandomiser
from sketchrec.stream.fleet.member import FleetLearner
from sketchrec.stream.recommender import Recommender

PERTURBED = [(HEADER, DeviceRandomiser(2.0, 1.0, 5.0).header())]


def chunk(*headers) -> dict:
    messages = [SimpleNamespace(offset=i, headers=h, key=None, value=b"") for i, h in enumerate(headers)]
    return {TopicPartition("ratings", 3): messages}


def member(keyed: bool) -> SimpleNamespace:
    model = SketchMF(dim=4, capacity=100)
    if keyed:   # as the first snapshot of a fleet started with --ldp-debias
        key_local_ids(model)
    assert id_keys_of(model).keyed is keyed
    return SimpleNamespace(service=SimpleNamespace(recommender=Recommender(model)), refusal=None)


def test_a_public_hash_fleet_refuses_a_perturbed_message_in_one_line():
    unkeyed = member(keyed=False)
    assert FleetLearner._ids_keyed_for(unkeyed, chunk(None, [])) and unkeyed.refusal is None   # raw: learned
    assert not FleetLearner._ids_keyed_for(unkeyed, chunk(None, PERTURBED))
    assert "partition 3 offset 1" in unkeyed.refusal and "--ldp-debias" in unkeyed.refusal
    assert "\n" not in unkeyed.refusal


def test_a_fleet_keyed_in_its_first_snapshot_learns_perturbed_messages():
    keyed = member(keyed=True)
    assert FleetLearner._ids_keyed_for(keyed, chunk(PERTURBED, PERTURBED)) and keyed.refusal is None
