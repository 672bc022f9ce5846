"""Third-party internals: each library's are reached from one module (kafka-python's from
stream/kafka/internals.py, uvicorn's protocols from stream/serving/server.py, multiprocessing's
shared-memory tracker from stream/serving/workers/block.py), and a ``Checked`` guard passes only
the versions they were read in, saying once per feature when it does not."""

import ast
import functools
import logging
from pathlib import Path

import pytest

from sketchrec.versions import Checked

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("sketchrec", "sketches", "models", "privacy", "stream", "replay", "cli", "benchmarks", "experiments")
KAFKA_PRIVATE = {"_client", "_fetcher", "_subscription", "_buffer", "_maybe_uncompress", "_num_records",
                 "_manager", "_conns", "_next_partition_records", "_parse_fetched_data", "in_flight_requests"}


def _kafka(node) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in KAFKA_PRIVATE) or (
        isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            ("kafka.consumer", "kafka.record", "kafka.client", "kafka.conn")))


def _uvicorn(node) -> bool:
    return isinstance(node, (ast.Import, ast.ImportFrom)) and any(
        name.startswith("uvicorn.protocols")
        for name in ([node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]))


def _shared_memory(node) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "_name") or (
        isinstance(node, ast.alias) and node.name == "resource_tracker")


@pytest.mark.parametrize("reaches, home", [(_kafka, "stream/kafka/internals.py"),
                                           (_uvicorn, "stream/serving/server.py"),
                                           (_shared_memory, "stream/serving/workers/block.py")],
                         ids=["kafka-python", "uvicorn", "shared memory"])
def test_each_librarys_internals_are_reached_from_one_module(reaches, home):
    found = {name for name, nodes in _product_nodes().items() if any(reaches(node) for node in nodes)}
    assert found == {home}


@functools.cache   # parsed once for the three libraries
def _product_nodes() -> dict[str, list]:
    return {str(path.relative_to(ROOT)): list(ast.walk(ast.parse(path.read_text())))
            for folder in PRODUCT for path in (ROOT / folder).rglob("*.py")}


def test_the_guard_passes_the_versions_read_and_says_once_what_it_does_instead(caplog):
    installed = ["0.54.2"]
    guard = Checked("uvicorn", (0, 29), (0, 54), lambda: installed[0])
    assert guard.usable("feature", "fallback") and not caplog.records
    installed[0] = "0.55.0"
    with caplog.at_level(logging.WARNING, logger="sketchrec"):
        assert [guard.usable("feature", "the public path") for _ in range(3)] == [False] * 3
    assert [r.getMessage() for r in caplog.records] == [
        "event=internals library=uvicorn version=0.55.0 checked=0.29-0.54.x feature='feature' "
        "fallback='the public path'"]
    assert [guard.checked(v) for v in ("0.28.9", "0.29.0", "1.0", "0.x", "")] == [False, True, False, False, False]
