"""`sketchrec produce`: publish a ratings file to a Kafka topic, optionally perturbed on the
"device" with local DP."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sketchrec.cli.options import parse_range
from sketchrec.stream.kafka.producer import COMPRESSIONS


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="sketchrec produce", description="Publish a ratings file to a "
                                 "Kafka topic (keyed by user; the topic is created if needed).")
    ap.add_argument("path", type=Path, help="any ratings file replay reads")
    ap.add_argument("--bootstrap", required=True, metavar="HOST:PORT")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--rate", type=float, help="ratings per second (default: as fast as possible)")
    ap.add_argument("--timeout", type=float, default=120.0, metavar="S",
                    help="across a broker outage, wait up to S seconds for every message to be "
                    "acknowledged; then a one-line error with the count delivered (exit 2)")
    ap.add_argument("--batch", type=int, default=1, help="ratings per message (1: one CSV rating each)")
    ap.add_argument("--partitions", type=int, default=2, help="partitions when creating the topic")
    ap.add_argument("--compression", choices=COMPRESSIONS, default="none",
                    help="codec of the record batches, as production producers set it")
    ap.add_argument("--ldp-epsilon", type=float, metavar="E",
                    help="local DP: perturb every rating with Bounded Laplace before it is sent")
    ap.add_argument("--rating-range", metavar="L,U", help="the rating range of --ldp-epsilon")
    ap.add_argument("--seed", type=int, help="refused: the device noise of --ldp-epsilon always comes "
                    "from fresh secret entropy (a seeded noise gives back every raw rating)")
    return ap


def produce_main(argv: list[str] | None = None) -> int:
    from kafka.errors import KafkaError

    from sketchrec.data import read_ratings
    from sketchrec.stream.kafka.producer import produce
    ap = build_parser()
    args = ap.parse_args(argv)
    if not args.path.is_file():
        print(f"sketchrec produce: no such file: {args.path}", file=sys.stderr)
        return 2
    if args.seed is not None:   # whoever knows the seed regenerates the noise and reads every rating
        ap.error("--seed: the device noise is never seeded (whoever knew the seed could subtract it "
                 "and read every raw rating); drop --seed, the noise comes from fresh secret entropy")
    randomiser = None
    if args.ldp_epsilon is not None:
        from sketchrec.privacy.ldp import DeviceRandomiser
        if not args.rating_range:
            ap.error("--ldp-epsilon needs --rating-range L,U")
        try:
            lo, hi = parse_range(args.rating_range)
        except SystemExit as exc:
            ap.error(str(exc))
        randomiser = DeviceRandomiser(args.ldp_epsilon, lo, hi)
    data, report = read_ratings(args.path)
    data.sort_by_time()   # as devices would send them (ties in file order), in place: one copy
    try:
        result = produce(data, args.bootstrap, args.topic, args.batch, args.rate,
                         args.partitions, randomiser, compression=args.compression,
                         timeout=args.timeout)
    except KafkaError as exc:
        print(f"sketchrec produce: cannot publish to {args.bootstrap}: {exc}", file=sys.stderr)
        return 2
    result["skipped"] = dict(report.skipped)
    print(f"produced {result['ratings']:,} ratings in {result['messages']:,} messages to {args.topic} "
          f"in {result['seconds']:.1f} s ({result['ratings_per_s']:,.0f} ratings/s)", file=sys.stderr)
    print(json.dumps(result))
    return 0
