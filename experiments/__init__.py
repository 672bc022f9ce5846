"""Registry of `sketchrec experiment NAME` experiments.

Each experiment is a module in this package with ``NAME`` (str), ``DESCRIPTION`` (one line) and
``run(data: pathlib.Path | None, out: pathlib.Path, quick: bool) -> dict`` that writes its PNG
figures, a markdown report and a JSON file of every number into ``out`` and returns that dict.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# module names, in the order `--list` shows them
MODULES: list[str] = ["b1_table", "b1_heatmap", "b1_dynamic", "b1_regularization", "b2_privacy", "dp_sgd", "blip_attacks", "qolsh", "retrieval", "huber_synthetic", "blp_mog", "dp_nmf", "huber_movielens", "dp_utility", "tuning_free"]


def registry() -> dict[str, ModuleType]:
    mods = {}
    for name in MODULES:
        mod = importlib.import_module(f"sketchrec.experiments.{name}")
        mods[mod.NAME] = mod
    return mods
