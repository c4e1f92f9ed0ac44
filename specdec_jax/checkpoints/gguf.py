"""GGUF (llama.cpp) import: Gemma 3 weights, config and tokenizer from one file.

A GGUF file holds metadata (hyperparameters, the SentencePiece vocabulary) and
tensors, each with its own type (F32, F16, BF16, Q8_0, Q5_0, Q4_K, Q6_K, ...).
``gguf`` (llama.cpp's gguf-py) reads the file and dequantizes; this module
maps it to our Gemma parameters, one leaf at a time, and undoes the
conventions of llama.cpp's converter:

* RMSNorm weights are stored as ``1 + w`` (Gemma computes ``x * (1 + w)``);
  we subtract 1.
* Dimensions are stored innermost first (ggml ``ne``); gguf-py already gives
  numpy arrays in row-major order, i.e. HF's ``[out, in]``.
* The embedding is trimmed to the tokenizer's vocabulary (262,144 rows; HF's
  4B+ checkpoints have 262,208): a model with more rows gets zero rows.

What the file does not store comes from the preset (``gemma3_270m`` for 18
layers, ...): the 5 local : 1 global pattern, the local RoPE base (10k) and
the 27B's query scaling.

    model, params = checkpoints.load("gemma-3-270m-q4_k_m.gguf")
    tok = tokenizer.from_gguf("gemma-3-270m-q4_k_m.gguf")
    python -m specdec_jax.checkpoints.gguf tokenizer MODEL.gguf OUT.model
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys

import numpy as np

from specdec_jax import models
from specdec_jax.checkpoints import hf_gemma
from specdec_jax.checkpoints import leaves as leaves_lib
from specdec_jax.models.gemma import GemmaConfig, GemmaModel

ARCHITECTURES = ("gemma3",)
# Tensor types gguf.quants dequantizes (name -> GGMLQuantizationType name).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                   "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
# GGUF tensor name (after 'blk.{i}.') -> HF Gemma 3 name (after
# 'model.layers.{i}.').
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _gguf():
  try:
    import gguf  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError("reading GGUF files needs the 'gguf' package: pip "
                      "install 'specdec_jax[gemma3]' (or gguf)") from None
  return gguf


def sha256_of(path: str) -> str:
  """Hex SHA-256 of a file (read in 1 MiB blocks)."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def open_gguf(path: str, sha256: str | None = None):
  """A ``gguf.GGUFReader`` of ``path`` with clear errors.

  Args:
    path: the .gguf file.
    sha256: expected hex SHA-256 of the whole file (None: not checked).

  Raises:
    ValueError: missing file, hash mismatch, not a GGUF file, or a file cut
      short (its tensors reach past its end).
  """
  path = str(path)
  if not os.path.isfile(path):
    raise ValueError(f"GGUF file {path!r} does not exist")
  if sha256 is not None:
    got = sha256_of(path)
    if got != sha256.lower():
      raise ValueError(f"GGUF file {path!r} has SHA-256 {got}, expected "
                       f"{sha256.lower()}: the file is corrupt or a different "
                       f"model; download or assemble it again")
  with open(path, "rb") as f:
    magic = f.read(4)
  if magic != b"GGUF":
    raise ValueError(f"{path!r} is not a GGUF file (starts with {magic!r}, "
                     f"expected b'GGUF')")
  try:
    reader = _gguf().GGUFReader(path)
  except (ValueError, IndexError, OSError) as e:
    raise ValueError(f"GGUF file {path!r} is truncated or corrupt ({e}); "
                     f"download or assemble it again") from None
  size = os.path.getsize(path)
  for t in reader.tensors:
    if t.data_offset + t.n_bytes > size:
      raise ValueError(f"GGUF file {path!r} is truncated: tensor '{t.name}' "
                       f"ends at byte {t.data_offset + t.n_bytes}, the file "
                       f"has {size}; download or assemble it again")
  return reader


def _field(reader, key: str, default=None):
  f = reader.fields.get(key)
  if f is None:
    return default
  return f.contents()


def architecture(reader) -> str:
  arch = _field(reader, "general.architecture")
  if arch not in ARCHITECTURES:
    raise ValueError(f"GGUF architecture {arch!r} is not supported; "
                     f"supported: {', '.join(ARCHITECTURES)}")
  return arch


def config_from_gguf(reader, preset: str | None = None) -> GemmaConfig:
  """GemmaConfig from the file's metadata, the rest from a Gemma 3 preset.

  Args:
    reader: a GGUFReader (:func:`open_gguf`).
    preset: preset supplying the local:global pattern, local RoPE base and
      query scaling (None: the ``gemma3_*`` preset with the file's
      number of layers and width, else the 5:1 Gemma 3 defaults).
  """
  arch = architecture(reader)
  get = lambda k, d=None: _field(reader, f"{arch}.{k}", d)  # noqa: E731
  n_layers, d = int(get("block_count")), int(get("embedding_length"))
  if preset is None:
    preset = next((n for n, c in models.PRESETS.items()
                   if n.startswith("gemma3_") and c.num_layers == n_layers
                   and c.d_model == d), "gemma3_tiny")
  base = models.PRESETS[preset]
  if base.num_layers != n_layers:  # the Gemma 3 pattern for this depth
    base = dataclasses.replace(base, num_layers=n_layers, attention_types=tuple(
        "global" if (i + 1) % 6 == 0 else "local" for i in range(n_layers)))
  emb = next((t for t in reader.tensors if t.name == "token_embd.weight"),
             None)
  if emb is None:
    raise ValueError("GGUF file has no 'token_embd.weight' tensor")
  heads = int(get("attention.head_count"))
  kw = dict(
      vocab_size=int(emb.shape[-1]), d_model=d, num_layers=n_layers,
      num_heads=heads, num_kv_heads=int(get("attention.head_count_kv", heads)),
      head_dim=int(get("attention.key_length", d // heads)),
      mlp_dim=int(get("feed_forward_length")),
      norm_eps=float(f"{get('attention.layer_norm_rms_epsilon', 1e-6):.6g}"),
      rope_base=float(get("rope.freq_base", base.rope_base)),
      local_rope_base=float(get("rope.freq_base_swa", base.local_rope_base)),
      sliding_window=int(get("attention.sliding_window", base.sliding_window)),
      rope_scale_factor=float(get("rope.scaling.factor", 1.0) or 1.0),
      pad_id=int(_field(reader, "tokenizer.ggml.padding_token_id", 0)),
      eos_id=int(_field(reader, "tokenizer.ggml.eos_token_id", 1)),
      bos_id=int(_field(reader, "tokenizer.ggml.bos_token_id", 2)))
  if kw["head_dim"] != base.head_dim:
    kw["query_pre_attn_scalar"] = float(kw["head_dim"])
  return dataclasses.replace(base, **kw)


def _hf_name(name: str) -> str | None:
  """GGUF tensor name -> HF Gemma 3 name (None: unknown)."""
  if name == "token_embd.weight":
    return "model.embed_tokens.weight"
  if name == "output_norm.weight":
    return "model.norm.weight"
  parts = name.split(".")
  if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and \
      parts[2] in _LAYER_NAMES:
    return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.weight"
  return None


def _check_type(tensor) -> None:
  kind = tensor.tensor_type.name
  if kind not in SUPPORTED_TYPES:
    raise ValueError(f"GGUF tensor '{tensor.name}' has type {kind}, which is "
                     f"not supported; supported: {', '.join(SUPPORTED_TYPES)}")


def dequantize(tensor) -> np.ndarray:
  """One GGUF tensor -> float32 numpy array in row-major (HF) order."""
  _check_type(tensor)
  w = _gguf().quants.dequantize(tensor.data, tensor.tensor_type)
  w = np.asarray(w, np.float32).reshape(
      tuple(int(n) for n in reversed(tensor.shape)))
  if tensor.name.endswith("norm.weight"):
    w = w - 1.0  # the converter stores 1 + w
  return w


class _HFView:
  """HF-named, lazily dequantized view of a GGUF file's tensors."""

  def __init__(self, reader, vocab_size: int):
    self.tensors = {}
    for t in reader.tensors:
      hf = _hf_name(t.name)
      if hf is None:
        raise ValueError(f"GGUF tensor '{t.name}' is not part of a Gemma 3 "
                         f"text decoder; the file is not a supported model")
      _check_type(t)
      self.tensors[hf] = t
    self.vocab_size = vocab_size

  def __contains__(self, name):
    return name in self.tensors

  def __getitem__(self, name):
    w = dequantize(self.tensors[name])
    if name == "model.embed_tokens.weight" and w.shape[0] < self.vocab_size:
      w = np.pad(w, ((0, self.vocab_size - w.shape[0]), (0, 0)))  # trimmed
    return w


def load_gguf(path: str, model=None, *, dtype="bfloat16",
              sharding: leaves_lib.ShardingArg = None,
              progress: bool | None = None, sha256: str | None = None):
  """Loads a Gemma 3 GGUF file (see the module docstring).

  Args:
    path: the .gguf file.
    model: None (config from the file + preset), a preset name or a
      GemmaModel; its config must match the file's (a larger vocabulary is
      allowed: the extra embedding rows are zero).
    dtype: dtype of the restored leaves ('bfloat16', 'float32').
    sharding: None, a Sharding, or fn(path, shape) -> Sharding.
    progress: progress bar (None: automatic above ~200 MB).
    sha256: expected SHA-256 of the file (None: not checked).

  Returns:
    (GemmaModel, params).
  """
  reader = open_gguf(path, sha256)
  model = leaves_lib.resolve_model(model)
  cfg = config_from_gguf(reader)
  if model is not None:
    if not isinstance(model, GemmaModel):
      raise ValueError(f"GGUF file {path!r} holds a Gemma 3 model, got a "
                       f"{type(model).__name__}")
    for key in ("d_model", "num_layers", "num_heads", "num_kv_heads",
                "head_dim", "mlp_dim", "sliding_window", "rope_base"):
      if getattr(model.config, key) != getattr(cfg, key):
        raise ValueError(f"model config does not match GGUF file {path!r}: "
                         f"{key}={getattr(model.config, key)!r} in the model, "
                         f"{getattr(cfg, key)!r} in the file; pass model=None "
                         f"to use the file's config")
    if model.config.vocab_size < cfg.vocab_size:
      raise ValueError(f"model vocab_size {model.config.vocab_size} is smaller "
                       f"than the file's {cfg.vocab_size} embedding rows")
    cfg = model.config
  else:
    model = GemmaModel(cfg)
  view = _HFView(reader, cfg.vocab_size)
  expected = models.flatten_params(model.param_shapes())
  rules = hf_gemma.gemma_rules_from_hf(cfg)
  used = {n for _, names, _ in rules for n in names}
  extra = [view.tensors[n].name for n in view.tensors if n not in used]
  if extra:
    raise ValueError(f"GGUF file {path!r} has {len(extra)} unexpected "
                     f"tensor(s), first: '{extra[0]}'; it is not a Gemma 3 "
                     f"model with {cfg.num_layers} layers")
  leaves = []
  for dest, names, fn in rules:
    missing = [n for n in names if n not in view]
    if missing:
      raise ValueError(f"GGUF file {path!r} lacks the tensor for "
                       f"'{missing[0]}' (needed for '{dest}')")
    leaves.append(leaves_lib.Leaf(
        path=dest, shape=tuple(expected[dest].shape), dtype=np.float32,
        read=lambda dt, index, fn=fn, names=names: fn(
            *(view[n] for n in names)),
        source=f"GGUF tensor(s) for {', '.join(names)}"))
  return model, leaves_lib.restore(leaves, model, dtype=dtype, sharding=sharding,
                               progress=progress, source=path)


def tokenizer_proto(reader) -> bytes:
  """The SentencePiece model (serialized) rebuilt from ``tokenizer.ggml.*``.

  Gemma's vocabulary is a SentencePiece BPE model with byte fallback, digits
  split, no dummy prefix and no normalization; GGUF keeps its pieces, scores
  and piece types (the same numbering as SentencePiece's).
  """
  from sentencepiece import sentencepiece_model_pb2 as pb  # pylint: disable=g-import-not-at-top
  kind = _field(reader, "tokenizer.ggml.model")
  if kind != "llama":
    raise ValueError(f"GGUF tokenizer model {kind!r} is not a SentencePiece "
                     f"vocabulary (expected 'llama')")
  tokens = _field(reader, "tokenizer.ggml.tokens")
  scores = _field(reader, "tokenizer.ggml.scores")
  types = _field(reader, "tokenizer.ggml.token_type")
  proto = pb.ModelProto()
  for piece, score, kind in zip(tokens, scores, types):
    p = proto.pieces.add()
    p.piece, p.score, p.type = piece, float(score), int(kind)
  spec = proto.trainer_spec
  spec.model_type = pb.TrainerSpec.BPE
  spec.vocab_size = len(tokens)
  spec.byte_fallback = True
  spec.split_digits = True
  spec.allow_whitespace_only_pieces = True
  spec.unk_id = int(_field(reader, "tokenizer.ggml.unknown_token_id", 3))
  spec.bos_id = int(_field(reader, "tokenizer.ggml.bos_token_id", 2))
  spec.eos_id = int(_field(reader, "tokenizer.ggml.eos_token_id", 1))
  spec.pad_id = int(_field(reader, "tokenizer.ggml.padding_token_id", 0))
  spec.unk_piece, spec.bos_piece = tokens[spec.unk_id], tokens[spec.bos_id]
  spec.eos_piece, spec.pad_piece = tokens[spec.eos_id], tokens[spec.pad_id]
  # llama.cpp's converter marks <unk> as a control piece; SentencePiece needs
  # exactly one UNKNOWN piece.
  proto.pieces[spec.unk_id].type = pb.ModelProto.SentencePiece.UNKNOWN
  norm = proto.normalizer_spec
  norm.name = "identity"
  norm.add_dummy_prefix = bool(_field(reader, "tokenizer.ggml.add_space_prefix",
                                      False))
  norm.remove_extra_whitespaces = False
  norm.escape_whitespaces = True
  return proto.SerializeToString()


def main(argv) -> int:
  """``python -m specdec_jax.checkpoints.gguf tokenizer IN.gguf OUT.model``."""
  if len(argv) != 4 or argv[1] != "tokenizer":
    print(f"usage: {argv[0]} tokenizer MODEL.gguf OUT.model", file=sys.stderr)
    return 2
  with open(argv[3], "wb") as f:  # what tokenizer.from_gguf(IN).save writes
    f.write(tokenizer_proto(open_gguf(argv[2])))
  print(f"wrote {argv[3]}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
