"""T5's initialisation folds the missing logit scaling into the query kernel."""

import jax
import numpy as np

from specdec_jax import models


def _kernels(params, name):
  out = []
  for k, v in params.items():
    if k == name and isinstance(v, dict) and "kernel" in v:
      out.append(np.asarray(v["kernel"]))
    elif isinstance(v, dict):
      out += _kernels(v, name)
  return out


def test_t5_init_folds_the_logit_scaling_into_the_query_kernel():
  """T5 has no 1/sqrt(head_dim) on its attention logits; t5x and HF
  initialise the query kernel with variance 1 / (d_model * head_dim) and the
  keys with 1 / d_model, so a fresh model's logits q.k have unit scale. An
  init that treats the query like the keys starts every attention block
  (cross-attention too) at logits ~sqrt(head_dim): a saturated softmax."""
  model = models.get_model("t5_tiny", head_dim=64, d_model=128)
  cfg = model.config
  params = model.init_params(jax.random.PRNGKey(0))
  queries, keys = _kernels(params, "query"), _kernels(params, "key")
  # encoder self, decoder self and decoder cross attention per layer
  assert len(queries) == len(keys) == (cfg.num_encoder_layers +
                                       2 * cfg.num_decoder_layers)
  q = np.concatenate([x.ravel() for x in queries])
  k = np.concatenate([x.ravel() for x in keys])
  assert abs(q.std() * np.sqrt(cfg.d_model * cfg.head_dim) - 1) < 0.05
  assert abs(k.std() * np.sqrt(cfg.d_model) - 1) < 0.05
  # Logits of unit-variance inputs have unit scale (not sqrt(head_dim) = 8).
  x = np.random.default_rng(0).normal(size=(512, cfg.d_model))
  d = cfg.head_dim
  logits = np.einsum("nd,nd->n", (x @ queries[0])[:, :d],
                     (x @ keys[0])[:, :d])  # the first head
  assert 0.8 < logits.std() < 1.25
