"""A recommender's learning hooks and its learner share one hashing of a batch: the keys its
``before_batch`` hooks count (a fleet replica's announcements) are the very arrays learned."""

import numpy as np

from sketchrec.models import SketchMF
from sketchrec.stream.recommender import Recommender


def test_a_batch_is_hashed_once_for_the_hooks_and_the_learner():
    rec = Recommender(SketchMF(dim=4, width=512), pair_capacity=1000, user_capacity=100)
    seen = {}
    rec.before_batch.append(lambda u, i, real: seen.update(ahead=(u, i, real)))
    rec.observers.append(lambda u, i, real: seen.update(learned=(u, i, real)))
    users = np.array(["__canary__u0", "ann", "bob"], dtype=object)
    rec.learn_many(users, ["film", "book", "film"], [4.0, 2.0, 5.0])
    (ua, ia, real), (ul, il, real_learned) = seen["ahead"], seen["learned"]
    assert ua is ul and ia is il   # not hashed a second time
    assert ua.tolist() == rec.id_keys.as_keys(users).tolist()
    assert real.tolist() == real_learned.tolist() == [False, True, True]


def test_without_hooks_the_learner_hashes_the_ids_itself():
    rec = Recommender(SketchMF(dim=4, width=512), pair_capacity=1000, user_capacity=100)
    learned = []
    rec.observers.append(lambda u, i, real: learned.append(u))
    rec.learn_many([7, 8], [1, 1], [3.0, 4.0])
    assert learned[0].tolist() == rec.id_keys.as_keys(np.array([7, 8])).tolist()
