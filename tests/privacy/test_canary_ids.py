"""is_canary over a whole column at once gives the per-id answer, for every kind of id column."""

import numpy as np
import pytest

from sketchrec.privacy.audit import CANARY_PREFIX, is_canary, real_rows


def per_id(ids: np.ndarray) -> list[bool]:
    return [isinstance(x, str) and x.startswith(CANARY_PREFIX) for x in ids.tolist()]


def text_ids(seed: int, n: int = 5000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    pool = [f"{CANARY_PREFIX}u{i}" for i in range(20)] + [f"user-{i}" for i in range(200)]
    pool += [CANARY_PREFIX[:-1], f"x{CANARY_PREFIX}", "", "é" + CANARY_PREFIX, CANARY_PREFIX]
    return np.array(pool, dtype=object)[rng.integers(0, len(pool), n)]


@pytest.mark.parametrize("seed", range(3))
def test_text_column_matches_per_id(seed):
    ids = text_ids(seed)
    got = is_canary(ids)
    assert got.dtype == bool and got.tolist() == per_id(ids)
    assert 0 < got.sum() < len(ids)
    assert real_rows(ids).tolist() == [not x for x in per_id(ids)]
    assert is_canary(ids.astype(str)).tolist() == per_id(ids)   # a numpy unicode column too


@pytest.mark.parametrize("odd", [7, None, b"__canary__u1", "\ud800", 3.5])
def test_mixed_columns_match_per_id(odd):
    """An int, None, bytes, a lone surrogate or a float among text ids: the same answers
    (bytes are never canaries: canary ids are text)."""
    ids = text_ids(9, 300)
    ids[::17] = odd
    assert is_canary(ids).tolist() == per_id(ids)


def test_empty_and_all_none():
    assert is_canary(np.array([], dtype=object)).tolist() == []
    assert is_canary(np.array([None, None], dtype=object)).tolist() == [False, False]
