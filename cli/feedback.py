"""How each command's service takes ratings posted over HTTP (``POST /ratings``,
``stream.feedback``), and the titles of ``--items`` on what it serves (``stream.titles``)."""

from __future__ import annotations

import argparse
import sys


def add_items_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--items", metavar="FILE",
                    help="item titles (MovieLens u.item or movies.csv) given with the served "
                    "/recommend and /similar answers (replay and consume: with --serve)")


def replay_feedback(run):
    """A replay's: a stream pass learns them at once through its DP path and ledger (a DP run's
    declared range; else the file's); an epoch-trained run refuses them (its table cell)."""
    from sketchrec.stream.feedback import DirectFeedback, Refusal
    config = run.config
    if config.holdout is not None:
        return Refusal("epoch-dp" if config.dp.enabled else "holdout")
    dp = config.dp
    return DirectFeedback(run.service, dp.rating_range if dp.enabled else run.source.report.rating_range,
                          dp.unit, dp.delta, dp.budget)


def topic_feedback(bootstrap: str, topic: str, rating_range):
    """A consumer's (and a fleet member's): produced to the topic it reads, learned when consumed."""
    from sketchrec.stream.feedback import KafkaFeedback
    return KafkaFeedback(bootstrap, topic, rating_range)


def load_titles(service, items, prog: str = "sketchrec") -> None:
    """Give ``service`` the titles of ``items`` (a path; None: none); a file that is not a
    MovieLens item file ends the command with one line, exit 2."""
    if items is None:
        return
    from sketchrec.stream.titles import BadItemsFile, Titles
    try:
        service.titles = Titles.load(items)
    except BadItemsFile as exc:
        print(f"{prog}: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
