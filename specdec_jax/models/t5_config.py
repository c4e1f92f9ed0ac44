"""T5 v1.1 hyperparameters and the published sizes."""

from __future__ import annotations

import dataclasses

from specdec_jax.models.layers import dtype_of


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Hyperparameters of a T5 v1.1 model.

  Attributes:
    vocab_size: embedding rows (32128 for the public checkpoints: 32100
      SentencePiece ids padded to a multiple of 128).
    d_model: hidden size.
    num_heads: attention heads.
    head_dim: size of each head (64 for every public size).
    num_encoder_layers: encoder blocks.
    num_decoder_layers: decoder blocks.
    mlp_dim: hidden size of the gated-GELU MLP.
    relpos_buckets: relative position buckets.
    relpos_max_distance: distance beyond which buckets saturate.
    layer_norm_eps: RMSNorm epsilon.
    dtype: compute dtype ('float32' or 'bfloat16').
    param_dtype: parameter storage dtype.
    pad_id: padding id (also the decoder start token).
    eos_id: end-of-sequence id.
    decoder_start_id: first decoder input token.
  """

  vocab_size: int = 32128
  d_model: int = 512
  num_heads: int = 6
  head_dim: int = 64
  num_encoder_layers: int = 8
  num_decoder_layers: int = 8
  mlp_dim: int = 1024
  relpos_buckets: int = 32
  relpos_max_distance: int = 128
  layer_norm_eps: float = 1e-6
  dtype: str = "float32"
  param_dtype: str = "float32"
  pad_id: int = 0
  eos_id: int = 1
  decoder_start_id: int = 0

  def __post_init__(self):
    for field in ("vocab_size", "d_model", "num_heads", "head_dim",
                  "num_encoder_layers", "num_decoder_layers", "mlp_dim",
                  "relpos_buckets", "relpos_max_distance"):
      if int(getattr(self, field)) < 1:
        raise ValueError(f"T5Config.{field} must be >= 1, got "
                         f"{getattr(self, field)}")
    if self.relpos_buckets % 2:
      raise ValueError("T5Config.relpos_buckets must be even, got "
                       f"{self.relpos_buckets}")
    dtype_of(self.dtype)
    dtype_of(self.param_dtype)


# Published T5 v1.1 sizes (t5x/examples/t5/t5_1_1/*.gin).
T5_PRESETS: dict[str, T5Config] = {
    "t5_1_1_small": T5Config(d_model=512, num_heads=6, num_encoder_layers=8,
                             num_decoder_layers=8, mlp_dim=1024),
    "t5_1_1_base": T5Config(d_model=768, num_heads=12, num_encoder_layers=12,
                            num_decoder_layers=12, mlp_dim=2048),
    "t5_1_1_large": T5Config(d_model=1024, num_heads=16, num_encoder_layers=24,
                             num_decoder_layers=24, mlp_dim=2816),
    "t5_1_1_xl": T5Config(d_model=2048, num_heads=32, num_encoder_layers=24,
                          num_decoder_layers=24, mlp_dim=5120),
    "t5_1_1_xxl": T5Config(d_model=4096, num_heads=64, num_encoder_layers=24,
                           num_decoder_layers=24, mlp_dim=10240),
    # Tiny config for tests (random weights).
    "t5_tiny": T5Config(vocab_size=64, d_model=32, num_heads=4, head_dim=8,
                        num_encoder_layers=2, num_decoder_layers=2, mlp_dim=64,
                        relpos_buckets=8, relpos_max_distance=16),
}
