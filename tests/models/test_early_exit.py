"""models.early_exit: the first k decoder layers on the base model's params."""

import dataclasses

import jax
import numpy as np
import pytest

from specdec_jax import models
from tests.models.helpers import jitted

TOL = 1e-5


def _base(family):
  """Tiny 4-decoder-layer models (Gemma 2 alternates local and global)."""
  if family == "t5":
    return models.T5Model(dataclasses.replace(
        models.PRESETS["t5_tiny"], num_decoder_layers=4))
  if family == "gemma3":  # 6 layers: 5 local + 1 global
    return models.get_model("gemma3_tiny")
  name = "gemma_tiny" if family == "gemma" else "gemma2_tiny"
  cfg = models.PRESETS[name]
  return models.GemmaModel(dataclasses.replace(
      cfg, num_layers=4, attention_types=cfg.attention_types * 2))


def _truncated(model, params, k):
  """The hand-built equivalent: a k-layer config and its params subtree."""
  cfg = model.config
  if model.is_encoder_decoder:
    small = models.T5Model(dataclasses.replace(cfg, num_decoder_layers=k))
    dec = {n: v for n, v in params["decoder"].items()
           if not n.startswith("layers_") or int(n[7:]) < k}
    return small, {**params, "decoder": dec}
  small = models.GemmaModel(dataclasses.replace(
      cfg, num_layers=k, attention_types=cfg.attention_types[:k]))
  return small, {n: v for n, v in params.items()
                 if not n.startswith("layer_") or int(n[6:]) < k}


@pytest.mark.parametrize("family", ["t5", "gemma", "gemma2", "gemma3"])
@pytest.mark.parametrize("k", [1, 3])
def test_early_exit_equals_a_truncated_model(family, k):
  base = _base(family)
  params = base.init_params(jax.random.PRNGKey(2))
  ee = models.early_exit(base, k)
  small, small_params = _truncated(base, params, k)
  small.check_params(small_params)
  rng = np.random.default_rng(k)
  toks = rng.integers(2, base.vocab_size, (2, 9))
  kw = {}
  if base.is_encoder_decoder:
    kw["inputs"] = rng.integers(2, base.vocab_size, (2, 5))
  want = np.asarray(small.forward(small_params, toks, **kw))
  got = np.asarray(ee.forward(params, toks, **kw))
  np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
  assert np.abs(got - np.asarray(base.forward(params, toks, **kw))).max() > 1e-3
  # Cached stepping (ragged rows, a rollback) equals its own forward.
  enc = ee.encode(params, kw["inputs"]) if kw else None
  cache = ee.init_cache(2, 16, enc)
  assert len(cache.layers) == k
  step = jitted(ee)[0]
  l1, cache = step(params, toks[:, :5], cache)
  cache = cache.with_lengths(np.array([5, 3]))
  l2, cache = step(params, toks[:, 5:], cache)
  np.testing.assert_allclose(l1, want[:, :5], atol=TOL, rtol=0)
  np.testing.assert_allclose(l2[0], want[0, 5:], atol=TOL, rtol=0)
  ref1 = np.asarray(ee.forward(
      params, np.concatenate([toks[1:, :3], toks[1:, 5:]], 1),
      **({"inputs": kw["inputs"][1:]} if kw else {})))
  np.testing.assert_allclose(l2[1], ref1[0, 3:], atol=TOL, rtol=0)


def test_early_exit_model_reads_the_full_tree_and_is_a_static_arg():
  base = _base("gemma2")
  ee = models.early_exit(base, 2)
  assert ee == models.early_exit(base, 2) and hash(ee) != hash(base)
  assert ee != base and ee.base() == base and ee.depth == 2
  assert (ee.vocab_size, ee.is_encoder_decoder, ee.eos_id) == (
      base.vocab_size, base.is_encoder_decoder, base.eos_id)
  params = base.init_params(jax.random.PRNGKey(0))
  ee.check_params(params)
  assert jax.tree.map(lambda x: x.shape, ee.param_shapes()) == jax.tree.map(
      lambda x: x.shape, base.param_shapes())
  assert ee.param_axes() == base.param_axes()
  with pytest.raises(ValueError, match="cache holds 4 layers, this model "
                     "runs 2"):
    ee.step(params, np.ones((1, 1), np.int32), base.init_cache(1, 4))
  with pytest.raises(dataclasses.FrozenInstanceError):
    ee.exit_layer = 3  # type: ignore[misc]


def test_t5_early_exit_keeps_the_encoder_and_accepts_the_base_encoding():
  base = _base("t5")
  params = base.init_params(jax.random.PRNGKey(0))
  ee = models.early_exit(base, 2)
  inputs = np.array([[5, 6, 7, 0]])
  enc = ee.encode(params, inputs)
  assert len(enc.cross) == 2
  full = base.encode(params, inputs)
  cache = ee.init_cache(1, 8, full)  # the verifier's encoding, reused
  assert len(cache.cross) == 2
  np.testing.assert_array_equal(cache.cross[1].k, enc.cross[1].k)


def test_bad_exit_layers_raise():
  base = _base("gemma")
  with pytest.raises(ValueError, match="early exit at layer 9 but the model "
                     "has 4 decoder layers"):
    models.early_exit(base, 9)
  with pytest.raises(ValueError, match="early exit at layer 0"):
    models.early_exit(base, 0)
  with pytest.raises(ValueError, match="must be an int"):
    models.early_exit(base, 1.5)
  with pytest.raises(ValueError, match="needs a T5Model or GemmaModel"):
    models.early_exit(object(), 1)
