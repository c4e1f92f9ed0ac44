"""The chain draft phase: the drafter fills a [batch, gamma] block.

Drafter catch-up: when all gamma drafts of a row were accepted and the target
does not need the drafter's distribution at the bonus position, the drafter
never saw the last draft; the next draft phase then starts with a 2-token
block ``[last_draft, pending]`` (otherwise ``[pending, pad]`` with one valid
token). Targets that do need it (every target but SpecDecode) run the drafter
one extra step, which also caches the last draft.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from specdec_jax.decoding.rules import keys as keys_lib
from specdec_jax.decoding.rules import sampling
from specdec_jax.decoding.loops.state import LoopConfig, Request, Stream
from specdec_jax.models.cache import KVCache


@struct.dataclass
class FallbackStop:
  """BiLD's fallback policy: stop drafting when the drafter is unsure.

  Drafting of a row stops at the first position whose unscaled drafter
  confidence ``max q`` is below ``alpha``; drafts from there on are not
  proposed (the verifier produces that token). The draft loop exits as soon
  as every row has stopped, so at batch 1 the draft window is dynamic.

  Attributes:
    alpha: [] or [B] fallback threshold alpha_FB in [0, 1].
  """

  alpha: jax.Array = 0.5


@struct.dataclass
class ChainDraft:
  """Output of one chain draft phase.

  Attributes:
    drafts: [B, gamma] int32 drafted tokens.
    logits: [B, gamma + 1, V] drafter logits (the last row only when the
      drafter ran at the bonus position).
    cache: the drafter's KVCache after drafting.
    limit: [B] int32 confident drafts (BiLD's fallback), or None.
    calls: [] int32 drafter calls made.
  """

  drafts: jax.Array
  logits: jax.Array
  cache: KVCache
  limit: jax.Array | None
  calls: jax.Array


def catch_up_block(drafter, q_params, cache: KVCache, pending, catchup, cv,
                   pad_id: int):
  """The draft phase's first drafter call as ONE 2-token block per row
  (chains, and trees that catch the drafter up: ``tree_drafting.py``).

  Rows that lag (``cv`` [B]) feed ``[catchup, pending]`` and read q after
  ``pending``; the others feed ``[pending, pad]`` and read q after
  ``pending`` (the pad's cache slot lies past the row's length: never
  attended to, overwritten by the next write). The same call a
  ``lax.cond`` on "any row lags" takes, without the cond: XLA:CPU copies
  the drafter's cache through a conditional's branches every iteration, a
  cost that grows with the cache (default Gemma pair, 205-token prompts:
  0.27 ms of a 1.9 ms iteration at batch 1, 0.7 ms of 9.1 at batch 8; not
  measurable with 40-token prompts), while the second block position
  costs next to nothing.

  Returns:
    ([B, V] q logits after ``pending``, the drafter's cache).
  """
  lag = cv.astype(jnp.int32)  # [B]
  first = jnp.where(cv[:, None], jnp.stack([catchup, pending], 1),
                    jnp.stack([pending, jnp.full_like(pending, pad_id)],
                              1))  # [B, 2]
  logits, new = drafter.step(q_params, first, cache, logits_at=lag)
  return logits[:, 0], new.with_lengths(cache.lengths + 1 + lag)


def draft_chain(drafter, q_params, cache: KVCache, stream: Stream,
                catchup: jax.Array, catchup_valid: jax.Array, strategy,
                req: Request, cfg: LoopConfig, extra: bool,
                stop: FallbackStop | None) -> ChainDraft:
  """Drafts gamma tokens per row (plus q at the bonus position if ``extra``).

  Args:
    drafter, q_params: the drafter model and its parameters.
    cache: the drafter's KVCache (pending not yet fed).
    stream: the emitted stream (pending [B] is fed first; num_out [B] is
      the first draft's output position; done rows are frozen).
    catchup, catchup_valid: [B] last accepted draft the drafter has not
      cached, and whether it must be fed first.
    strategy: sampling transform S.
    req: per-row Request (keys).
    cfg: LoopConfig (gamma = the chain length, pad_id).
    extra: run the drafter at the bonus position too.
    stop: BiLD's fallback stop, or None.
  """
  pending, done, num_out = stream.pending, stream.done, stream.num_out
  gamma, pad_id = cfg.gamma, cfg.pad_id
  b = pending.shape[0]
  cv = catchup_valid & ~done  # [B]

  def plain(_):
    logits, new = drafter.step(q_params, pending[:, None], cache)
    return logits[:, 0], new

  def lagging(_):
    return catch_up_block(drafter, q_params, cache, pending, catchup, cv,
                          pad_id)

  if extra:  # the drafter ran at the bonus position: no row ever lags
    l0, cache = plain(None)  # [B, V]
  elif sampling.LEAN:
    l0, cache = lagging(None)
  else:  # the reference: a cond on "some row lags"
    l0, cache = lax.cond(jnp.any(cv), lagging, plain, None)
  v = l0.shape[-1]
  q_buf = jnp.zeros((b, gamma + 1, v), jnp.float32).at[:, 0].set(l0)
  drafts = jnp.zeros((b, gamma), jnp.int32)
  feeds = gamma - 1 + int(extra)

  def draw(logits, j):  # [B, V] -> [B]; keys only when some row samples
    return sampling.draw(lambda: keys_lib.row_keys(
        req.seed, req.request_id, num_out + j, keys_lib.DRAFT), logits,
                         strategy)

  def still_drafting(q_buf, j):  # [B] bool
    if stop is None:
      return jnp.ones((b,), bool)
    conf = jnp.max(sampling.unscaled(q_buf[:, j]), axis=-1)
    return conf >= sampling.per_row(stop.alpha, 1)

  def cond(carry):
    j, _, _, _, live = carry
    return (j < feeds) & jnp.any(live & ~done)

  def body(carry):
    j, cache, q_buf, drafts, live = carry
    d = draw(lax.dynamic_index_in_dim(q_buf, j, 1, keepdims=False), j)  # [B]
    drafts = lax.dynamic_update_index_in_dim(drafts, d, jnp.minimum(
        j, gamma - 1), 1)
    logits, cache = drafter.step(q_params, d[:, None], cache)  # [B, 1, V]
    q_buf = lax.dynamic_update_index_in_dim(q_buf, logits[:, 0], j + 1, 1)
    live = live & still_drafting(q_buf, j + 1)
    return j + 1, cache, q_buf, drafts, live

  live0 = still_drafting(q_buf, 0)
  j, cache, q_buf, drafts, _ = lax.while_loop(
      cond, body, (jnp.int32(0), cache, q_buf, drafts, live0))
  if not extra:  # the last draft comes from q_{gamma-1}, never fed
    drafts = drafts.at[:, gamma - 1].set(draw(q_buf[:, gamma - 1], gamma - 1))
  limit = None
  if stop is not None:
    conf = jnp.max(sampling.unscaled(q_buf[:, :gamma]), axis=-1)  # [B, g]
    unsure = conf < sampling.per_row(stop.alpha, 2)
    limit = jnp.where(jnp.any(unsure, 1), jnp.argmax(unsure, 1), gamma)
  return ChainDraft(drafts=drafts, logits=q_buf, cache=cache, limit=limit,
                    calls=j + 1)
