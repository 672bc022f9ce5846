"""A local-DP fleet without a broker: the counts and the mechanism of a member's perturbed ratings
travel with its deltas (``FleetState.origin``) and every replica debiases through them; a member's
own id key (what one learner draws on its first perturbed rating) would orphan what another member
learned, so a fleet member never draws one (the key is the first snapshot's)."""

import numpy as np

from sketchrec.data import SyntheticStream


def _header(epsilon=2.0):
    from sketchrec.privacy.ldp import HEADER, DeviceRandomiser
    return [(HEADER, DeviceRandomiser(epsilon, 1.0, 5.0).header())]


def test_a_member_drawing_its_own_id_key_orphans_the_others_learning():
    """Broken variant: a member counting a perturbed message as one learner does draws its own id
    key, and two replicas keyed apart answer each other's ratings with the untrained prior; a
    fleet member only counts it (the key is the first snapshot's) and the replicas answer alike."""
    from sketchrec.models import SketchMF
    from sketchrec.privacy.keys import IdKey, IdKeys, id_keys_of
    from sketchrec.stream.fleet.model_replicas import replica_for
    from sketchrec.stream.fleet.model_topic import FleetState
    from sketchrec.stream.fleet.replicas import FleetService
    from sketchrec.stream.recommender import Recommender
    from sketchrec.stream.service import LearningService
    data = SyntheticStream(n_ratings=2000, n_users=60, n_items=40, seed=4).all()
    shared = IdKeys(IdKey.fresh())   # the first snapshot's

    def replica(service_cls, keys=None):
        model = SketchMF(dim=8, capacity=500, seed=3)
        if keys is not None:
            model.id_keys = keys
        service = service_cls(Recommender(model, pair_capacity=1000))
        service.fleet = FleetState(ldp_debias=True)
        service.record_origin(_header(), 20)   # its first perturbed message
        return model

    def gap(a, b):
        ra, rb = replica_for(a), replica_for(b)
        a.learn_many(data.users, data.items, data.ratings)
        rb.apply(ra.take())
        return np.max(np.abs(a.predict_many(data.users[:50], data.items[:50])
                             - b.predict_many(data.users[:50], data.items[:50])))

    a, b = replica(FleetService, shared), replica(FleetService, shared)
    assert id_keys_of(a) is shared and gap(a, b) < 1e-6
    a, b = replica(LearningService), replica(LearningService)   # broken: each draws its own key
    assert id_keys_of(a).keyed and id_keys_of(a) is not id_keys_of(b) and gap(a, b) > 0.1


def test_the_origin_travels_with_the_deltas_and_every_replica_debiases():
    """A member's counts go into its next delta's header (and are taken once); every replica
    settling the deltas sums them, names the mechanism and maps predictions back through it."""
    from collections import Counter

    from sketchrec.models import SketchMF
    from sketchrec.models.metrics import ErrorStats
    from sketchrec.stream.fleet.model_topic import FleetState, decode_meta, encode_meta, HEADER
    from sketchrec.stream.fleet.replicas import FleetService
    from sketchrec.stream.recommender import Recommender
    member = FleetService(Recommender(SketchMF(dim=4, capacity=200), pair_capacity=100))
    member.fleet = FleetState("m1", ldp_debias=True)
    member.record_origin(_header(), 20)
    member.record_origin(None, 3)
    metas = [decode_meta([(HEADER, encode_meta("m1", seq, {0: (seq, seq + 1)}, ErrorStats(),
                                               Counter(), origin=member.take_origin()))])
             for seq in range(2)]
    assert metas[0]["origin"]["perturbed_on_device"] == 20 and metas[0]["origin"]["raw"] == 3
    assert "origin" not in metas[1]   # taken once
    replica = FleetService(Recommender(SketchMF(dim=4, capacity=200), pair_capacity=100))
    replica.fleet = FleetState.from_dict(FleetState(ldp_debias=True).to_dict())
    for offset, meta in enumerate(metas):
        replica.fleet.settle(meta, offset)
    replica.follow_origin()
    assert replica.origin == {**metas[0]["origin"]} and replica.debias_ldp
    assert replica.recommender.debias is not None
    assert replica.privacy()["local_dp"]["server_saw_raw_ratings"] is True
    undebiased = FleetService(Recommender(SketchMF(dim=4, capacity=200), pair_capacity=100))
    undebiased.fleet = FleetState()
    undebiased.fleet.settle(metas[0], 0)
    undebiased.follow_origin()
    assert undebiased.recommender.debias is None   # the fleet's choice, not the header's
