"""Static shape and data of a hierarchy: buffers, the in-flight batches.

See ``loop.py`` for the algorithm.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax

from specdec_jax.decoding import budget
from specdec_jax.decoding.loops.state import Stream
from specdec_jax.models.interface import check_decode_model
from specdec_jax.decoding.rules.knobs import Static


@dataclasses.dataclass(frozen=True)
class StackShape:
  """Static shape of a hierarchy (part of the compile key); built from a
  ``decoding.Stack`` by ``request.py``.

  Attributes:
    buffers: (T_0, ..., T_{K-1}) buffer sizes, each >= 1.
    lenient: per intermediate level n = 1..K-1, the static half of a
      cascade target it verifies with (None: exact, SpecDecode); its knobs
      travel in ``Batch.structure`` (a ``StackKnobs``).
  """

  buffers: tuple[int, ...]
  lenient: tuple[Static | None, ...] = ()

  def __post_init__(self):
    object.__setattr__(self, "buffers", tuple(int(t) for t in self.buffers))
    lenient = tuple(self.lenient) or (None,) * (len(self.buffers) - 1)
    object.__setattr__(self, "lenient", lenient)

  @property
  def depth(self) -> int:
    """K: the index of the top level (number of models - 1)."""
    return len(self.buffers)

  def bound(self, n: int) -> int:
    """B_n: the most tokens level n's batch can hold."""
    return self.buffers[0] if n == 0 else self.buffers[n] + self.bound(n - 1)

  @property
  def lag(self) -> int:
    """Most context tokens a level can lag behind (one per level above it,
    one of its own) plus one of margin."""
    return self.depth + 2

  def context_width(self, prompt_width: int, max_new: int) -> int:
    """Slots of ``ctx`` and of every cache."""
    return budget.capacity(prompt_width, max_new,
                           self.bound(self.depth - 1) + self.lag)


def check_levels(levels, buffers) -> tuple[tuple, tuple, tuple[int, ...]]:
  """(models, params, buffers) of a stack; ValueError for a bad stack."""
  levels = list(levels)
  if len(levels) < 2:
    raise ValueError(f"a hierarchy needs at least two levels (a drafter and "
                     f"the target), got {len(levels)}")
  for i, lv in enumerate(levels):
    if not (isinstance(lv, (tuple, list)) and len(lv) == 2):
      raise ValueError(f"levels[{i}] must be a (model, params) pair, got "
                       f"{type(lv).__name__}")
  models = tuple(m for m, _ in levels)
  for i, m in enumerate(models):
    check_decode_model(m, f"level {i}")
  for i, m in enumerate(models[1:], 1):
    if m.vocab_size != models[0].vocab_size:
      raise ValueError(
          f"level {i} has a vocabulary of {m.vocab_size} ids but level 0 has "
          f"{models[0].vocab_size}: every level must share the tokenizer "
          f"(speculative sampling compares distributions token by token)")
    if m.is_encoder_decoder != models[0].is_encoder_decoder:
      raise ValueError(f"level {i} and level 0 must both be encoder-decoder "
                       f"or both decoder-only")
  buffers = list(buffers)
  if len(buffers) != len(levels) - 1:
    raise ValueError(f"{len(levels)} levels need {len(levels) - 1} buffer "
                     f"sizes (T_0 .. T_K-1), got {len(buffers)}: {buffers}")
  for i, t in enumerate(buffers):
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
      raise ValueError(f"buffer T_{i} must be an integer >= 1, got {t!r}")
  return models, tuple(p for _, p in levels), tuple(int(t) for t in buffers)


@struct.dataclass
class HState:
  """Outer loop state.

  Attributes:
    stream: the emitted token stream.
    levels: K + 1 levels (cheapest first): caches and counters.
    ctx: [B, C] int32 prompt, emitted tokens, then the in-flight batch.
  """

  stream: Stream
  levels: tuple
  ctx: jax.Array


@struct.dataclass
class Batchlet:
  """A level's batch: tokens sit in ``ctx`` at [start, start + count).

  Attributes:
    count: [B] int32 tokens in the batch.
    props: [B, B_n, V] distribution each token was drawn from (transformed).
    logits: [B, B_n, V] the level's own logits before each token (unscaled
      q for a cascade target above).
    finite: [B] bool, False when a level at or below this one met a
      NaN/inf logit while making the batch.
  """

  count: jax.Array
  props: jax.Array
  logits: jax.Array
  finite: jax.Array


def put(ctx, pos, tok, active):
  """ctx[b, pos[b]] = tok[b] on active rows."""
  new = jax.vmap(lambda c, t, p: lax.dynamic_update_index_in_dim(
      c, t, p, 0))(ctx, tok.astype(ctx.dtype), pos)
  return jnp.where(active[:, None], new, ctx)


def window(ctx, start, width: int):
  """[B, width] tokens ctx[b, start[b] : start[b] + width]."""
  return jax.vmap(lambda c, s: lax.dynamic_slice_in_dim(c, s, width))(
      ctx, start)


def take_rows(x, first, count: int):
  """[B, count, ...] rows x[b, first[b] + j] (clipped inside x)."""
  idx = jnp.clip(first[:, None] + jnp.arange(count)[None, :], 0,
                 x.shape[1] - 1)
  return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (
      x.ndim - 2)), axis=1)
