"""Gemma 1 / 2 / 3 hyperparameters and the published sizes."""

from __future__ import annotations

import dataclasses

from specdec_jax.models.layers import dtype_of

GLOBAL = "global"
LOCAL = "local"


@dataclasses.dataclass(frozen=True)
class GemmaConfig:
  """Hyperparameters of a Gemma 1 / 2 / 3 model (Gemma 3: text decoder).

  Attributes:
    vocab_size: embedding rows (256128 for the public checkpoints).
    d_model: embedding / residual width.
    num_layers: transformer blocks.
    num_heads: query heads.
    num_kv_heads: key/value heads (1 = MQA, < heads = GQA).
    head_dim: size of each head.
    mlp_dim: hidden size of the GeGLU MLP.
    attention_types: per-layer 'global' or 'local' (sliding window); its
      length must equal num_layers.
    sliding_window: window of the local layers (4096 for Gemma 2).
    query_pre_attn_scalar: queries are multiplied by this ** -0.5
      (head_dim for all but Gemma 2 27B, where it is d_model / num_heads).
    attn_logit_softcap: Gemma 2: 50.0; None disables.
    final_logit_softcap: Gemma 2: 30.0; None disables.
    use_post_attn_norm: Gemma 2 post-attention norm.
    use_post_ffw_norm: Gemma 2 post-FFW norm.
    transpose_gating_einsum: the official checkpoint stores the gating kernel
      as [2, mlp, d] (9B / 27B) instead of [2, d, mlp]; only the checkpoint
      reader uses it (our own layout is the same for every size).
    use_qk_norm: Gemma 3 RMSNorm of queries and keys over head_dim (before
      RoPE).
    rope_base: RoPE base frequency (of the global layers when
      local_rope_base is set).
    local_rope_base: Gemma 3: RoPE base of the local layers (10k); None:
      rope_base everywhere.
    rope_scale_factor: linear RoPE scaling of the global layers (positions
      are divided by it; Gemma 3 4B/12B/27B: 8).
    norm_eps: RMSNorm epsilon.
    dtype: compute dtype.
    param_dtype: parameter dtype.
    pad_id, eos_id, bos_id: special ids of the Gemma tokenizer.
  """

  vocab_size: int = 256128
  d_model: int = 2048
  num_layers: int = 18
  num_heads: int = 8
  num_kv_heads: int = 1
  head_dim: int = 256
  mlp_dim: int = 16384
  attention_types: tuple[str, ...] = ()
  sliding_window: int | None = None
  query_pre_attn_scalar: float | None = None
  attn_logit_softcap: float | None = None
  final_logit_softcap: float | None = None
  use_post_attn_norm: bool = False
  use_post_ffw_norm: bool = False
  transpose_gating_einsum: bool = False
  use_qk_norm: bool = False
  rope_base: float = 10_000.0
  local_rope_base: float | None = None
  rope_scale_factor: float = 1.0
  norm_eps: float = 1e-6
  dtype: str = "float32"
  param_dtype: str = "float32"
  pad_id: int = 0
  eos_id: int = 1
  bos_id: int = 2

  def __post_init__(self):
    for field in ("vocab_size", "d_model", "num_layers", "num_heads",
                  "num_kv_heads", "head_dim", "mlp_dim"):
      if int(getattr(self, field)) < 1:
        raise ValueError(f"GemmaConfig.{field} must be >= 1, got "
                         f"{getattr(self, field)}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of "
                       f"num_kv_heads ({self.num_kv_heads})")
    if not self.attention_types:
      object.__setattr__(self, "attention_types", (GLOBAL,) * self.num_layers)
    if len(self.attention_types) != self.num_layers:
      raise ValueError(f"attention_types has {len(self.attention_types)} "
                       f"entries, expected num_layers={self.num_layers}")
    bad = [t for t in self.attention_types if t not in (GLOBAL, LOCAL)]
    if bad:
      raise ValueError(f"attention_types entries must be 'global' or 'local', "
                       f"got {bad[0]!r}")
    if LOCAL in self.attention_types and not self.sliding_window:
      raise ValueError("local attention layers need sliding_window >= 1")
    if self.query_pre_attn_scalar is None:
      object.__setattr__(self, "query_pre_attn_scalar", float(self.head_dim))
    if self.rope_scale_factor <= 0:
      raise ValueError(f"rope_scale_factor must be > 0, got "
                       f"{self.rope_scale_factor}")
    dtype_of(self.dtype)
    dtype_of(self.param_dtype)

  def window(self, layer: int) -> int | None:
    """Sliding window of ``layer`` (None for global layers)."""
    return self.sliding_window if self.attention_types[layer] == LOCAL else None

  def rope(self, layer: int) -> tuple[float, float]:
    """(RoPE base, linear scale factor) of ``layer``."""
    if self.attention_types[layer] == LOCAL and self.local_rope_base:
      return float(self.local_rope_base), 1.0
    return float(self.rope_base), float(self.rope_scale_factor)


def _gemma2(num_layers, **kw) -> GemmaConfig:
  return GemmaConfig(
      num_layers=num_layers,
      attention_types=(LOCAL, GLOBAL) * (num_layers // 2),
      sliding_window=kw.pop("sliding_window", 4096), attn_logit_softcap=50.0,
      final_logit_softcap=30.0, use_post_attn_norm=True,
      use_post_ffw_norm=True, **kw)


def _gemma3(num_layers, **kw) -> GemmaConfig:
  """Gemma 3 text decoder: 5 local : 1 global, QK-norm, no soft caps."""
  return GemmaConfig(
      num_layers=num_layers, vocab_size=kw.pop("vocab_size", 262_144),
      attention_types=tuple(GLOBAL if (i + 1) % 6 == 0 else LOCAL
                            for i in range(num_layers)),
      sliding_window=kw.pop("sliding_window", 1024), use_qk_norm=True,
      use_post_attn_norm=True, use_post_ffw_norm=True,
      rope_base=1_000_000.0, local_rope_base=10_000.0,
      rope_scale_factor=kw.pop("rope_scale_factor", 8.0), **kw)


# Published hyperparameters (google-deepmind/gemma transformer configs).
GEMMA_PRESETS: dict[str, GemmaConfig] = {
    "gemma_2b": GemmaConfig(d_model=2048, num_layers=18, num_heads=8,
                            num_kv_heads=1, head_dim=256, mlp_dim=16384),
    "gemma_7b": GemmaConfig(d_model=3072, num_layers=28, num_heads=16,
                            num_kv_heads=16, head_dim=256, mlp_dim=24576),
    "gemma2_2b": _gemma2(26, d_model=2304, num_heads=8, num_kv_heads=4,
                         head_dim=256, mlp_dim=9216),
    "gemma2_9b": _gemma2(42, d_model=3584, num_heads=16, num_kv_heads=8,
                         head_dim=256, mlp_dim=14336,
                         transpose_gating_einsum=True),
    "gemma2_27b": _gemma2(46, d_model=4608, num_heads=32, num_kv_heads=16,
                          head_dim=128, mlp_dim=36864,
                          query_pre_attn_scalar=4608 / 32,
                          transpose_gating_einsum=True),
    # Gemma 3 text decoders (HF google/gemma-3-*; 4B+ without the vision
    # tower).
    "gemma3_270m": _gemma3(18, d_model=640, num_heads=4, num_kv_heads=1,
                           head_dim=256, mlp_dim=2048, sliding_window=512,
                           rope_scale_factor=1.0),
    "gemma3_1b": _gemma3(26, d_model=1152, num_heads=4, num_kv_heads=1,
                         head_dim=256, mlp_dim=6912, sliding_window=512,
                         rope_scale_factor=1.0),
    "gemma3_4b": _gemma3(34, d_model=2560, num_heads=8, num_kv_heads=4,
                         head_dim=256, mlp_dim=10240),
    "gemma3_12b": _gemma3(48, d_model=3840, num_heads=16, num_kv_heads=8,
                          head_dim=256, mlp_dim=15360),
    "gemma3_27b": _gemma3(62, d_model=5376, num_heads=32, num_kv_heads=16,
                          head_dim=128, mlp_dim=21504,
                          query_pre_attn_scalar=5376 / 32),
    # Tiny configs for tests (random weights).
    "gemma_tiny": GemmaConfig(vocab_size=64, d_model=32, num_layers=2,
                              num_heads=4, num_kv_heads=1, head_dim=8,
                              mlp_dim=64),
    "gemma2_tiny": _gemma2(2, vocab_size=64, d_model=32, num_heads=4,
                           num_kv_heads=2, head_dim=8, mlp_dim=64,
                           sliding_window=4),
    "gemma3_tiny": _gemma3(6, vocab_size=64, d_model=32, num_heads=4,
                           num_kv_heads=2, head_dim=8, mlp_dim=64,
                           sliding_window=4, rope_scale_factor=2.0),
}
