"""The serving catalogue (stream/recommender.py: Catalogue) keeps every item once, in
first-seen order, whatever batches it is given (repeats within and across batches, new and known
ids mixed): its sorted key index, which a batch is checked against, never loses or doubles one."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sketchrec.stream.recommender import Catalogue


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 60), min_size=1, max_size=30), min_size=1, max_size=25))
def test_every_item_once_in_first_seen_order(batches):
    catalogue, seen = Catalogue(), []
    for batch in batches:
        keys = np.array(batch, dtype=np.uint64) * 7919   # keys in another order than the ids
        catalogue.add(np.array(batch), keys)
        seen += [i for i in dict.fromkeys(batch) if i not in seen]
        ids, stored = catalogue.snapshot()
        assert ids == seen
        assert stored.tolist() == [i * 7919 for i in seen]
        assert catalogue._known.tolist() == sorted(stored.tolist())
