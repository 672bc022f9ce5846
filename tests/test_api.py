"""The Python API a user finishes with: every model kind from ``sketchrec``, ``recommend``,
``similar``, ``save``/``load``."""

from __future__ import annotations

import numpy as np
import pytest

import sketchrec
from sketchrec.data import SyntheticStream
from sketchrec.models.capabilities import DEFAULT_KIND, KINDS


def _taste_stream():
    """Two groups of users and items: users of group g rate group g's items 5, the others' 1."""
    rng = np.random.default_rng(0)
    users = rng.integers(0, 200, 20_000)
    items = rng.integers(0, 40, 20_000)
    ratings = np.where(users % 2 == items % 2, 5.0, 1.0)
    return users, [f"i{n}" for n in items], ratings


def test_every_model_kind_is_importable_from_the_top_level():
    for kind in KINDS.values():
        public = [name for name in sketchrec.__all__ if name != "__version__" and getattr(sketchrec, name).__name__ == kind.model_class]
        assert public, f"{kind.name}'s class {kind.model_class} is not exported by sketchrec"
    assert sketchrec.Mix.__name__ == KINDS[DEFAULT_KIND].model_class


@pytest.mark.parametrize("name", ["Mix", "SketchMF", "DenseMF"])
def test_recommend_ranks_the_items_a_user_likes_first(name):
    model = getattr(sketchrec, name)(seed=0) if name != "SketchMF" else sketchrec.SketchMF(capacity=500, seed=0)
    users, items, ratings = _taste_stream()
    model.learn_many(users, items, ratings)
    assert sorted(model.known_items()) == sorted(set(items))
    for user in (0, 1):
        top = model.recommend(user, k=10)
        assert len(top) == 10 and [s for _, s in top] == sorted((s for _, s in top), reverse=True)
        assert all(int(item[1:]) % 2 == user % 2 for item, _ in top), (user, top)
    # exclude and items narrow the candidates
    assert "i0" not in [i for i, _ in model.recommend(0, k=40, exclude=["i0"])]
    assert [i for i, _ in model.recommend(0, k=5, items=["i1", "i2"])] == ["i2", "i1"]


@pytest.mark.parametrize("name", ["Mix", "SketchMF", "DenseMF"])
def test_similar_items_share_a_group(name):
    model = getattr(sketchrec, name)(seed=0)
    users, items, ratings = _taste_stream()
    model.learn_many(users, items, ratings)
    top = model.similar("i4", k=5)
    assert len(top) == 5 and "i4" not in [i for i, _ in top]
    assert all(-1.0 <= s <= 1.0 for _, s in top)
    assert all(int(item[1:]) % 2 == 0 for item, _ in top), top
    # the far end of the list is the other group
    assert all(int(item[1:]) % 2 == 1 for item, _ in model.similar("i4", k=39)[-5:])


def test_similar_on_a_bias_model_is_refused_in_one_line():
    model = sketchrec.BiasBaseline()
    model.learn_many([1, 2], ["a", "b"], [5.0, 1.0])
    with pytest.raises(ValueError, match="no latent vector.*use a factor model"):
        model.similar("a")


@pytest.mark.parametrize("name", ["Mix", "SketchMF", "DenseMF", "BiasBaseline"])
def test_save_then_load_gives_the_same_model(tmp_path, name):
    model = getattr(sketchrec, name)(seed=0)
    stream = SyntheticStream(n_ratings=5_000, n_users=100, n_items=50, seed=1).all()
    model.learn_many(stream.users, stream.items, stream.ratings)
    path = model.save(tmp_path / "model.skr")
    back = type(model).load(path)
    assert type(back) is type(model) and back.to_bytes() == model.to_bytes()
    assert back.known_items() == model.known_items()
    assert back.recommend(3, k=5) == model.recommend(3, k=5)
    # a base class loads any of its subclasses; another class is refused
    assert type(sketchrec.models.base.FactorizationModel.load(path)) is type(model)
    other = sketchrec.DenseMF if name != "DenseMF" else sketchrec.SketchMF
    with pytest.raises(ValueError, match=f"not a {other.__name__}"):
        other.load(path)


def test_a_private_model_keeps_no_item_record_and_its_key_survives_save(tmp_path):
    from sketchrec.models.private.dp_sgd import DPConfig
    model = sketchrec.SketchMF(dim=8, capacity=200, seed=0,
                               dp=DPConfig(noise_multiplier=1.0, batch_size=3, debug_noise_seed=0))
    model.learn_many([1, 2, 3], ["a", "b", "c"], [5.0, 3.0, 1.0])
    assert model.known_items() == []
    with pytest.raises(ValueError, match="pass items="):
        model.recommend(1)
    assert len(model.recommend(1, k=2, items=["a", "b", "c"])) == 2
    back = sketchrec.SketchMF.load(model.save(tmp_path / "dp.skr"))
    assert back.id_keys.keyed and back.predict_one(1, "a") == model.predict_one(1, "a")


def test_help_of_every_public_class_shows_parameters_and_examples():
    import pydoc
    for name in sketchrec.__all__:
        if name == "__version__":
            continue
        text = pydoc.render_doc(getattr(sketchrec, name), renderer=pydoc.plaintext)
        assert "Parameters" in text and "Examples" in text and ">>>" in text, name
