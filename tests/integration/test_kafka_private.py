"""Privacy modes of a consumer against a real Kafka-protocol broker: a DP-SGD consumer's ledger
across passes and its budget; a local-DP producer whose ratings the server never sees raw."""

import json
import subprocess
import sys
import uuid

import numpy as np
import pytest

from sketchrec.data import SyntheticStream
from sketchrec.stream.checkpoint import CheckpointStore
from sketchrec.stream.kafka.messages import parse_message
from sketchrec.stream.kafka.producer import produce
from test_kafka import consume_cmd, read_whole_topic, run_to_end


def test_dp_consumer_accounts_every_pass_and_stops_at_the_budget(kafka_bootstrap, tmp_path):
    topic = f"dp-{uuid.uuid4().hex[:8]}"
    first = SyntheticStream(n_ratings=6000, n_users=300, n_items=200, seed=11).all()
    produce(first, kafka_bootstrap, topic, batch=50)
    ckpt = tmp_path / "dp"
    dp = ["--dp-epsilon", "1", "--dp-batch", "200", "--group", f"g-{topic}"]
    one = run_to_end(consume_cmd(kafka_bootstrap, topic, ckpt, *dp))
    assert one["ratings_learned"] == 6000
    priv = one["privacy"]
    assert priv["mode"] == "dp-sgd" and priv["proven_bound"] and priv["unit"] == "rating"
    assert 0.98 <= priv["epsilon"] <= 1.0 + 1e-6
    # the monitor runs beside the consumer, but its exact figures are admin-only in a DP mode
    assert "kld" not in priv and "/admin/privacy" in priv["monitor"]
    # a restart is a new pass (offsets may be replayed): the ledger grows, it is never reset
    two = run_to_end(consume_cmd(kafka_bootstrap, topic, ckpt, *dp))
    assert two["privacy"]["epsilon"] > priv["epsilon"] + 0.2
    ledger = CheckpointStore(ckpt).latest().meta["privacy_ledger"]
    assert ledger["steps"][0]["count"] == 2
    # with the budget spent, new ratings are set aside and counted; the service still answers
    produce(SyntheticStream(n_ratings=500, n_users=300, n_items=200, seed=12).all(), kafka_bootstrap,
            topic, batch=50)
    three = run_to_end(consume_cmd(kafka_bootstrap, topic, ckpt, *dp, "--budget-epsilon",
                                   str(two["privacy"]["epsilon"])))
    assert three["ratings_learned"] == 6000
    assert three["skipped"].get("privacy budget spent") == 500
    assert three["privacy"]["budget_exhausted"] is True
    assert three["privacy"]["epsilon"] == pytest.approx(two["privacy"]["epsilon"])


def test_ldp_producer_the_server_never_sees_a_raw_rating(kafka_bootstrap, tmp_path):
    topic = f"ldp-{uuid.uuid4().hex[:8]}"
    path = tmp_path / "ratings.csv"
    data = SyntheticStream(n_ratings=3000, n_users=200, n_items=150, seed=13).all()
    path.write_text("userId,movieId,rating,timestamp\n" + "".join(
        f"{u},{i},{min(max(round(r), 1), 5)},{t}\n" for u, i, r, t in
        zip(data.users.tolist(), data.items.tolist(), data.ratings.tolist(), data.timestamps.tolist())))
    out = subprocess.run([sys.executable, "-m", "sketchrec", "produce", str(path), "--bootstrap",
                          kafka_bootstrap, "--topic", topic, "--batch", "20", "--ldp-epsilon", "2",
                          "--rating-range", "1,5"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "BoundedLaplace" in json.loads(out.stdout.strip().splitlines()[-1])["ldp"]
    # what arrived on the topic is not the file: continuous values inside the range
    values = [r for value in read_whole_topic(kafka_bootstrap, topic) for _, _, r, _ in parse_message(value).ratings]
    assert len(values) == 3000 and min(values) >= 1 and max(values) <= 5
    assert np.mean(np.isclose(values, np.round(values))) < 0.01
    result = run_to_end(consume_cmd(kafka_bootstrap, topic, tmp_path / "ckpt", "--ldp-debias"))
    local = result["privacy"]["local_dp"]
    assert local["perturbed_on_device"] == 3000 and local["raw"] == 0
    assert local["server_saw_raw_ratings"] is False and local["debiased"] is True
    assert local["mechanism"] == {"mechanism": "BoundedLaplace", "epsilon": 2.0, "range": [1.0, 5.0]}
