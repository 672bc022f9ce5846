"""`consume` stops its HTTP server however its learning loop ends, an error included."""

import logging

import pytest

import sketchrec.cli.consume as consume_cli
import sketchrec.stream.kafka.consumer as kafka_consumer


class _Server:
    stopped = 0

    def stop(self) -> None:
        _Server.stopped += 1


class _FailingLearner:
    """A learner built without a broker whose loop fails at once."""

    def __init__(self, *args, **kwargs):
        from threading import Event
        self.stop, self.last_checkpoint_ok = Event(), True

    def run(self, idle_exit=None) -> None:
        raise RuntimeError("the loop failed (forced by the test)")


def _consume(monkeypatch, tmp_path, learner) -> None:
    monkeypatch.setattr(kafka_consumer, "KafkaLearner", learner)
    monkeypatch.setattr(consume_cli, "start_server", lambda service, serving: _Server())
    monkeypatch.setattr(consume_cli, "on_stop_signal", lambda action: None)   # no handler in the test process
    log = logging.getLogger("sketchrec")   # consume adds a stderr handler: not beyond this test
    monkeypatch.setattr(log, "handlers", list(log.handlers))
    monkeypatch.setattr(log, "level", log.level)
    _Server.stopped = 0
    return consume_cli.consume_main(["--bootstrap", "127.0.0.1:9", "--topic", "t", "--checkpoint",
                                     str(tmp_path / "ck"), "--serve", "127.0.0.1:0", "--model", "sketch"])


def test_an_error_in_the_loop_still_stops_the_server(monkeypatch, tmp_path):
    with pytest.raises(RuntimeError, match="forced by the test"):
        _consume(monkeypatch, tmp_path, _FailingLearner)
    assert _Server.stopped == 1


def test_a_loop_that_ends_stops_the_server_once(monkeypatch, tmp_path, capsys):
    class Ending(_FailingLearner):
        def run(self, idle_exit=None) -> None:
            return None
    assert _consume(monkeypatch, tmp_path, Ending) == 0
    assert _Server.stopped == 1 and '"ratings_learned": 0' in capsys.readouterr().out
