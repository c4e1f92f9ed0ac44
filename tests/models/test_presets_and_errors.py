"""Published parameter counts, dtypes and input validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import models
from tests.models.helpers import tiny

# Published counts (HF model cards / t5x); Gemma's HF checkpoints use a
# 256000-row embedding, the official Flax ones 256128 -- both within 1%.
PUBLISHED = {
    "t5_1_1_small": 76_961_152,
    "t5_1_1_base": 247_577_856,
    "t5_1_1_large": 783_150_080,
    "t5_1_1_xl": 2_849_757_184,
    "t5_1_1_xxl": 11_135_332_352,
    "gemma_2b": 2_506_172_416,
    "gemma_7b": 8_537_680_896,
    "gemma2_2b": 2_614_341_888,
    "gemma2_9b": 9_241_705_984,
    "gemma2_27b": 27_227_128_320,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_counts(name):
  n = models.get_model(name).num_params()
  assert abs(n - PUBLISHED[name]) / PUBLISHED[name] < 0.01, n


def test_gemma2_presets_structure():
  g27 = models.PRESETS["gemma2_27b"]
  assert g27.query_pre_attn_scalar == 144.0
  assert g27.attention_types[:2] == ("local", "global")
  assert g27.sliding_window == 4096 and g27.attn_logit_softcap == 50.0
  assert g27.final_logit_softcap == 30.0 and g27.transpose_gating_einsum
  assert models.PRESETS["gemma2_2b"].query_pre_attn_scalar == 256.0
  assert models.PRESETS["gemma_7b"].attention_types == ("global",) * 28


@pytest.mark.parametrize("family", ["t5", "gemma2"])
def test_bfloat16_close_to_float32(family):
  model, params = tiny(family)
  bf = models.model_from_config(
      model.config.__class__(**{**model.config.__dict__, "dtype": "bfloat16"}))
  tokens = np.random.default_rng(0).integers(2, model.vocab_size, (2, 6))
  kw = {}
  if family == "t5":
    kw["inputs"] = tokens
  ref = np.asarray(model.forward(params, tokens, **kw))
  got = bf.forward(params, tokens, **kw)
  assert got.dtype == jnp.float32  # logits always float32
  err = np.abs(np.asarray(got) - ref).max() / np.abs(ref).max()
  assert err < 0.05, err
  enc = bf.encode(params, tokens) if family == "t5" else None
  cache = bf.init_cache(2, 8, enc)
  assert cache.layers[0].k.dtype == jnp.bfloat16


def test_out_of_vocabulary_ids_raise():
  model, params = tiny("gemma")
  cache = model.init_cache(1, 8)
  with pytest.raises(ValueError, match=r"id 64 .* vocabulary \[0, 64\)"):
    model.step(params, np.array([[3, 64]]), cache)
  with pytest.raises(ValueError, match="id -1"):
    model.forward(params, np.array([[-1, 3]]))
  t5, t5p = tiny("t5")
  with pytest.raises(ValueError, match="encoder inputs contain id 99"):
    t5.encode(t5p, np.array([[99, 1]]))


def test_overrunning_the_cache_raises():
  model, params = tiny("gemma")
  cache = model.init_cache(2, 8)
  with pytest.raises(ValueError, match="does not fit a cache of max_length 8"):
    model.step(params, np.ones((2, 9), np.int32), cache)
  _, cache = model.step(params, np.ones((2, 6), np.int32), cache)
  with pytest.raises(ValueError, match="would overrun the cache"):
    model.step(params, np.ones((2, 3), np.int32), cache)


def test_bad_parameter_trees_name_the_path():
  model, params = tiny("gemma")
  flat = models.flatten_params(params)
  missing = dict(flat)
  del missing["layer_1/mlp/linear/kernel"]
  with pytest.raises(ValueError, match="missing .* 'layer_1/mlp/linear/kernel' "
                     r"\(expected shape \(64, 32\)\)"):
    model.check_params(models.unflatten_params(missing))
  extra = dict(flat, **{"layer_0/attn/bias": np.zeros(3)})
  with pytest.raises(ValueError, match="unexpected .* 'layer_0/attn/bias'"):
    model.check_params(models.unflatten_params(extra))
  wrong = dict(flat, **{"final_norm/scale": np.zeros(31)})
  with pytest.raises(ValueError, match=r"'final_norm/scale' has shape \(31,\), "
                     r"expected \(32,\)"):
    model.check_params(models.unflatten_params(wrong))


def test_unknown_preset_and_config_errors():
  with pytest.raises(ValueError, match="unknown model preset 'gemma3'"):
    models.get_model("gemma3")
  with pytest.raises(ValueError, match="num_heads .* multiple of num_kv_heads"):
    models.GemmaConfig(num_heads=4, num_kv_heads=3)
  with pytest.raises(ValueError, match="pass encoded="):
    tiny("t5")[0].init_cache(1, 4)
  with pytest.raises(ValueError, match="unknown dtype"):
    models.get_model("t5_tiny", dtype="float8")
