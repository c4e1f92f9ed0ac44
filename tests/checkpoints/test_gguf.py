"""GGUF import: tiny Gemma 3 files written with gguf-py's GGUFWriter (F32,
F16, BF16, Q8_0, Q5_0 and a hand-made Q4_K block), bad files, the tokenizer."""

import dataclasses

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from specdec_jax import checkpoints, models, tokenizer  # noqa: E402
from specdec_jax.checkpoints import gguf as gguf_lib  # noqa: E402
from specdec_jax.checkpoints import hf_gemma  # noqa: E402

T = gguf.GGMLQuantizationType
# mlp 256 so ffn_down's rows fill one 256-value K-quant block.
CFG = dataclasses.replace(models.PRESETS["gemma3_tiny"], mlp_dim=256)
# Per GGUF layer tensor: the type it is written as.
TYPES = {"attn_q": T.F16, "attn_k": T.BF16, "attn_v": T.F32,
         "attn_output": T.Q5_0, "ffn_gate": T.Q8_0, "ffn_up": T.F32,
         "ffn_down": T.Q4_K}


def _q4_k_rows(rows: int) -> tuple[np.ndarray, np.ndarray]:
  """Q4_K bytes [rows, 144] and their values [rows, 256]: row r has d =
  (r + 1) / 8, every sub-block scale 1 and min 0, nibbles 3 (low) / 5 (high),
  so each 64-value chunk is 32 x 3d then 32 x 5d."""
  block = np.zeros(144, np.uint8)
  scales = np.zeros(12, np.uint8)
  scales[:4] = 1  # sub-blocks 0-3: scale 1, min 0 (scales[4:8] = 0)
  scales[8:] = 0x01  # sub-blocks 4-7: scale 1 (low nibble), min 0
  block[4:16] = scales
  block[16:] = 0x53
  raw, values = [], []
  for r in range(rows):
    d = (r + 1) / 8
    b = block.copy()
    b[0:2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
    raw.append(b)
    values.append(np.tile(np.repeat([3 * d, 5 * d], 32), 4))
  return np.stack(raw), np.stack(values).astype(np.float32)


def write_tiny(path, cfg=CFG, arch="gemma3", vocab_rows=None, extra=None,
               tokenizer_model=None):
  """Writes a tiny Gemma 3 GGUF; returns the HF-named weights it holds."""
  rng = np.random.default_rng(0)
  sd = hf_gemma.gemma_params_to_hf(
      models.GemmaModel(cfg).init_params(__import__("jax").random.PRNGKey(0)),
      cfg)
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(cfg.num_layers)
  w.add_embedding_length(cfg.d_model)
  w.add_feed_forward_length(cfg.mlp_dim)
  w.add_head_count(cfg.num_heads)
  w.add_head_count_kv(cfg.num_kv_heads)
  w.add_key_length(cfg.head_dim)
  w.add_value_length(cfg.head_dim)
  w.add_layer_norm_rms_eps(cfg.norm_eps)
  w.add_rope_freq_base(cfg.rope_base)
  w.add_sliding_window(cfg.sliding_window)
  w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
  w.add_rope_scaling_factor(cfg.rope_scale_factor)
  if tokenizer_model is not None:
    _add_tokenizer(w, tokenizer_model)
  expect = {}
  rows = vocab_rows or cfg.vocab_size
  emb = sd["model.embed_tokens.weight"][:rows]
  q = gguf.quants.quantize(emb, T.Q8_0)
  w.add_tensor("token_embd.weight", q, raw_shape=q.shape, raw_dtype=T.Q8_0)
  expect["model.embed_tokens.weight"] = gguf.quants.dequantize(q, T.Q8_0)
  inverse = {v: k for k, v in gguf_lib._LAYER_NAMES.items()}
  for name, value in sd.items():
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
      continue
    if name == "model.norm.weight":
      gname = "output_norm.weight"
    else:
      i, rest = name.split(".")[2], ".".join(name.split(".")[3:-1])
      gname = f"blk.{i}.{inverse[rest]}.weight"
    kind = TYPES.get(gname.split(".")[-2], T.F32)
    if gname.endswith("norm.weight"):
      value = value + rng.normal(0, 0.3, value.shape).astype(np.float32)
      expect[name] = value
      w.add_tensor(gname, value + 1.0)  # the converter's 1 + w
    elif kind == T.Q4_K:
      raw, value = _q4_k_rows(value.shape[0])
      w.add_tensor(gname, raw, raw_shape=raw.shape, raw_dtype=T.Q4_K)
      expect[name] = value
    elif kind == T.F16:
      w.add_tensor(gname, value.astype(np.float16))
      expect[name] = value.astype(np.float16).astype(np.float32)
    else:
      q = gguf.quants.quantize(value, kind)
      w.add_tensor(gname, q, raw_shape=q.shape if kind != T.F32 else None,
                   raw_dtype=kind if kind != T.F32 else None)
      expect[name] = gguf.quants.dequantize(q, kind)
  for name, value in (extra or {}).items():
    w.add_tensor(name, value)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return expect


def _add_tokenizer(w, tok):
  from sentencepiece import sentencepiece_model_pb2 as pb  # pylint: disable=g-import-not-at-top
  proto = pb.ModelProto.FromString(tok._proto)  # pylint: disable=protected-access
  w.add_tokenizer_model("llama")
  w.add_token_list([p.piece for p in proto.pieces])
  w.add_token_scores([p.score for p in proto.pieces])
  w.add_token_types([3 if p.type == 2 else p.type for p in proto.pieces])
  w.add_bos_token_id(2)
  w.add_eos_token_id(1)
  w.add_unk_token_id(3)
  w.add_pad_token_id(0)
  w.add_add_space_prefix(False)


def test_gguf_weights_and_config_round_trip(tmp_path):
  path = tmp_path / "tiny.gguf"
  expect = write_tiny(path)
  model, params = checkpoints.load(str(path), dtype="float32")
  assert model.config == CFG
  want = hf_gemma.gemma_params_from_hf(expect, CFG)
  got, ref = models.flatten_params(params), models.flatten_params(want)
  assert set(got) == set(ref)
  for name in ref:
    np.testing.assert_allclose(np.asarray(got[name]), ref[name], atol=1e-6,
                               err_msg=name)
  # The hand-made Q4_K block: 32 x 3d then 32 x 5d, d = (row + 1) / 8.
  down = np.asarray(got["layer_0/mlp/linear/kernel"])  # [mlp, d] = HF.T
  np.testing.assert_array_equal(down[:32, 0], 3 / 8)
  np.testing.assert_array_equal(down[32:64, 1], 5 * 2 / 8)
  # Trimmed embedding rows come back as zeros in a larger model.
  path2 = tmp_path / "trimmed.gguf"
  write_tiny(path2, vocab_rows=60)
  big = models.GemmaModel(CFG)
  _, p2 = checkpoints.load(str(path2), big, dtype="float32")
  emb = np.asarray(p2["embedder"]["input_embedding"])
  assert emb.shape == (64, 32) and not emb[60:].any() and emb[:60].any()


def test_bad_gguf_files(tmp_path):
  good = tmp_path / "good.gguf"
  write_tiny(good)
  with pytest.raises(ValueError, match="SHA-256 .* expected 0000"):
    gguf_lib.load_gguf(str(good), sha256="0" * 64)
  assert gguf_lib.sha256_of(str(good)) == __import__("hashlib").sha256(
      good.read_bytes()).hexdigest()
  cut = tmp_path / "cut.gguf"
  cut.write_bytes(good.read_bytes()[:-1000])
  with pytest.raises(ValueError, match="truncated"):
    checkpoints.load(str(cut))
  llama = tmp_path / "llama.gguf"
  write_tiny(llama, arch="llama")
  with pytest.raises(ValueError, match="architecture 'llama' is not "
                     "supported; supported: gemma3"):
    checkpoints.load(str(llama))
  ints = tmp_path / "ints.gguf"
  write_tiny(ints, extra={"blk.9.attn_q.weight": np.zeros((4, 32), np.int32)})
  with pytest.raises(ValueError, match="type I32, which is not supported"):
    checkpoints.load(str(ints))
  more = tmp_path / "more.gguf"
  write_tiny(more, extra={"blk.9.attn_q.weight": np.zeros((4, 32), np.float32)})
  with pytest.raises(ValueError, match="1 unexpected tensor.*'blk.9.attn_q"):
    checkpoints.load(str(more))
  other = tmp_path / "other.gguf"
  other.write_bytes(b"PK\x03\x04" + b"\0" * 64)
  with pytest.raises(ValueError, match="not a GGUF file"):
    checkpoints.load(str(other))
  with pytest.raises(ValueError, match="num_layers=2 in the model, 6 in the "
                     "file"):
    checkpoints.load(str(good), models.get_model("gemma2_tiny"))


def test_tokenizer_from_gguf(tmp_path):
  texts = ["The quick brown fox jumps over the lazy dog 12345.",
           "def f(x):\n    return x + 1", "Paris is the capital of France."]
  tok = tokenizer.train(texts * 20, 400, family="gemma", model_type="bpe",
                        split_digits=True, add_dummy_prefix=False,
                        normalization_rule_name="identity",
                        remove_extra_whitespaces=False,
                        allow_whitespace_only_pieces=True)
  path = tmp_path / "tok.gguf"
  write_tiny(path, tokenizer_model=tok)
  got = tokenizer.from_gguf(str(path))
  assert (got.bos_id, got.eos_id, got.pad_id, got.unk_id) == (2, 1, 0, 3)
  for text in texts + ["  two  spaces and 987 digits\n", "unseen: zebra!"]:
    assert got.encode(text) == tok.encode(text), text
    assert got.decode(got.encode(text)) == text
  # ModelSpec.tokenizer may name the .gguf itself (read as bytes).
  assert tokenizer.Tokenizer(path.read_bytes(), "gemma").encode(
      texts[1]) == tok.encode(texts[1])
  out = tmp_path / "tok.model"
  assert gguf_lib.main(["gguf", "tokenizer", str(path), str(out)]) == 0
  assert tokenizer.Tokenizer(str(out), "gemma").encode("fox") == tok.encode(
      "fox")
