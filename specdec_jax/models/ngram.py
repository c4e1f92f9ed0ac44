"""A parameter-free drafter: prompt lookup / n-gram matching.

:class:`NgramModel` implements the decode interface (``interface.py``) for
any verifier vocabulary. Its "cache" holds the token ids seen so far (prompt +
output, one id per slot, stored in a ``KVCache`` so rollbacks and tree commits
work unchanged). For a node whose context is ``x[0..t]`` it looks for the most
recent earlier occurrence of the context's last n tokens, for n in ``ns``
(longest first), and proposes the token that followed it:

    context  [7, 3, 9, 4, 7, 3]     ns (3, 2, 1)
    n=3: [9, 4, 7, 3]?  ... suffix [4, 7, 3] never occurred before: next n
    n=2: suffix [7, 3] occurred at positions 0-1, followed by 9 -> propose 9

With ``spread=False`` (chains) the distribution is one-hot on that token;
with ``spread=True`` (trees) it spreads over the tokens that followed every
earlier occurrence of the longest matching suffix, in proportion to their
counts (the most recent occurrence breaks ties), so a tree's top-k branches
are the different continuations seen. Without any match it proposes the
last token again. Either way q is the distribution the verification rules
see, so every speculative method stays exact. The model has no parameters
(``init_params`` returns ``{}``) and its cost is a few vector compares, not a
network: a cost model should price it at zero.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specdec_jax.models.cache import KVCache, LayerKV, select_positions

# Logit of the tokens the drafter never proposes (softmax -> exactly 0).
_NEVER = -1e9


@dataclasses.dataclass(frozen=True)
class NgramModel:
  """Prompt-lookup drafter behind the decode interface.

  Attributes:
    vocab_size: the verifier's vocabulary size.
    ns: suffix lengths tried, longest first (e.g. (3, 2, 1)).
    spread: False: one-hot on the most recent match (chains); True: spread
      over the continuations of every match (trees).
    eos_id: stop token (the verifier's), or None.
  """

  vocab_size: int
  ns: tuple[int, ...] = (3, 2, 1)
  spread: bool = False
  eos_id: int | None = 1

  is_encoder_decoder = False
  masks_cached_slots = False

  def __post_init__(self):
    if int(self.vocab_size) < 1:
      raise ValueError(f"NgramModel.vocab_size must be >= 1, got "
                       f"{self.vocab_size}")
    ns = tuple(int(n) for n in self.ns)
    if not ns or min(ns) < 1:
      raise ValueError(f"NgramModel.ns must be a non-empty list of n >= 1, "
                       f"got {self.ns!r}")
    object.__setattr__(self, "ns", tuple(sorted(set(ns), reverse=True)))

  def init_params(self, rng=None) -> dict:
    """No parameters."""
    del rng
    return {}

  def num_params(self) -> int:
    return 0

  def param_shapes(self) -> dict:
    """No parameters (memory checks count none)."""
    return {}

  def init_cache(self, batch: int, max_length: int,
                 encoded=None) -> KVCache:
    """History of ``max_length`` slots per row ([B, T, 1, 1] token ids)."""
    if encoded is not None:
      raise ValueError("NgramModel is decoder-only: init_cache takes no "
                       "encoded input")
    ids = jnp.zeros((batch, max_length, 1, 1), jnp.float32)
    return KVCache(lengths=jnp.zeros((batch,), jnp.int32),
                   layers=(LayerKV(k=ids, v=ids),))

  def step(self, params, tokens: jax.Array, cache: KVCache, *,
           positions=None, mask=None, logits_at=None):
    """tokens [B, N] -> (logits [B, N|1|P, V] float32, cache advanced by N).

    Node i's context is the cached prefix ``[0, lengths)`` followed by the
    block tokens it may attend to (``mask``), placed at their positions.
    """
    del params
    b, n = tokens.shape
    t = cache.max_length
    lengths = cache.lengths
    if positions is None:
      positions = lengths[:, None] + jnp.arange(n, dtype=jnp.int32)
    if mask is None:
      mask = jnp.tril(jnp.ones((n, n), bool))[None].repeat(b, 0)
    hist = cache.layers[0].k[:, :, 0, 0].astype(jnp.int32)  # [B, T]
    slots = jnp.arange(t, dtype=jnp.int32)
    # ctx[b, i, p]: token at position p of node i's context.
    at = (positions[:, None, None, :] == slots[None, None, :, None]) & \
        mask[:, :, None, :]  # [B, N, T, N]
    from_block = jnp.einsum("BITJ,BJ->BIT", at.astype(jnp.int32), tokens)
    ctx = jnp.where(slots[None, None] < lengths[:, None, None],
                    hist[:, None, :], from_block)  # [B, N, T]
    end = positions  # [B, N] the node's own position
    logits = self._propose(ctx, end)  # [B, N, V]
    # Write the block at [lengths, lengths + N) like any model.
    block = jnp.where(
        (slots[None] >= lengths[:, None]) & (slots[None] < lengths[:, None] +
                                             n),
        jnp.take_along_axis(
            tokens, jnp.clip(slots[None] - lengths[:, None], 0, n - 1),
            axis=1), hist)
    ids = block.astype(jnp.float32)[:, :, None, None]
    cache = cache.replace(lengths=lengths + n,
                          layers=(LayerKV(k=ids, v=ids),))
    return select_positions(logits, logits_at), cache

  def _propose(self, ctx: jax.Array, end: jax.Array) -> jax.Array:
    """ctx [B, N, T] contexts ending at end [B, N] -> logits [B, N, V]."""
    t = ctx.shape[-1]
    s = jnp.arange(t, dtype=jnp.int32)  # candidate match end
    # suffix[b, i, o] = ctx[end - o]
    found = jnp.zeros(end.shape, bool)
    hits = jnp.zeros(ctx.shape, bool)  # [B, N, T] matches of the chosen n
    for n in self.ns:  # longest first
      ok = (s[None, None] >= n - 1) & (s[None, None] < end[..., None])
      for o in range(n):
        shifted = jnp.roll(ctx, o, axis=-1)  # [..., s] = ctx[s - o]
        want = jnp.take_along_axis(ctx, jnp.clip(end - o, 0, t - 1)[..., None],
                                   axis=-1)  # [B, N, 1]
        ok &= (shifted == want) & (end[..., None] - o >= 0)
      use = ok.any(-1) & ~found  # [B, N] first n that matches
      hits = jnp.where(use[..., None], ok, hits)
      found |= use
    follow = jnp.roll(ctx, -1, axis=-1)  # [..., s] = ctx[s + 1]
    last = jnp.take_along_axis(ctx, jnp.clip(end, 0, t - 1)[..., None],
                               axis=-1)[..., 0]  # [B, N]
    recent = jnp.max(jnp.where(hits, s, -1), axis=-1)  # [B, N]
    top = jnp.take_along_axis(follow, jnp.clip(recent, 0, t - 1)[..., None],
                              axis=-1)[..., 0]
    top = jnp.where(found, top, last)  # [B, N]
    if not self.spread:
      onehot = jax.nn.one_hot(top, self.vocab_size, dtype=jnp.float32)
      return jnp.where(onehot > 0, 0.0, _NEVER)
    # Counts of each continuation over all hits, + 0.5 for the most recent.
    counts = self._counts(hits, follow)
    counts = counts + 0.5 * jax.nn.one_hot(top, self.vocab_size,
                                           dtype=jnp.float32)
    return jnp.where(counts > 0, jnp.log(jnp.maximum(counts, 1e-30)), _NEVER)

  def _counts(self, hits, follow):
    """hits [B, N, T] x continuations follow [B, N, T] -> counts [B, N, V]."""
    b, n, _ = hits.shape
    out = jnp.zeros((b, n, self.vocab_size), jnp.float32)
    bi = jnp.arange(b)[:, None, None]
    ni = jnp.arange(n)[None, :, None]
    return out.at[bi, ni, follow].add(hits.astype(jnp.float32))

  def forward(self, params, tokens: jax.Array, inputs=None) -> jax.Array:
    """Uncached causal forward: tokens [B, T] -> logits [B, T, V]."""
    if inputs is not None:
      raise ValueError("NgramModel is decoder-only: forward takes no inputs=")
    b, t = tokens.shape
    cache = self.init_cache(b, t)
    return self.step(params, tokens, cache)[0]
