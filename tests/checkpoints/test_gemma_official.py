"""Official Gemma Flax checkpoints (FLAT / NESTED Orbax) against HF logits."""

import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from specdec_jax import models
from specdec_jax.checkpoints import gemma_official, hf_gemma
from tests.checkpoints.helpers import assert_same, tiny

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-4
TOKENS = np.random.default_rng(2).integers(0, 64, size=(2, 10))


def _hf_gemma(version, heads, kv_heads, **kw):
  torch.manual_seed(0)
  common = dict(vocab_size=64, hidden_size=32, intermediate_size=48,
                num_hidden_layers=2, head_dim=8, num_attention_heads=heads,
                num_key_value_heads=kv_heads, initializer_range=0.2, **kw)
  model = (transformers.GemmaForCausalLM(transformers.GemmaConfig(**common))
           if version == 1 else transformers.Gemma2ForCausalLM(
               transformers.Gemma2Config(**common)))
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.normal_(0.0, 0.3)
  return model.eval()


def _official_from_hf(hf_model, transpose_gating: bool) -> dict:
  """The FLAT official tree, written from the official einsum definitions:
  q 'BTD,NDH->BTNH', kv 'BSD,CKDH->CBSKH', attn_vec 'BTNH,NHD->BTD',
  gating 'BTD,NDF->BTNF' (transposed: 'BTD,NFD->BTNF'), linear 'BTF,FD->BTD'.
  HF Linear weights are [out, in] with out = head * head_dim + h."""
  sd = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
  c = hf_model.config
  n, k, h = c.num_attention_heads, c.num_key_value_heads, c.head_dim
  gemma2 = c.model_type == "gemma2"
  tree = {"transformer/embedder": {
      "input_embedding": sd["model.embed_tokens.weight"]},
          "transformer/final_norm": {"scale": sd["model.norm.weight"]}}
  for i in range(c.num_hidden_layers):
    p, lay = f"model.layers.{i}", f"transformer/layer_{i}"

    def heads(w, count):  # [count*h, d] -> [count, d, h]
      return w.reshape(count, h, -1).transpose(0, 2, 1)
    q = heads(sd[f"{p}.self_attn.q_proj.weight"], n)
    kk = heads(sd[f"{p}.self_attn.k_proj.weight"], k)
    v = heads(sd[f"{p}.self_attn.v_proj.weight"], k)
    if n == k:
      tree[f"{lay}/attn/qkv_einsum"] = {"w": np.stack([q, kk, v])}
    else:
      tree[f"{lay}/attn/q_einsum"] = {"w": q}
      tree[f"{lay}/attn/kv_einsum"] = {"w": np.stack([kk, v])}
    tree[f"{lay}/attn/attn_vec_einsum"] = {
        "w": sd[f"{p}.self_attn.o_proj.weight"].T.reshape(n, h, -1)}
    gate, up = sd[f"{p}.mlp.gate_proj.weight"], sd[f"{p}.mlp.up_proj.weight"]
    tree[f"{lay}/mlp/gating_einsum"] = {"w": np.stack(
        [gate, up] if transpose_gating else [gate.T, up.T])}
    tree[f"{lay}/mlp/linear"] = {"w": sd[f"{p}.mlp.down_proj.weight"].T}
    norms = ({"pre_attention_norm": "input_layernorm",
              "post_attention_norm": "post_attention_layernorm",
              "pre_ffw_norm": "pre_feedforward_layernorm",
              "post_ffw_norm": "post_feedforward_layernorm"} if gemma2 else
             {"pre_attention_norm": "input_layernorm",
              "pre_ffw_norm": "post_attention_layernorm"})
    for ours, theirs in norms.items():
      tree[f"{lay}/{ours}"] = {"scale": sd[f"{p}.{theirs}.weight"]}
  return tree


def _save(path, tree, ocdbt=True):
  handler = ocp.PyTreeCheckpointHandler(use_ocdbt=ocdbt)
  with ocp.Checkpointer(handler) as ckptr:
    ckptr.save(str(path), args=ocp.args.PyTreeSave(tree))


@pytest.mark.parametrize("version,heads,kv_heads,transposed,extra", [
    (1, 4, 1, False, {}),  # Gemma 1 MQA: q_einsum + kv_einsum
    (1, 4, 4, False, {}),  # Gemma 1 MHA: qkv_einsum
    (2, 4, 2, False, dict(sliding_window=4)),  # Gemma 2 2B-like
    (2, 4, 2, True, dict(sliding_window=4)),  # 9B / 27B: transposed gating
])
def test_official_checkpoint_matches_hf_logits(version, heads, kv_heads,
                                               transposed, extra, tmp_path):
  ref = _hf_gemma(version, heads, kv_heads, **extra)
  _save(tmp_path / "ckpt", _official_from_hf(ref, transposed),
        ocdbt=not transposed)  # both Orbax storage layouts
  cfg = hf_gemma.gemma_config_from_hf(ref.config.to_dict(),
                                        transpose_gating_einsum=transposed)
  model = models.GemmaModel(cfg)
  params = gemma_official.load_gemma(str(tmp_path / "ckpt"), model,
                                     dtype="float32")
  with torch.no_grad():
    want = ref(input_ids=torch.tensor(TOKENS)).logits.numpy()
  got = np.asarray(jax.jit(model.forward)(params, TOKENS))
  assert np.abs(got - want).max() <= TOL


@pytest.mark.parametrize("name,kv_heads,layout", [
    ("gemma_tiny", 1, "flat"), ("gemma_tiny", 4, "nested"),
    ("gemma2_tiny", 2, "flat"), ("gemma2_tiny", 2, "nested")])
def test_save_layouts_round_trip(name, kv_heads, layout, tmp_path):
  model, params = tiny(name, num_kv_heads=kv_heads)
  path = str(tmp_path / "ckpt")
  gemma_official.save_gemma(path, model, params, layout=layout)
  tree = ocp.PyTreeCheckpointer().metadata(path).item_metadata.tree
  attn = ({"qkv_einsum"} if kv_heads == 4 else {"q_einsum", "kv_einsum"}) | {
      "attn_vec_einsum"}
  if layout == "flat":
    assert all(k.startswith("transformer/") for k in tree)
    got = {k.split("/")[-1] for k in tree if k.startswith(
        "transformer/layer_0/attn/")}
    assert got == attn
    assert set(tree["transformer/layer_0/mlp/gating_einsum"]) == {"w"}
    assert tree["transformer/layer_0/attn/attn_vec_einsum"]["w"].shape == (
        4, 8, 32)
    post = "transformer/layer_1/post_ffw_norm" in tree
  else:
    assert set(tree["layer_0"]["attn"]) == attn
    assert tree["layer_0"]["mlp"]["gating_einsum"].shape == (2, 32, 64)
    post = "post_ffw_norm" in tree["layer_1"]
  assert post == name.startswith("gemma2")
  assert_same(gemma_official.load_gemma(path, model, dtype=None), params)


def test_kauldron_checkpoint_bfloat16_and_sharding(tmp_path):
  model, params = tiny("gemma2_tiny")
  nested = tmp_path / "nested"
  gemma_official.save_gemma(str(nested), model, params, layout="nested")
  tree = ocp.PyTreeCheckpointer().restore(str(nested))
  os.makedirs(tmp_path / "kd")
  (tmp_path / "kd" / "_CHECKPOINT_METADATA").write_text("{}")
  _save(tmp_path / "kd" / "default", {
      "params": tree, "step": np.int32(3), "opt_state": {"mu": np.zeros(2)},
      "collections": {}})
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("model",))
  calls = {}

  def by_leaf(path, shape):
    calls[path] = shape
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  got = gemma_official.load_gemma(str(tmp_path / "kd"), model,
                                  sharding=by_leaf)
  assert_same(got, jax.tree.map(lambda x: x.astype("bfloat16"), params))
  assert calls == {k: v.shape for k, v in
                   models.flatten_params(params).items()}
  assert calls["layer_0/attn/kv/kernel"] == (32, 2, 2, 8)  # our layout


def _flat_tree(path):
  return ocp.PyTreeCheckpointer().restore(str(path))


def test_wrong_preset_and_partial_checkpoints(tmp_path):
  model, params = tiny("gemma2_tiny")
  path = tmp_path / "ckpt"
  gemma_official.save_gemma(str(path), model, params)
  with pytest.raises(ValueError, match=(
      r"leaf 'transformer/layer_0/attn/kv_einsum/w' has shape "
      r"\(2, 2, 32, 8\), expected \(2, 1, 32, 8\)")):
    gemma_official.load_gemma(str(path), "gemma_tiny")
  transposed, _ = tiny("gemma2_tiny", transpose_gating_einsum=True)
  with pytest.raises(ValueError, match=(
      r"'transformer/layer_0/mlp/gating_einsum/w' has shape \(2, 32, 64\), "
      r"expected \(2, 64, 32\); the gating einsum looks transposed: set "
      r"transpose_gating_einsum=False")):
    gemma_official.load_gemma(str(path), transposed)
  no_post, _ = tiny("gemma2_tiny", use_post_attn_norm=False)
  with pytest.raises(ValueError, match=(
      "unexpected leaf/leaves, first: "
      "'transformer/layer_0/post_attention_norm/scale'")):
    gemma_official.load_gemma(str(path), no_post)
  with pytest.raises(ValueError, match="official Gemma checkpoints hold "
                     "Gemma models"):
    gemma_official.load_gemma(str(path), "t5_tiny")
  tree = _flat_tree(path)
  del tree["transformer/layer_1/mlp/linear"]
  tree["transformer/final_norm"]["scale"] = np.arange(32, dtype=np.int32)
  _save(tmp_path / "partial", tree)
  with pytest.raises(ValueError, match=(
      r"is missing 'layer_1/mlp/linear' \(expected shape \(64, 32\)\)")):
    gemma_official.load_gemma(str(tmp_path / "partial"), model)
  tree["transformer/layer_1/mlp/linear"] = {"w": np.zeros((64, 32))}
  _save(tmp_path / "int", tree)
  with pytest.raises(ValueError, match=(
      "'final_norm/scale' .* is stored as int32, not a floating-point type")):
    gemma_official.load_gemma(str(tmp_path / "int"), model)
  stacked = {"transformer/stacked_layers/attention_type_0/attn/q_einsum": {
      "w": np.zeros((1, 2))}}
  _save(tmp_path / "stacked", stacked)
  with pytest.raises(ValueError, match="STACKED Gemma layout"):
    gemma_official.load_gemma(str(tmp_path / "stacked"), model)


def test_truncated_data_names_the_leaf(tmp_path):
  model, params = tiny("gemma_tiny")
  path = tmp_path / "ckpt"
  gemma_official.save_gemma(str(path), model, params)
  data = [os.path.join(r, f) for r, _, fs in os.walk(path / "ocdbt.process_0")
          for f in fs if os.sep + "d" + os.sep in os.path.join(r, f)]
  assert data
  for f in data:
    with open(f, "r+b") as fh:
      fh.truncate(os.path.getsize(f) // 2)
  with pytest.raises(ValueError, match=(
      r"cannot read '[a-z_0-9/]+' from 'transformer/.*truncated or corrupt")):
    gemma_official.load_gemma(str(path), model)
  with pytest.raises(ValueError, match="does not exist"):
    gemma_official.load_gemma(str(tmp_path / "nope"), model)
