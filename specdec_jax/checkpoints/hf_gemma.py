"""HF transformers <-> our Gemma 1 / 2 / 3: config and one rule per tensor.

The family's HF converter (``models/families.py``: ``converters['hf']``);
the shared rule machinery is ``hf_convert.py``.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import numpy as np

from specdec_jax.checkpoints.hf_convert import (Rule, StateDict, contiguous_t,
                                                params_from_state_dict, same,
                                                state_dict_from_params)
from specdec_jax.models.gemma import GLOBAL, LOCAL, GemmaConfig

# HF tensors that are tied copies of another one: {copy: original}. HF's
# save_pretrained omits them and from_pretrained re-ties them.
GEMMA_HF_TIED = {"lm_head.weight": "model.embed_tokens.weight"}


# ----------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------


def gemma_config_from_hf(hf: Mapping[str, Any], **overrides) -> GemmaConfig:
  """Gemma 1 / 2 / 3 config from an HF ``config.json`` dict.

  A Gemma 3 multimodal config ('gemma3') is read through its text_config.
  """
  model_type = hf.get("model_type", "gemma")
  if model_type == "gemma3":
    hf = {"model_type": "gemma3_text", **hf.get("text_config", {})}
    model_type = "gemma3_text"
  if model_type not in ("gemma", "gemma2", "gemma3_text"):
    raise ValueError(f"unsupported model_type {model_type!r}; expected "
                     f"'gemma', 'gemma2' or 'gemma3_text'")
  n_layers = hf["num_hidden_layers"]
  kw = dict(
      vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
      num_layers=n_layers, num_heads=hf["num_attention_heads"],
      num_kv_heads=hf.get("num_key_value_heads", hf["num_attention_heads"]),
      head_dim=hf.get("head_dim", 256), mlp_dim=hf["intermediate_size"],
      norm_eps=hf.get("rms_norm_eps", 1e-6),
      rope_base=float((hf.get("rope_parameters") or {}).get(
          "rope_theta", hf.get("rope_theta", 10000.0))),
      pad_id=hf.get("pad_token_id", 0) or 0,
      eos_id=hf.get("eos_token_id", 1) if isinstance(
          hf.get("eos_token_id", 1), int) else 1,
      bos_id=hf.get("bos_token_id", 2) or 2)
  if model_type == "gemma2":
    types = hf.get("layer_types") or [
        "sliding_attention" if (i + 1) % 2 else "full_attention"
        for i in range(n_layers)]
    kw.update(
        attention_types=tuple(LOCAL if t == "sliding_attention" else GLOBAL
                              for t in types),
        sliding_window=hf.get("sliding_window", 4096),
        query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
        attn_logit_softcap=hf.get("attn_logit_softcapping", 50.0),
        final_logit_softcap=hf.get("final_logit_softcapping", 30.0),
        use_post_attn_norm=True, use_post_ffw_norm=True)
  if model_type == "gemma3_text":
    kw.update(_gemma3_kw_from_hf(hf, n_layers))
  kw.update(overrides)
  return GemmaConfig(**kw)


def _gemma3_kw_from_hf(hf: Mapping[str, Any], n_layers: int) -> dict:
  """GemmaConfig fields of an HF gemma3_text config."""
  types = hf.get("layer_types") or [
      "full_attention" if (i + 1) % hf.get("sliding_window_pattern", 6) == 0
      else "sliding_attention" for i in range(n_layers)]
  rope = hf.get("rope_parameters") or {}
  glob = rope.get("full_attention") or {}
  local = rope.get("sliding_attention") or {}
  scaling = hf.get("rope_scaling") or glob
  factor = 1.0
  if scaling.get("rope_type", "default") == "linear":
    factor = float(scaling.get("factor", 1.0))
  elif scaling.get("rope_type", "default") != "default":
    raise ValueError(f"unsupported Gemma 3 rope_type "
                     f"{scaling.get('rope_type')!r}; expected 'default' or "
                     f"'linear'")
  return dict(
      attention_types=tuple(LOCAL if t == "sliding_attention" else GLOBAL
                            for t in types),
      sliding_window=hf.get("sliding_window", 4096),
      query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
      attn_logit_softcap=hf.get("attn_logit_softcapping"),
      final_logit_softcap=hf.get("final_logit_softcapping"),
      use_qk_norm=True, use_post_attn_norm=True, use_post_ffw_norm=True,
      rope_base=float(glob.get("rope_theta", hf.get("rope_theta", 1e6))),
      local_rope_base=float(local.get(
          "rope_theta", hf.get("rope_local_base_freq", 10_000.0))),
      rope_scale_factor=factor)


def gemma_config_to_hf(cfg: GemmaConfig) -> tuple[str, dict[str, Any]]:
  """(model_type, HF config kwargs) for a Gemma config."""
  gemma2 = cfg.use_post_ffw_norm
  gemma3 = cfg.use_qk_norm
  kw = dict(
      vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
      intermediate_size=cfg.mlp_dim, num_hidden_layers=cfg.num_layers,
      num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
      head_dim=cfg.head_dim, rms_norm_eps=cfg.norm_eps,
      hidden_act="gelu_pytorch_tanh", pad_token_id=cfg.pad_id,
      eos_token_id=cfg.eos_id, bos_token_id=cfg.bos_id,
      rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base},
      max_position_embeddings=8192)
  if gemma2:
    kw.update(
        query_pre_attn_scalar=cfg.query_pre_attn_scalar,
        sliding_window=cfg.sliding_window or 4096,
        layer_types=["sliding_attention" if t == LOCAL else "full_attention"
                     for t in cfg.attention_types],
        attn_logit_softcapping=cfg.attn_logit_softcap,
        final_logit_softcapping=cfg.final_logit_softcap)
  if gemma3:
    glob = {"rope_type": "default", "rope_theta": cfg.rope_base}
    if cfg.rope_scale_factor != 1.0:
      glob = {"rope_type": "linear", "rope_theta": cfg.rope_base,
              "factor": cfg.rope_scale_factor}
    qs = cfg.query_pre_attn_scalar
    kw.update(query_pre_attn_scalar=int(qs) if float(qs).is_integer() else qs,
              rope_parameters={
        "full_attention": glob,
        "sliding_attention": {"rope_type": "default", "rope_theta":
                              cfg.local_rope_base or cfg.rope_base}},
              max_position_embeddings=32768)
    return "gemma3_text", kw
  return ("gemma2" if gemma2 else "gemma"), kw


# ----------------------------------------------------------------------------
# Gemma weights
# ----------------------------------------------------------------------------


def _gemma_norms(cfg: GemmaConfig):
  """(our norm name, HF norm name) per layer, Gemma 1 vs Gemma 2 / 3."""
  qk = ([("attn/query_norm", "self_attn.q_norm"),
         ("attn/key_norm", "self_attn.k_norm")] if cfg.use_qk_norm else [])
  if cfg.use_post_ffw_norm:
    return qk + [("pre_attention_norm", "input_layernorm"),
                 ("post_attention_norm", "post_attention_layernorm"),
                 ("pre_ffw_norm", "pre_feedforward_layernorm"),
                 ("post_ffw_norm", "post_feedforward_layernorm")]
  # Gemma 1 HF calls the pre-FFW norm "post_attention_layernorm".
  return qk + [("pre_attention_norm", "input_layernorm"),
               ("pre_ffw_norm", "post_attention_layernorm")]


def _in_proj(w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """HF [out, in] weight -> our kernel of ``shape`` (inputs first)."""
  return w.T.reshape(shape)


def _stacked_in_proj(a: np.ndarray, b: np.ndarray,
                     shape: tuple[int, ...]) -> np.ndarray:
  """Two HF [out, in] weights -> our kernel [in, 2, *out] (axis 1 stacks)."""
  return np.stack([a.T.reshape(shape), b.T.reshape(shape)], axis=1)


def _out_proj(w: np.ndarray, part: int | None, rows: int) -> np.ndarray:
  """Our kernel (or its ``[:, part]`` slice) -> HF [out, in] weight."""
  if part is not None:
    w = w[:, part]
  return np.ascontiguousarray(w.reshape(rows, -1).T)


def gemma_rules_from_hf(cfg: GemmaConfig) -> list[Rule]:
  """One :data:`Rule` per Gemma leaf: (our path, HF names, tensors -> leaf)."""
  n, k, d, h = cfg.num_heads, cfg.num_kv_heads, cfg.d_model, cfg.head_dim
  f = cfg.mlp_dim
  rules: list[Rule] = [
      ("embedder/input_embedding", ("model.embed_tokens.weight",), same),
      ("final_norm/scale", ("model.norm.weight",), same)]
  for i in range(cfg.num_layers):
    hf, ours = f"model.layers.{i}", f"layer_{i}"
    attn = f"{hf}.self_attn"
    rules += [
        (f"{ours}/attn/q/kernel", (f"{attn}.q_proj.weight",),
         functools.partial(_in_proj, shape=(d, n, h))),
        (f"{ours}/attn/kv/kernel",
         (f"{attn}.k_proj.weight", f"{attn}.v_proj.weight"),
         functools.partial(_stacked_in_proj, shape=(d, k, h))),
        (f"{ours}/attn/out/kernel", (f"{attn}.o_proj.weight",),
         functools.partial(_in_proj, shape=(n, h, d))),
        (f"{ours}/mlp/gating/kernel",
         (f"{hf}.mlp.gate_proj.weight", f"{hf}.mlp.up_proj.weight"),
         functools.partial(_stacked_in_proj, shape=(d, f))),
        (f"{ours}/mlp/linear/kernel", (f"{hf}.mlp.down_proj.weight",),
         functools.partial(_in_proj, shape=(f, d)))]
    rules += [(f"{ours}/{our_norm}/scale", (f"{hf}.{hf_norm}.weight",), same)
              for our_norm, hf_norm in _gemma_norms(cfg)]
  return rules


def gemma_rules_to_hf(cfg: GemmaConfig) -> list[Rule]:
  """One :data:`Rule` per HF Gemma tensor: (HF name, our paths, -> tensor).

  The tied ``lm_head.weight`` (:data:`GEMMA_HF_TIED`) is not listed.
  """
  d = cfg.d_model
  rules: list[Rule] = [
      ("model.embed_tokens.weight", ("embedder/input_embedding",), same),
      ("model.norm.weight", ("final_norm/scale",), same)]
  for i in range(cfg.num_layers):
    hf, ours = f"model.layers.{i}", f"layer_{i}"
    attn = f"{hf}.self_attn"
    kv, gating = f"{ours}/attn/kv/kernel", f"{ours}/mlp/gating/kernel"
    rules += [
        (f"{attn}.q_proj.weight", (f"{ours}/attn/q/kernel",),
         functools.partial(_out_proj, part=None, rows=d)),
        (f"{attn}.k_proj.weight", (kv,),
         functools.partial(_out_proj, part=0, rows=d)),
        (f"{attn}.v_proj.weight", (kv,),
         functools.partial(_out_proj, part=1, rows=d)),
        (f"{attn}.o_proj.weight", (f"{ours}/attn/out/kernel",),
         functools.partial(_out_proj, part=None,
                           rows=cfg.num_heads * cfg.head_dim)),
        (f"{hf}.mlp.gate_proj.weight", (gating,),
         functools.partial(_out_proj, part=0, rows=d)),
        (f"{hf}.mlp.up_proj.weight", (gating,),
         functools.partial(_out_proj, part=1, rows=d)),
        (f"{hf}.mlp.down_proj.weight", (f"{ours}/mlp/linear/kernel",),
         contiguous_t)]
    rules += [(f"{hf}.{hf_norm}.weight", (f"{ours}/{our_norm}/scale",), same)
              for our_norm, hf_norm in _gemma_norms(cfg)]
  return rules


def gemma_params_from_hf(sd: Mapping[str, Any], cfg: GemmaConfig) -> dict:
  """HF Gemma/Gemma2/Gemma3ForCausalLM state dict -> our nested params."""
  return params_from_state_dict(gemma_rules_from_hf(cfg), sd)


def gemma_params_to_hf(params: Mapping[str, Any], cfg: GemmaConfig) -> StateDict:
  """Our Gemma params -> HF Gemma/Gemma2/Gemma3ForCausalLM state dict."""
  return state_dict_from_params(gemma_rules_to_hf(cfg), GEMMA_HF_TIED, params)


# ----------------------------------------------------------------------------
# The converter interface ``hf.py`` calls (same names in every family's
# converter; see ``hf_convert.py``)
# ----------------------------------------------------------------------------

TIED = GEMMA_HF_TIED
config_from_hf = gemma_config_from_hf
rules_from_hf = gemma_rules_from_hf
rules_to_hf = gemma_rules_to_hf
_ARCHITECTURES = {"gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                  "gemma3_text": "Gemma3ForCausalLM"}


def hf_config(cfg: GemmaConfig) -> dict[str, Any]:
  """The config.json dict of a Gemma model for transformers."""
  model_type, kw = gemma_config_to_hf(cfg)
  scalar = kw.get("query_pre_attn_scalar")
  if scalar is not None and float(scalar).is_integer():
    kw["query_pre_attn_scalar"] = int(scalar)  # transformers wants an int
  return {"architectures": [_ARCHITECTURES[model_type]],
          "model_type": model_type, "tie_word_embeddings": True, **kw}


def check_files(names, path: str) -> None:  # pylint: disable=unused-argument
  """Every Gemma checkpoint with the rules' tensors is readable."""
