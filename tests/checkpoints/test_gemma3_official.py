"""Official Gemma 3 Flax checkpoints (FLAT / NESTED Orbax, with QK-norm)."""

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from specdec_jax import models
from specdec_jax.checkpoints import gemma_official
from tests.checkpoints.helpers import assert_same, tiny

TOKENS = np.random.default_rng(3).integers(0, 64, size=(2, 12))  # > window 4


def _official_tree(params, cfg, transposed: bool) -> dict:
  """The FLAT official Gemma 3 tree, written from the official einsums:
  q 'BTD,NDH->BTNH', kv 'BSD,CKDH->CBSKH' (qkv 'BTD,SNDH->SBTNH' when K == N),
  attn_vec 'BTNH,NHD->BTD', gating 'F,NFH->NH' ('F,NHF->NH' transposed),
  linear 'H,HF->F', RMSNorms of q / k over head_dim ('_query_norm',
  '_key_norm'). Ours: q [d, N, H], kv [d, 2, K, H], gating [d, 2, F]."""
  flat = {k: np.asarray(v) for k, v in models.flatten_params(params).items()}
  tree = {"transformer/embedder": {
      "input_embedding": flat["embedder/input_embedding"]},
          "transformer/final_norm": {"scale": flat["final_norm/scale"]}}
  for i in range(cfg.num_layers):
    lay, out = f"layer_{i}", f"transformer/layer_{i}"
    q = flat[f"{lay}/attn/q/kernel"].transpose(1, 0, 2)  # [N, d, H]
    kv = flat[f"{lay}/attn/kv/kernel"].transpose(1, 2, 0, 3)  # [2, K, d, H]
    if cfg.num_heads == cfg.num_kv_heads:
      tree[f"{out}/attn/qkv_einsum"] = {"w": np.concatenate([q[None], kv])}
    else:
      tree[f"{out}/attn/q_einsum"] = {"w": q}
      tree[f"{out}/attn/kv_einsum"] = {"w": kv}
    tree[f"{out}/attn/attn_vec_einsum"] = {"w": flat[f"{lay}/attn/out/kernel"]}
    for ours, theirs in (("query_norm", "_query_norm"),
                         ("key_norm", "_key_norm")):
      tree[f"{out}/attn/{theirs}"] = {
          "scale": flat[f"{lay}/attn/{ours}/scale"]}
    gating = flat[f"{lay}/mlp/gating/kernel"]  # [d, 2, F]
    tree[f"{out}/mlp/gating_einsum"] = {"w": gating.transpose(
        (1, 2, 0) if transposed else (1, 0, 2))}
    tree[f"{out}/mlp/linear"] = {"w": flat[f"{lay}/mlp/linear/kernel"]}
    for norm in ("pre_attention_norm", "post_attention_norm", "pre_ffw_norm",
                 "post_ffw_norm"):
      tree[f"{out}/{norm}"] = {"scale": flat[f"{lay}/{norm}/scale"]}
  return tree


def _save(path, tree):
  with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ckptr:
    ckptr.save(str(path), args=ocp.args.PyTreeSave(tree))


@pytest.mark.parametrize("kv_heads,transposed", [
    (2, False),  # GQA: q_einsum + kv_einsum (1B-like)
    (4, True),  # MHA: qkv_einsum, transposed gating einsum
])
def test_official_gemma3_checkpoint_logits_match(kv_heads, transposed,
                                                 tmp_path):
  model, params = tiny("gemma3_tiny", num_kv_heads=kv_heads,
                       transpose_gating_einsum=transposed)
  cfg = model.config
  assert cfg.use_qk_norm and len(set(cfg.attention_types)) == 2
  _save(tmp_path / "ckpt", _official_tree(params, cfg, transposed))
  got = gemma_official.load_gemma(str(tmp_path / "ckpt"), model,
                                  dtype="float32")
  assert_same(got, params)
  forward = jax.jit(model.forward)
  want = np.asarray(forward(params, TOKENS))
  np.testing.assert_allclose(np.asarray(forward(got, TOKENS)), want,
                             rtol=0, atol=1e-6)


@pytest.mark.parametrize("layout", ["flat", "nested"])
def test_gemma3_save_round_trip(layout, tmp_path):
  model, params = tiny("gemma3_tiny")
  path = str(tmp_path / "ckpt")
  gemma_official.save_gemma(path, model, params, layout=layout)
  tree = ocp.PyTreeCheckpointer().metadata(path).item_metadata.tree
  if layout == "flat":
    attn = {k.split("/")[-1] for k in tree
            if k.startswith("transformer/layer_5/attn/")}
    assert tree["transformer/layer_5/attn/_key_norm"]["scale"].shape == (8,)
    assert "transformer/layer_5/post_ffw_norm" in tree
  else:
    attn = set(tree["layer_5"]["attn"])
    assert tree["layer_5"]["attn"]["_query_norm"]["scale"].shape == (8,)
  assert attn == {"q_einsum", "kv_einsum", "attn_vec_einsum", "_query_norm",
                  "_key_norm"}
  assert_same(gemma_official.load_gemma(path, model, dtype=None), params)


def test_gemma3_and_gemma2_checkpoints_not_mixed(tmp_path):
  g3, p3 = tiny("gemma3_tiny")
  g2, p2 = tiny("gemma2_tiny")
  gemma_official.save_gemma(str(tmp_path / "g3"), g3, p3)
  gemma_official.save_gemma(str(tmp_path / "g2"), g2, p2)
  no_qk, _ = tiny("gemma3_tiny", use_qk_norm=False)
  with pytest.raises(ValueError, match=(
      "unexpected leaf/leaves, first: "
      "'transformer/layer_0/attn/_key_norm/scale'")):
    gemma_official.load_gemma(str(tmp_path / "g3"), no_qk)
  as_g3, _ = tiny("gemma2_tiny", use_qk_norm=True)
  with pytest.raises(ValueError, match=(
      r"is missing 'layer_0/attn/_query_norm/scale' \(expected shape \(8,\)\)")):
    gemma_official.load_gemma(str(tmp_path / "g2"), as_g3)
