"""HF transformers <-> our T5 (v1.1): config and one rule per tensor.

The family's HF converter (``models/families.py``: ``converters['hf']``);
the shared rule machinery is ``hf_convert.py``.
"""

from __future__ import annotations

from typing import Any, Mapping

from specdec_jax.checkpoints.hf_convert import (Rule, StateDict, contiguous,
                                                contiguous_t,
                                                params_from_state_dict, same,
                                                state_dict_from_params,
                                                transposed)
from specdec_jax.models.t5 import T5Config

# HF tensors that are tied copies of another one: {copy: original}. HF's
# save_pretrained omits them and from_pretrained re-ties them.
T5_HF_TIED = {"encoder.embed_tokens.weight": "shared.weight",
              "decoder.embed_tokens.weight": "shared.weight"}


def t5_config_from_hf(hf: Mapping[str, Any], **overrides) -> T5Config:
  """T5 v1.1 config from an HF ``config.json`` dict (or a T5Config.to_dict())."""
  proj = hf.get("feed_forward_proj", "gated-gelu")
  if proj != "gated-gelu":
    raise ValueError(f"only T5 v1.1 (feed_forward_proj='gated-gelu') is "
                     f"supported, the checkpoint has {proj!r}")
  kw = dict(
      vocab_size=hf["vocab_size"], d_model=hf["d_model"],
      num_heads=hf["num_heads"], head_dim=hf["d_kv"],
      num_encoder_layers=hf["num_layers"],
      num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
      mlp_dim=hf["d_ff"],
      relpos_buckets=hf.get("relative_attention_num_buckets", 32),
      relpos_max_distance=hf.get("relative_attention_max_distance", 128),
      layer_norm_eps=hf.get("layer_norm_epsilon", 1e-6),
      pad_id=hf.get("pad_token_id", 0) or 0,
      eos_id=hf.get("eos_token_id", 1) if isinstance(
          hf.get("eos_token_id", 1), int) else 1,
      decoder_start_id=hf.get("decoder_start_token_id", 0) or 0)
  kw.update(overrides)
  return T5Config(**kw)


def t5_config_to_hf(cfg: T5Config) -> dict[str, Any]:
  """HF ``T5Config`` keyword arguments for a T5 v1.1 model (untied head)."""
  return dict(
      vocab_size=cfg.vocab_size, d_model=cfg.d_model, d_kv=cfg.head_dim,
      d_ff=cfg.mlp_dim, num_layers=cfg.num_encoder_layers,
      num_decoder_layers=cfg.num_decoder_layers, num_heads=cfg.num_heads,
      relative_attention_num_buckets=cfg.relpos_buckets,
      relative_attention_max_distance=cfg.relpos_max_distance,
      layer_norm_epsilon=cfg.layer_norm_eps, feed_forward_proj="gated-gelu",
      tie_word_embeddings=False, pad_token_id=cfg.pad_id,
      eos_token_id=cfg.eos_id, decoder_start_token_id=cfg.decoder_start_id,
      dropout_rate=0.0)


# ----------------------------------------------------------------------------
# T5 weights
# ----------------------------------------------------------------------------

_T5_ATTN = {"query": "q", "key": "k", "value": "v", "out": "o"}


def _t5_pairs(cfg: T5Config):
  """Yields (our flat path, HF name, transpose?) for every T5 tensor."""
  yield "token_embedder/embedding", "shared.weight", False
  yield "decoder/logits_dense/kernel", "lm_head.weight", True
  for stack, n_layers in (("encoder", cfg.num_encoder_layers),
                          ("decoder", cfg.num_decoder_layers)):
    yield (f"{stack}/relpos_bias/rel_embedding",
           f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias"
           ".weight", True)
    norm = "encoder_norm" if stack == "encoder" else "decoder_norm"
    yield f"{stack}/{norm}/scale", f"{stack}.final_layer_norm.weight", False
    for i in range(n_layers):
      ours, hf = f"{stack}/layers_{i}", f"{stack}.block.{i}.layer"
      if stack == "encoder":
        blocks = [("attention", "pre_attention_layer_norm", "SelfAttention",
                   0)]
        mlp_idx = 1
      else:
        blocks = [("self_attention", "pre_self_attention_layer_norm",
                   "SelfAttention", 0),
                  ("encoder_decoder_attention",
                   "pre_cross_attention_layer_norm", "EncDecAttention", 1)]
        mlp_idx = 2
      for att, norm_name, hf_att, idx in blocks:
        yield f"{ours}/{norm_name}/scale", f"{hf}.{idx}.layer_norm.weight", False
        for k, h in _T5_ATTN.items():
          yield (f"{ours}/{att}/{k}/kernel", f"{hf}.{idx}.{hf_att}.{h}.weight",
                 True)
      yield (f"{ours}/pre_mlp_layer_norm/scale",
             f"{hf}.{mlp_idx}.layer_norm.weight", False)
      for w in ("wi_0", "wi_1", "wo"):
        yield (f"{ours}/mlp/{w}/kernel",
               f"{hf}.{mlp_idx}.DenseReluDense.{w}.weight", True)


def t5_rules_from_hf(cfg: T5Config) -> list[Rule]:
  """One :data:`Rule` per T5 leaf: (our path, (HF name,), HF tensor -> leaf)."""
  return [(ours, (hf,), transposed if transpose else same)
          for ours, hf, transpose in _t5_pairs(cfg)]


def t5_rules_to_hf(cfg: T5Config) -> list[Rule]:
  """One :data:`Rule` per HF T5 tensor: (HF name, (our path,), leaf -> tensor).

  Tied copies (:data:`T5_HF_TIED`) are not listed.
  """
  return [(hf, (ours,), contiguous_t if transpose else contiguous)
          for ours, hf, transpose in _t5_pairs(cfg)]


def t5_params_from_hf(sd: Mapping[str, Any], cfg: T5Config) -> dict:
  """HF T5ForConditionalGeneration state dict -> our nested params."""
  return params_from_state_dict(t5_rules_from_hf(cfg), sd)


def t5_params_to_hf(params: Mapping[str, Any], cfg: T5Config) -> StateDict:
  """Our T5 params -> HF T5ForConditionalGeneration state dict (untied head)."""
  return state_dict_from_params(t5_rules_to_hf(cfg), T5_HF_TIED, params)


# ----------------------------------------------------------------------------
# The converter interface ``hf.py`` calls (same names in every family's
# converter; see ``hf_convert.py``)
# ----------------------------------------------------------------------------

TIED = T5_HF_TIED
config_from_hf = t5_config_from_hf
rules_from_hf = t5_rules_from_hf
rules_to_hf = t5_rules_to_hf


def hf_config(cfg: T5Config) -> dict[str, Any]:
  """The config.json dict of a T5 model for transformers."""
  return {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
          "is_encoder_decoder": True, **t5_config_to_hf(cfg)}


def check_files(names, path: str) -> None:
  """Raises for a checkpoint (tensor ``names``) this converter cannot read."""
  if "lm_head.weight" not in names:
    raise ValueError(f"{path!r} has no 'lm_head.weight': T5 with the output "
                     f"projection tied to the embedding (the original T5, not "
                     f"v1.1) is not supported")
