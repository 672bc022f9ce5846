"""Ids in answers follow one rule on every route, whichever path answers (the fast path or the
app): a canonical decimal integer is a JSON number, any other id a string. A query string carries
every id as text; before, /recommend gave the user as "7" and its items as 7."""

import numpy as np
import pytest

from sketchrec.models import SketchMF
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.serving.http import create_app
from sketchrec.stream.serving.server import ServerThread
from sketchrec.stream.service import LearningService
from conftest import http


@pytest.fixture(scope="module", params=["fast path", "app"])
def base(request):
    rec = Recommender(SketchMF(dim=4, capacity=200, seed=0), pair_capacity=1000)
    users = np.array([7, 7, 8, 8] * 10, dtype=object)
    users[:4] = ["u-1", "u-1", "0405", "0405"]      # ids that are not canonical integers stay text
    items = np.array([1, 2, 3, 4] * 10, dtype=object)
    items[::5] = "film-9"
    rec.learn_many(users, items, np.linspace(1, 5, 40))
    app = create_app(LearningService(rec), None, access=False)
    if request.param == "app":
        app.fast = None   # every request to the app's own routes
    server = ServerThread(app, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{server.port}"
    server.stop()


def test_integers_are_numbers_and_other_ids_strings_on_every_route(base):
    prediction = http.get(base + "/predict", params={"user": "7", "item": "2"}).json()
    assert prediction["user"] == 7 and prediction["item"] == 2
    for user, shown in (("7", 7), ("u-1", "u-1"), ("0405", "0405")):
        answer = http.get(base + "/recommend", params={"user": user, "k": 10}).json()
        assert answer["user"] == shown
        ids = [entry["item"] for entry in answer["items"]]
        assert set(ids) <= {1, 2, 3, 4, "film-9"} and ids
        assert all(type(i) is int for i in ids if i != "film-9")
    similar = http.get(base + "/similar", params={"item": "3", "k": 3}).json()
    assert similar["item"] == 3 and all(isinstance(entry["item"], (int, str)) for entry in similar["items"])
