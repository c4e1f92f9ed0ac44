"""Gemma 3: logits parity with HF transformers on tiny random weights (float32)
and the published sizes of the presets."""

import numpy as np
import pytest

from specdec_jax import models

# Text-decoder parameter counts of google/gemma-3-* (4B+ without the vision
# tower, whose ~0.4B the published "4B / 12B / 27B" include).
PUBLISHED = {
    "gemma3_270m": 268_098_176,
    "gemma3_1b": 999_885_952,
    "gemma3_4b": 3_880_099_328,
    "gemma3_12b": 11_765_788_416,
    "gemma3_27b": 27_009_002_240,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_gemma3_preset_sizes(name):
  n = models.get_model(name).num_params()
  assert abs(n - PUBLISHED[name]) / PUBLISHED[name] < 0.01, n


def test_gemma3_preset_structure():
  g = models.PRESETS["gemma3_270m"]
  assert g.attention_types[:6] == ("local",) * 5 + ("global",)
  assert g.sliding_window == 512 and g.vocab_size == 262_144
  assert g.attn_logit_softcap is None and g.final_logit_softcap is None
  assert g.rope(0) == (10_000.0, 1.0) and g.rope(5) == (1e6, 1.0)
  g27 = models.PRESETS["gemma3_27b"]
  assert g27.query_pre_attn_scalar == 168.0 and g27.sliding_window == 1024
  assert g27.rope(5) == (1e6, 8.0) and g27.rope(4) == (10_000.0, 1.0)


torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specdec_jax.checkpoints import hf_gemma  # noqa: E402

TOL = 1e-4


def hf_gemma3(**kw):
  """A tiny random HF Gemma3ForCausalLM (norm scales randomised)."""
  torch.manual_seed(3)
  cfg = dict(vocab_size=80, hidden_size=32, intermediate_size=64,
             num_hidden_layers=6, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, initializer_range=0.2,
             sliding_window=5, query_pre_attn_scalar=12,
             rope_parameters={
                 "full_attention": {"rope_type": "linear", "factor": 4.0,
                                    "rope_theta": 1e6},
                 "sliding_attention": {"rope_type": "default",
                                       "rope_theta": 1e4}})
  cfg.update(kw)
  model = transformers.Gemma3ForCausalLM(
      transformers.Gemma3TextConfig(**cfg)).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.normal_(0.0, 0.3)
  return model


def test_gemma3_logits_match_hf():
  hf = hf_gemma3()
  cfg = hf_gemma.gemma_config_from_hf(hf.config.to_dict())
  assert cfg.attention_types == ("local",) * 5 + ("global",)
  assert cfg.rope_scale_factor == 4.0 and cfg.local_rope_base == 1e4
  ours = models.GemmaModel(cfg)
  sd = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
  params = hf_gemma.gemma_params_from_hf(sd, cfg)
  ours.check_params(params)
  # 14 tokens > sliding window 5: local and global layers see different keys.
  tokens = np.random.default_rng(4).integers(0, 80, size=(2, 14))
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(tokens)).logits.numpy()
  got = np.asarray(ours.forward(params, tokens))
  assert np.abs(got - ref).max() <= TOL
  cache = ours.init_cache(2, 20)
  l1, cache = ours.step(params, tokens[:, :6], cache)
  l2, cache = ours.step(params, tokens[:, 6:7], cache)
  l3, cache = ours.step(params, tokens[:, 7:], cache)
  assert np.abs(np.concatenate([l1, l2, l3], 1) - ref).max() <= TOL
  # Export gives HF's tensors back, and its config rebuilds the same model.
  back = hf_gemma.gemma_params_to_hf(params, cfg)
  for name, w in sd.items():
    np.testing.assert_array_equal(back[name], w, err_msg=name)
  model_type, kw = hf_gemma.gemma_config_to_hf(cfg)
  assert model_type == "gemma3_text"
  again = hf_gemma.gemma_config_from_hf(
      transformers.Gemma3TextConfig(**kw).to_dict())
  assert again == cfg


def test_gemma3_hf_safetensors_round_trip(tmp_path):
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  model = models.get_model("gemma3_tiny")
  params = model.init_params(jax.random.PRNGKey(0))
  checkpoints.save(str(tmp_path / "hf"), model, params, format="hf")
  back_model, back = checkpoints.load(str(tmp_path / "hf"), dtype="float32")
  assert back_model.config == model.config
  for name, w in models.flatten_params(params).items():
    np.testing.assert_array_equal(np.asarray(models.flatten_params(back)[name]),
                                  np.asarray(w), err_msg=name)
  # transformers reads the export as a Gemma3ForCausalLM with the same logits.
  hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
  tokens = np.arange(2, 14)[None] % 64
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(tokens)).logits.numpy()
  assert type(hf).__name__ == "Gemma3ForCausalLM"
  assert np.abs(np.asarray(model.forward(params, tokens)) - ref).max() <= TOL
