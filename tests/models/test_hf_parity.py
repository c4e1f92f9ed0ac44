"""Logits parity with HF transformers on tiny random weights (float32)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specdec_jax.checkpoints import hf_gemma, hf_t5  # noqa: E402
from specdec_jax.models.gemma import GemmaModel  # noqa: E402
from specdec_jax.models.t5 import T5Model  # noqa: E402

TOL = 1e-4


def _state_dict(model):
  return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def _hf_t5(**kw):
  torch.manual_seed(0)
  cfg = transformers.T5Config(
      vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2,
      num_decoder_layers=3, num_heads=4, feed_forward_proj="gated-gelu",
      tie_word_embeddings=False, relative_attention_num_buckets=8,
      relative_attention_max_distance=12, dropout_rate=0.0, **kw)
  model = transformers.T5ForConditionalGeneration(cfg).eval()
  # transformers 5 ties lm_head to the embedding at construction; T5 v1.1 has
  # an untied head, so give it its own weights.
  model.lm_head.weight = torch.nn.Parameter(torch.randn(96, 32) * 0.5)
  return model


def test_t5_logits_match_hf():
  hf = _hf_t5()
  cfg = hf_t5.t5_config_from_hf(hf.config.to_dict())
  ours = T5Model(cfg)
  params = hf_t5.t5_params_from_hf(_state_dict(hf), cfg)
  ours.check_params(params)
  rng = np.random.default_rng(0)
  # Sequences longer than max_distance exercise saturated buckets; row 1 is
  # padded to test the encoder mask.
  inputs = rng.integers(2, 96, size=(2, 20))
  inputs[1, 13:] = 0
  dec = rng.integers(2, 96, size=(2, 17))
  dec[:, 0] = 0
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(inputs),
             attention_mask=torch.tensor(inputs != 0),
             decoder_input_ids=torch.tensor(dec)).logits.numpy()
  got = np.asarray(ours.forward(params, dec, inputs=inputs))
  assert np.abs(got - ref).max() <= TOL
  # Cached block decoding gives the same logits.
  enc = ours.encode(params, inputs)
  cache = ours.init_cache(2, 24, enc)
  l1, cache = ours.step(params, dec[:, :9], cache)
  l2, cache = ours.step(params, dec[:, 9:], cache)
  assert np.abs(np.concatenate([l1, l2], 1) - ref).max() <= TOL


def _hf_gemma(version, **kw):
  torch.manual_seed(1)
  common = dict(vocab_size=80, hidden_size=32, intermediate_size=64,
                num_hidden_layers=4, head_dim=8, initializer_range=0.2)
  common.update(kw)
  if version == 1:
    cfg = transformers.GemmaConfig(**common)
    model = transformers.GemmaForCausalLM(cfg)
  else:
    cfg = transformers.Gemma2Config(**common)
    model = transformers.Gemma2ForCausalLM(cfg)
  model.eval()
  # HF initialises the norm scales at zero; randomise them to test (1+scale).
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.normal_(0.0, 0.3)
  return model


@pytest.mark.parametrize("version,heads,kv_heads,extra", [
    (1, 4, 1, {}),  # MQA
    (1, 4, 4, {}),  # MHA (qkv_einsum layout)
    (2, 4, 2, dict(sliding_window=5)),  # GQA + sliding window < prompt
    (2, 4, 2, dict(sliding_window=5, query_pre_attn_scalar=12,
                   attn_logit_softcapping=2.0, final_logit_softcapping=3.0)),
])
def test_gemma_logits_match_hf(version, heads, kv_heads, extra):
  hf = _hf_gemma(version, num_attention_heads=heads,
                 num_key_value_heads=kv_heads, **extra)
  cfg = hf_gemma.gemma_config_from_hf(hf.config.to_dict())
  ours = GemmaModel(cfg)
  params = hf_gemma.gemma_params_from_hf(_state_dict(hf), cfg)
  ours.check_params(params)
  tokens = np.random.default_rng(2).integers(0, 80, size=(2, 14))
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(tokens)).logits.numpy()
  got = np.asarray(ours.forward(params, tokens))
  assert np.abs(got - ref).max() <= TOL
  cache = ours.init_cache(2, 20)
  l1, cache = ours.step(params, tokens[:, :6], cache)
  l2, cache = ours.step(params, tokens[:, 6:7], cache)
  l3, cache = ours.step(params, tokens[:, 7:], cache)
  assert np.abs(np.concatenate([l1, l2, l3], 1) - ref).max() <= TOL


def test_export_roundtrip_is_identity():
  hf = _hf_gemma(2, num_attention_heads=4, num_key_value_heads=2)
  cfg = hf_gemma.gemma_config_from_hf(hf.config.to_dict())
  sd = _state_dict(hf)
  back = hf_gemma.gemma_params_to_hf(
      hf_gemma.gemma_params_from_hf(sd, cfg), cfg)
  for name, w in sd.items():
    np.testing.assert_array_equal(back[name], w, err_msg=name)
  t5 = _hf_t5()
  tcfg = hf_t5.t5_config_from_hf(t5.config.to_dict())
  tsd = _state_dict(t5)
  tback = hf_t5.t5_params_to_hf(hf_t5.t5_params_from_hf(tsd, tcfg),
                                     tcfg)
  for name, w in tsd.items():
    np.testing.assert_array_equal(tback[name], w, err_msg=name)
