"""One default learner: `consume` without --model learns with the same learner as `replay`
(the capability table's default), and its final JSON line names it as `replay --json` does."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

from sketchrec.data import SyntheticStream
from sketchrec.models.capabilities import DEFAULT_KIND, KINDS
from sketchrec.stream.checkpoint import CheckpointStore
from sketchrec.stream.kafka.producer import produce


def test_consume_without_model_learns_the_default_learner_and_names_it(kafka_bootstrap, tmp_path, capsys):
    topic = f"default-{uuid.uuid4().hex[:8]}"
    produce(SyntheticStream(n_ratings=2000, n_users=100, n_items=60, seed=4).all(), kafka_bootstrap,
            topic, batch=100)
    ckpt = tmp_path / "ck"
    out = subprocess.run([sys.executable, "-m", "sketchrec", "consume", "--bootstrap", kafka_bootstrap,
                          "--topic", topic, "--checkpoint", str(ckpt), "--capacity", "1000",
                          "--expected-ratings", "10000", "--exit-when-idle", "3"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    consumed = json.loads(out.stdout.strip().splitlines()[-1])
    assert consumed["model"] == DEFAULT_KIND and consumed["ratings_learned"] == 2000
    assert CheckpointStore(ckpt).latest().meta["model_class"] == KINDS[DEFAULT_KIND].model_class
    from sketchrec.cli.replay import replay_main
    assert replay_main(["--synthetic-ratings", "2000", "--quiet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["model"] == consumed["model"]
