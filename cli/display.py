"""What replay shows a person: a live progress bar on stderr and the summary of the result."""

from __future__ import annotations

import json
import math
import sys

import numpy as np


def say(line: str) -> None:
    """One line of news for the person at the terminal (stderr: stdout may carry the JSON)."""
    print(line, file=sys.stderr, flush=True)


def json_safe(value):
    """``value`` with numpy scalars as Python numbers and every non-finite float as None.

    >>> json_safe({"rmse": float("nan"), "n": np.int64(3), "xs": (1.5, np.inf)})
    {'rmse': None, 'n': 3, 'xs': [1.5, None]}
    """
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def to_json(result: dict) -> str:
    """The result as one line of strict JSON (NaN and infinities become null)."""
    return json.dumps(json_safe(result), allow_nan=False, default=float)


class ProgressBar:
    """A rich progress bar on stderr with live RMSE and ratings/s (or nothing when quiet)."""

    def __init__(self, total: int, quiet: bool, label: str):
        self.progress = None
        if not quiet:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("RMSE {task.fields[rmse]:.4f}"),
                                     TextColumn("{task.fields[rate]:,.0f} ratings/s"), TimeElapsedColumn(),
                                     console=Console(stderr=True), transient=False)
            self.task = self.progress.add_task(label, total=total, rmse=float("nan"), rate=0.0)

    def __enter__(self):
        if self.progress:
            self.progress.start()
        return self

    def __exit__(self, *exc):
        if self.progress:
            self.progress.stop()

    def __call__(self, done: int, rmse: float, rate: float) -> None:
        if self.progress:
            self.progress.update(self.task, completed=done, rmse=rmse, rate=rate)


def summary(result: dict) -> str:
    """The human report of a replay result (the JSON line carries every number)."""
    p = result["params"]
    set_aside = result["ratings"] - result["learned"]
    lines = [
        f"sketchrec replay — {result['source']} ({result['protocol']}, model={result['model']})"
        + ("  INTERRUPTED: partial results" if result.get("interrupted") else ""),
        f"  ratings learned   {result['learned']:,}"
        + (f" of {result['ratings']:,} (the model set {set_aside:,} aside: loss clipping or divergence)"
           if set_aside else "")
        + (f"  (train {result['train']:,} / test {result['test']:,}, {result['epochs']} epochs)"
           if result["protocol"] == "holdout" else f"  (order: {result['order']})"),
        f"  RMSE / MAE        {result['rmse']:.4f} / "
        + (f"{result['mae']:.4f}" if result.get("mae") is not None else "n/a")
        + (f"  (private baseline {result['baseline_rmse']:.4f})" if "baseline_rmse" in result else ""),
        f"  time              {result['seconds']:.2f} s  ({result['throughput_per_s']:,.0f} ratings/s)",
        "  model memory      " + (f"{result['model_bytes'] / 1e6:.2f} MB" if result["model_bytes"] is not None
                                  else "n/a") + f"  (process RSS {result['rss_mb']:.0f} MB)",
        (f"  parameters        d={p['dim']} lr={p['lr']} reg={p['reg']}"
         + (f" k={p['depth']} w={p['width']} gamma={p['space_gain']}" if "depth" in p else "")
         if "dim" in p else "  parameters        " + " ".join(f"{k}={v}" for k, v in p.items())),
        *([f"  heavy filter      {p['heavy_used']:,} of {p['heavy_slots']:,} slots "
           f"({p['heavy_fraction']:g} of the memory); other ids keep {p['light_dim']} of "
           f"{p['dim']} components in the sketch"] if p.get("heavy_slots") else []),
    ]
    lines += _evaluation_lines(result)
    priv = result["privacy"]
    if priv.get("epsilon") is not None:
        lines.append(f"  guarantee         epsilon {priv['epsilon']:.4g}"
                     + (f", delta {priv['delta']:g}" if priv.get("delta") else "")
                     + f" per {priv['privacy_unit']} — "
                     + ("proven upper bound" if priv["proven_bound"] else "heuristic, not a proven bound"))
    lines.append(f"  privacy           mode {priv['mode']}; KLD "
                 + (f"{result['kld']:.4f}" if result.get("kld") is not None else "n/a")
                 + " (eq. 4.15, heuristic)"
                 + (f"; canary audit epsilon >= {priv['audit_epsilon_lower_bound']:.2f} (95%)"
                    if "audit" in priv else ""))
    if priv.get("serving"):  # a private mode with a fallback: which model answers
        lines.append(f"  answers from      {priv['serving']}"
                     + (f" (DP-SGD alone {result['dp_sgd_rmse']:.4f})" if "dp_sgd_rmse" in result else ""))
    if (result.get("versus_private_mean") or {}).get("worse"):
        lines.append(f"  WORSE THAN MEAN   {result['versus_private_mean']['note']}")
    if result.get("rating_range"):
        lo, hi = result["rating_range"]
        lines.append(f"  rating range      [{lo:g}, {hi:g}] ({result['rating_range_source']})")
    if result["skipped_total"]:
        lines.append(f"  lines set aside   {result['skipped_total']:,}: "
                     + ", ".join(f"{r}: {c:,}" for r, c in result["skipped"].items()))
        lines += [f"    line {e['line']}: {e['reason']}: {e['text']!r}" for e in result["skipped_examples"]]
    return "\n".join(lines)


def _evaluation_lines(result: dict) -> list[str]:
    """The curve's first, lowest and last windows, top-N beside popularity, the synthetic
    stream's noise floor."""
    lines = []
    curve = result.get("curve")
    if curve and curve["rmse"]:
        rmse = curve["rmse"]
        low = int(np.argmin(rmse))
        lines.append(f"  windowed RMSE     first {rmse[0]:.4f}, lowest {rmse[low]:.4f} (to rating "
                     f"{curve['end'][low]:,}), last {rmse[-1]:.4f}  ({len(rmse)} windows of "
                     f"{curve['window']:,})")
    top = result.get("topn")
    if top:
        pop, served = top["popularity"], top.get("served") or top
        lines.append(f"  top-10            served recall {served['recall_at_10']:.4f}, NDCG "
                     f"{served['ndcg_at_10']:.4f}  (model {top['recall_at_10']:.4f}, "
                     f"{top['ndcg_at_10']:.4f}; popularity {pop['recall_at_10']:.4f}, "
                     f"{pop['ndcg_at_10']:.4f}) on "
                     f"{top['events']:,} ratings >= {top['threshold']:g}, {top['seconds']:.2f} s")
    synth = result.get("synthetic")
    if synth:
        lines.append(f"  ground truth      noise floor RMSE {synth['noise_floor']:.4f}"
                     + (f"; tastes redrawn at rating {synth['change_at']:,}" if synth["change_at"] else ""))
    return lines
