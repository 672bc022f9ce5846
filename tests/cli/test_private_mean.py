"""A private run that served worse than its private global mean says so: in `replay`'s summary
and --json, and on the service's operator route; on the public /privacy of a DP mode only through
the release, which withholds the exact errors it is computed from."""

import json

import numpy as np
import httpx

from sketchrec.cli.replay import replay_main
from sketchrec.data import Ratings
from sketchrec.models import SketchMF
from sketchrec.models.private.dp_sgd import DPConfig
from sketchrec.models.private.fallback import DPSGDFallback
from sketchrec.privacy.mode import PrivacyMode
from sketchrec.privacy.release import release
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.service import FeedingLearner, LearningService
from sketchrec.stream.serving.http import create_app
from sketchrec.stream.serving.server import ServerThread

ADMIN = "operator-token"


def swapping(n: int, every: int, seed: int = 0) -> Ratings:
    """Even items loved and odd ones hated, swapped every ``every`` ratings: the private
    baseline's item biases, released a window late, are always the wrong way round, and a
    noisy factor model chases them; the global mean is right all along."""
    rng = np.random.default_rng(seed)
    items = rng.integers(1, 41, n)
    flip = (np.arange(n) // every) % 2 == 1
    ratings = np.where((items % 2 == 0) ^ flip, 5.0, 1.0)
    return Ratings(rng.integers(1, 401, n), items, ratings, 1_000_000 + np.arange(n))


def write_udata(data: Ratings, path) -> str:
    with open(path, "w") as fh:
        for u, i, r, t in zip(data.users, data.items, data.ratings, data.timestamps):
            fh.write(f"{u}\t{i}\t{int(r)}\t{t}\n")
    return str(path)


def run_replay(capsys, argv) -> tuple[dict, str]:
    assert replay_main([*argv, "--json", "--quiet"]) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def test_replay_says_when_the_private_model_served_worse_than_the_private_mean(capsys, tmp_path):
    path = write_udata(swapping(60_000, every=10_000), tmp_path / "u.data")
    result, summary = run_replay(capsys, [path, "--dp-noise", "2", "--lr", "0.3"])
    versus = result["versus_private_mean"]
    assert versus["worse"] and versus["served_rmse"] == result["rmse"] > versus["private_mean_rmse"]
    lines = [line for line in summary.splitlines() if "WORSE THAN MEAN" in line]
    assert len(lines) == 1 and f"{result['rmse']:.4f}" in lines[0] and versus["note"] in lines[0]


def test_a_private_model_better_than_the_mean_says_nothing(capsys):
    result, summary = run_replay(capsys, ["--synthetic-ratings", "30000", "--synthetic-users", "2000",
                                          "--synthetic-items", "1000", "--dp-epsilon", "1"])
    versus = result["versus_private_mean"]
    assert not versus["worse"] and versus["note"] is None
    assert versus["served_rmse"] == result["rmse"] <= versus["private_mean_rmse"]
    assert "WORSE THAN MEAN" not in summary


def test_the_comparison_is_operator_state_on_a_dp_service():
    model = DPSGDFallback(SketchMF(dim=4, capacity=500, seed=0, lr=0.3,
                                   dp=DPConfig(noise_multiplier=2.0, batch_size=250)), width=64, window=1000)
    service = LearningService(Recommender(model, pair_capacity=20_000, seed=0))
    learner, data = FeedingLearner(service), swapping(8000, every=1000)
    for batch in data.batches(500):
        learner.learn_many(batch.users, batch.items, batch.ratings)
    exact = service.privacy()["versus_private_mean"]
    assert exact["worse"] and exact["note"]
    assert exact["served_rmse"] > exact["private_mean_rmse"]
    server = ServerThread(create_app(service, ADMIN), "127.0.0.1", 0).start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as client:
            public = client.get("/privacy").json()
            stats = client.get("/stats").json()
            admin = client.get("/admin/privacy", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    finally:
        server.stop()
    assert "versus_private_mean" not in public and "operator_state" in public
    assert "versus_private_mean" not in stats
    assert admin["stats"]["versus_private_mean"] == exact
    # a release that treated the DP service as non-private would publish the exact errors
    assert release(PrivacyMode.NONE, service.privacy())["versus_private_mean"] == exact
