"""HF safetensors import / export, sharded or not, against transformers."""

import json
import os

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from specdec_jax.checkpoints import hf
from tests.checkpoints.helpers import assert_same, tiny

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-4
TOKENS = np.random.default_rng(0).integers(2, 60, size=(2, 9))


def _hf_t5():
  torch.manual_seed(0)
  cfg = transformers.T5Config(
      vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2,
      num_decoder_layers=3, num_heads=4, feed_forward_proj="gated-gelu",
      tie_word_embeddings=False, relative_attention_num_buckets=8,
      relative_attention_max_distance=12, dropout_rate=0.0)
  model = transformers.T5ForConditionalGeneration(cfg).eval()
  # transformers 5 ties lm_head at construction; v1.1's head is untied.
  model.lm_head.weight = torch.nn.Parameter(torch.randn(64, 32) * 0.5)
  return model


def _hf_gemma(version):
  torch.manual_seed(1)
  kw = dict(vocab_size=64, hidden_size=32, intermediate_size=48,
            num_hidden_layers=2, head_dim=8, num_attention_heads=4,
            initializer_range=0.2)
  if version == 1:
    model = transformers.GemmaForCausalLM(
        transformers.GemmaConfig(num_key_value_heads=1, **kw))
  else:
    model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        num_key_value_heads=2, sliding_window=4, **kw))
  with torch.no_grad():  # norms start at zero in HF; test (1 + scale)
    for name, p in model.named_parameters():
      if "norm" in name:
        p.normal_(0.0, 0.3)
  return model.eval()


def _hf_logits(model):
  with torch.no_grad():
    if model.config.is_encoder_decoder:
      dec = np.concatenate([np.zeros((2, 1), np.int64), TOKENS[:, :5]], 1)
      return model(input_ids=torch.tensor(TOKENS),
                   decoder_input_ids=torch.tensor(dec)).logits.numpy()
    return model(input_ids=torch.tensor(TOKENS)).logits.numpy()


def _our_logits(model, params):
  forward = jax.jit(model.forward)
  if model.is_encoder_decoder:
    dec = np.concatenate([np.zeros((2, 1), np.int64), TOKENS[:, :5]], 1)
    return np.asarray(forward(params, dec, inputs=TOKENS))
  return np.asarray(forward(params, TOKENS))


@pytest.mark.parametrize("make", [_hf_t5, lambda: _hf_gemma(1),
                                  lambda: _hf_gemma(2)],
                         ids=["t5", "gemma", "gemma2"])
def test_load_save_pretrained_matches_hf_logits(make, tmp_path):
  ref_model = make()
  ref_model.save_pretrained(tmp_path / "one")
  ref_model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
  assert os.path.isfile(tmp_path / "sharded" / hf.INDEX)
  model, params = hf.load_hf(str(tmp_path / "one"), dtype="float32")
  got = _our_logits(model, params)
  assert np.abs(got - _hf_logits(ref_model)).max() <= TOL
  model2, params2 = hf.load_hf(str(tmp_path / "sharded"), dtype=None)
  assert model2 == model
  assert_same(params, params2)


@pytest.mark.parametrize("name,sharded", [
    ("t5_tiny", False), ("gemma_tiny", False), ("gemma2_tiny", True)])
def test_export_loads_in_transformers(name, sharded, tmp_path):
  model, params = tiny(name)
  if sharded:  # 8 KB shards: several files plus the index
    hf.save_hf(str(tmp_path), model, params, max_shard_bytes=8192)
    index = json.loads((tmp_path / hf.INDEX).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 3 and files == sorted(
        f for f in os.listdir(tmp_path) if f.endswith(".safetensors"))
    assert files[-1] == f"model-{len(files):05d}-of-{len(files):05d}" \
        ".safetensors"
  else:
    hf.save_hf(str(tmp_path), model, params)
    assert sorted(os.listdir(tmp_path)) == ["checksums.json", "config.json",
                                            "model.safetensors"]
  auto = (transformers.AutoModelForSeq2SeqLM if model.is_encoder_decoder
          else transformers.AutoModelForCausalLM)
  ref = auto.from_pretrained(str(tmp_path)).eval()
  assert np.abs(_hf_logits(ref) - _our_logits(model, params)).max() <= TOL
  back_model, back = hf.load_hf(str(tmp_path), dtype=None)
  assert back_model == model
  assert_same(params, back)


def test_bfloat16_export_and_restore(tmp_path):
  model, params = tiny("gemma2_tiny")
  bf16 = jax.tree.map(lambda x: x.astype("bfloat16"), params)
  hf.save_hf(str(tmp_path), model, bf16)
  assert json.loads((tmp_path / "config.json").read_text())["dtype"] == (
      "bfloat16")
  _, f32 = hf.load_hf(str(tmp_path), dtype="float32")
  _, back = hf.load_hf(str(tmp_path))  # default: bfloat16
  assert_same(back, bf16)
  assert_same(f32, jax.tree.map(lambda x: x.astype("float32"), bf16))


@pytest.fixture(name="gemma_dir")
def _gemma_dir(tmp_path):
  """An HF export without its checksums.json, as a foreign checkpoint: the
  structural checks below are what such checkpoints get (with the manifest,
  every rewrite here fails its checksum first; test_checksums.py)."""
  hf.save_hf(str(tmp_path), *tiny("gemma_tiny"))
  os.remove(tmp_path / "checksums.json")
  return tmp_path


def _rewrite(path, drop=(), **put):
  """Rewrites model.safetensors without ``drop`` and with ``put`` (names with
  '.' written as '__')."""
  tensors = load_file(path / hf.SINGLE)
  for name in drop:
    del tensors[name]
  tensors.update({k.replace("__", "."): v for k, v in put.items()})
  save_file(tensors, path / hf.SINGLE, metadata={"format": "pt"})


def test_corrupt_and_partial_checkpoints(gemma_dir):
  d = gemma_dir
  v_proj = "model.layers.1.self_attn.v_proj.weight"
  good_v = load_file(d / hf.SINGLE)[v_proj]
  _rewrite(d, drop=[v_proj])
  with pytest.raises(ValueError, match=(
      r"is missing tensor 'model.layers.1.self_attn.v_proj.weight' \(needed "
      r"for 'layer_1/attn/kv/kernel'\)")):
    hf.load_hf(str(d))
  _rewrite(d, model__layers__1__self_attn__v_proj__weight=good_v,
           model__layers__9__mlp__up_proj__weight=np.zeros((2, 2), np.float32))
  with pytest.raises(ValueError, match="unexpected tensor.*'model.layers.9"):
    hf.load_hf(str(d))
  # A tensor whose shape does not fit the config: both shapes are named.
  _rewrite(d, drop=["model.layers.9.mlp.up_proj.weight"],
           model__norm__weight=np.zeros((31,), np.float32))
  with pytest.raises(ValueError, match=(
      r"tensor\(s\) 'model.norm.weight' \(31,\) gave shape \(31,\) for "
      r"'final_norm/scale', expected \(32,\)")):
    hf.load_hf(str(d))
  _rewrite(d, model__norm__weight=np.arange(32, dtype=np.int32))
  with pytest.raises(ValueError, match=(
      "'final_norm/scale' .* is stored as int32, not a floating-point type")):
    hf.load_hf(str(d))
  _rewrite(d, model__norm__weight=np.zeros((32,), np.float32))
  hf.load_hf(str(d))  # repaired
  data = (d / hf.SINGLE).read_bytes()
  (d / hf.SINGLE).write_bytes(data[:len(data) // 2])
  with pytest.raises(ValueError, match="model.safetensors.*truncated or "
                     "corrupt"):
    hf.load_hf(str(d))


def test_bad_directories(gemma_dir, tmp_path_factory):
  d = gemma_dir
  os.rename(d / hf.SINGLE, d / "model-00001-of-00002.safetensors")
  (d / hf.INDEX).write_text(json.dumps({"weight_map": {
      "model.norm.weight": "model-00002-of-00002.safetensors"}}))
  with pytest.raises(ValueError, match="model-00002-of-00002.safetensors' "
                     "does not exist"):
    hf.load_hf(str(d))
  config = json.loads((d / "config.json").read_text())
  (d / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
  with pytest.raises(ValueError, match="unsupported HF model_type 'llama'"):
    hf.load_hf(str(d))
  empty = tmp_path_factory.mktemp("empty")
  with pytest.raises(ValueError, match="missing config.json"):
    hf.load_hf(str(empty))


def test_t5_without_lm_head_is_refused(tmp_path):
  hf.save_hf(str(tmp_path), *tiny("t5_tiny"))
  _rewrite(tmp_path, drop=["lm_head.weight"])
  with pytest.raises(ValueError, match="no 'lm_head.weight': T5 with the "
                     "output projection tied"):
    hf.load_hf(str(tmp_path))
