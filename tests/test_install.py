"""The light install: the core runs `replay` and the Python API without any extra's library, and
a feature whose extra is missing stops with one line naming it (exit 2, no traceback).

An extra is made "not installed" in a subprocess by a meta-path finder that refuses its modules,
as a fresh `pip install .` would lack them."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sketchrec.extras import EXTRAS, MissingExtra, from_import_error

REPO = Path(__file__).resolve().parents[1]
EVERY_EXTRA = sorted(m for modules in EXTRAS.values() for m in modules)

BLOCKER = """
import sys
from importlib.abc import MetaPathFinder
BLOCKED = set(sys.argv[1].split(","))
class Blocker(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Blocker())
del sys.argv[1]
"""
RUN_CLI = BLOCKER + "from sketchrec.cli import sketchrec_main\nsys.exit(sketchrec_main(sys.argv[1:]))\n"
SMALL = ["--synthetic-ratings", "3000", "--synthetic-users", "100", "--synthetic-items", "50", "--quiet"]


def _run(blocked: list[str], *args: str, code: str = RUN_CLI, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, ",".join(blocked), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


def test_consume_without_the_kafka_extra_says_so_in_one_line(tmp_path):
    res = _run(["kafka"], "consume", "--bootstrap", "127.0.0.1:1", "--topic", "t", "--group", "g",
               tmp_path=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == "sketchrec consume needs the kafka extra: pip install 'sketchrec[kafka]'"


def test_replay_serve_without_the_serve_extra_says_so_in_one_line(tmp_path):
    res = _run(EXTRAS["serve"], "replay", *SMALL, "--serve", "127.0.0.1:0", tmp_path=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == ("sketchrec replay --serve needs the serve extra: "
                                  "pip install 'sketchrec[serve]'")


def test_a_dp_run_without_the_dp_extra_says_so_in_one_line(tmp_path):
    res = _run(EXTRAS["dp"], "replay", *SMALL, "--dp-epsilon", "1", tmp_path=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == "DP accounting needs the dp extra: pip install 'sketchrec[dp]'"


def test_the_core_replays_and_the_python_api_runs_without_any_extra(tmp_path):
    res = _run(EVERY_EXTRA, "replay", *SMALL, "--json", tmp_path=tmp_path)
    assert res.returncode == 0, res.stderr
    assert '"rmse"' in res.stdout
    api = BLOCKER + """
import sketchrec
m = sketchrec.Mix()
m.learn_many([1, 2, 1], ["a", "a", "b"], [5.0, 4.0, 1.0])
print(m.recommend(2, k=1)[0][0], sorted(set(sys.modules) & set(sys.argv[1:] or %r)))
""" % (EVERY_EXTRA,)
    res = _run(EVERY_EXTRA, code=api, tmp_path=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["a", "[]"]


def test_the_blocker_does_block(tmp_path):
    # the tests above would pass vacuously if the blocked modules still imported
    res = _run(["kafka"], code=BLOCKER + "import kafka\n", tmp_path=tmp_path)
    assert res.returncode == 1 and "No module named 'kafka'" in res.stderr


def test_only_an_extras_library_becomes_the_one_line():
    assert str(from_import_error("x", ModuleNotFoundError("no", name="fastapi.responses"))) == \
        "x needs the serve extra: pip install 'sketchrec[serve]'"
    # a core library missing is a broken install: left to show whole
    assert from_import_error("x", ModuleNotFoundError("no", name="numpy")) is None
    assert isinstance(from_import_error("x", MissingExtra("y", "dp")), MissingExtra)


def test_pyproject_declares_the_light_core_and_the_extras():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert {"kafka", "serve", "dp", "all", "test", "docs"} <= set(extras)
    core = " ".join(project["dependencies"])
    for heavy in ("kafka-python", "fastapi", "uvicorn", "dp-accounting", "pytest", "moto", "playwright"):
        assert heavy not in core, heavy
    assert extras["all"] == ["sketchrec[kafka,serve,dp]"]
    assert any(dep.startswith("sketchrec[all") for dep in extras["test"])
    # every library EXTRAS names for an extra is a dependency of it (by distribution name)
    for extra, libs in (("kafka", ["kafka-python"]), ("serve", ["fastapi", "uvicorn", "orjson",
                                                                 "prometheus-client", "httptools"]),
                        ("dp", ["dp-accounting"])):
        for lib in libs:
            assert any(dep.startswith(lib) for dep in extras[extra]), (extra, lib)


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_every_extra_is_installed_here(extra):
    # the suite runs with `.[test]`: a test environment missing an extra would skip its features
    from sketchrec.extras import installed
    assert installed(extra)


# what the long-running processes import at start: a consumer, a server, a fleet member and a
# serving reader never use river's model, and river's import (its optimisers pull in scipy) is
# paid at each of their starts; local DP's mechanism (a device's noise, a
# server's debiasing map) finds no root, so scipy.optimize stays out too
STARTS = """
import sys
import sketchrec.cli, sketchrec.cli.consume, sketchrec.cli.serve, sketchrec.cli.fleet
import sketchrec.stream.serving.workers.reader
from sketchrec.privacy.ldp import Debias, DeviceRandomiser
Debias(2.0, 1.0, 5.0), DeviceRandomiser(2.0, 1.0, 5.0).perturb([3.0])
heavy = ("river", "scipy.optimize")
print(sorted(m for m in heavy if m in sys.modules))
from types import SimpleNamespace
from sketchrec.cli.serving import accountant_first
from sketchrec.privacy.mode import PrivacyMode
accountant_first(SimpleNamespace(privacy_mode=PrivacyMode.NONE))
print("dp_accounting" in sys.modules)
accountant_first(SimpleNamespace(privacy_mode=PrivacyMode.DP_SGD_RATING))
print("dp_accounting" in sys.modules)
import sketchrec
from sketchrec.privacy.bounded_laplace import BoundedLaplace
sketchrec.RiverBiasedMF(dim=2), BoundedLaplace(epsilon=1.0, lower=1.0, upper=5.0, sensitivity=1.0)
print(sorted(m for m in heavy if m in sys.modules))
"""


def test_the_services_start_without_importing_river_or_a_root_finder(tmp_path):
    res = subprocess.run([sys.executable, "-c", STARTS], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    # and river's model and a calibrated scale are still there, importing them when asked for
    # a served DP model's accountant is imported on the main thread at start, a non-private one's never
    assert res.stdout.split("\n")[:4] == ["[]", "False", "True", "['river', 'scipy.optimize']"]
