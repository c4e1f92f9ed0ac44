"""A t5x ``decode_fn`` for the single-model baselines (sampling and greedy).

:func:`temperature_sample` follows the keyword contract of t5x's
``models.DecodeFnCallable`` and the semantics of
``t5x.decoding.temperature_sample`` (shifted-right ``inputs`` whose non-zero
entries are teacher-forced, per-row loop indices from ``initial_index``,
``num_decodes`` expansion of the inputs and of every cache leaf, EOS detected
as an increase of the EOS count, padding after EOS, results sorted so that
``decodes[:, -1]`` is the best), with the sampling transforms of
``specdec_jax.decoding.rules.sampling`` (temperature, top-k, top-p; temperature 0 is
greedy) and per-row random keys: row ``r`` at loop index ``i`` draws with
``fold_in(fold_in(decode_rng, r), i)``, so a row's sample does not depend on
the other rows. Bind it in gin in place of t5x's sampler::

    from specdec_jax.t5x import decoding as sd_decoding
    models.EncoderDecoderModel.decode_fn = @sd_decoding.temperature_sample
    sd_decoding.temperature_sample.temperature = 0.0

Worked example (the first example of t5x's docstring; a test runs it)::

    inputs    = [0, 5, 6, 1, 0]    # shifted right; 5, 6, 1 are forced
    sequences = [0, 5, 6, 1, a, b, 0]   # 2 extra slots: BOS, garbage
    decodes   = [5, 6, 1, a, b]    # the forced EOS (1) does not end the row

The speculative methods do not fit this contract (a ``tokens_to_logits``
callable scores one token of one model); they run through
:mod:`specdec_jax.t5x.models` instead, and so do draft trees and
hierarchies (``tree=`` / ``hierarchy=`` of those Models): both need a
drafter and a verifier, which this contract does not provide.
"""

from __future__ import annotations

from typing import Callable, Mapping

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax

from specdec_jax.decoding.rules import sampling

try:  # Use t5x's own state class when t5x is importable.
  from t5x.decoding import DecodingState  # pylint: disable=g-import-not-at-top
except ImportError:

  @struct.dataclass
  class DecodingState:
    """What ``tokens_to_logits`` receives (same fields as t5x's class).

    Attributes:
      cur_index: [batch * num_decodes] int32 loop position of each row.
      sequences: [batch * num_decodes, max_decode_len] int32 prefixes.
      cur_token: [batch * num_decodes, 1] int32 current tokens.
      cache: the (expanded) attention cache, any pytree.
    """

    cur_index: jax.Array
    sequences: jax.Array
    cur_token: jax.Array
    cache: Mapping


# Temperatures at or below this are greedy (t5x's MIN_TEMPERATURE).
MIN_TEMPERATURE = 1e-4
# Cache leaves t5x never expands (cache_index only without initial_index).
_NOT_EXPANDED = ("cached_bias", "position_embedder_index")
# Extra sequence slots: the BOS at 0 and a garbage slot at the end.
_EXTRA = 2
# Top-k of "every token" (sampling.TopK clips k to the vocabulary size).
_ALL = 2**30


def flat_batch_expand(x: jax.Array, n: int, offset: int = 0) -> jax.Array:
  """Repeats each row ``n`` times in place: [e0, e1] -> [e0, e0, e1, e1].

  Same layout as ``t5x.decoding.flat_batch_beam_expand``.

  Args:
    x: array whose axis ``offset`` is the batch, [..., B, ...].
    n: copies of each row.
    offset: batch axis (1 for caches of scanned layers).

  Returns:
    [..., B * n, ...] array.
  """
  return jnp.repeat(x, n, axis=offset)


def _leaf_name(path) -> str:
  last = path[-1] if path else None
  for attr in ("key", "name", "idx"):
    if hasattr(last, attr):
      return str(getattr(last, attr))
  return ""


def expand_cache(cache, n: int, offset: int = 0,
                 apply_to_index: bool = False):
  """Expands every cache leaf for ``n`` decodes (t5x ``cache_map`` rules).

  ``cache_index`` leaves are expanded only when ``apply_to_index`` (a cache
  prefilled to per-row lengths has a [batch] index); ``cached_bias`` and
  ``position_embedder_index`` never are.

  Args:
    cache: any pytree (dict, FrozenDict or dataclass) of [B, ...] arrays.
    n: copies of each row.
    offset: batch axis of the cache leaves.
    apply_to_index: expand ``cache_index`` leaves too.

  Returns:
    The cache with the batch axis of each expanded leaf multiplied by ``n``.
  """
  skip = _NOT_EXPANDED + (() if apply_to_index else ("cache_index",))

  def fix(path, x):
    name = _leaf_name(path)
    if name in skip:
      return x
    if np.ndim(x) <= offset:
      where = jax.tree_util.keystr(path)
      raise ValueError(
          f"cache leaf {where} has shape {np.shape(x)} and no batch axis at "
          f"{offset} to expand for num_decodes; only 'cache_index', "
          f"'cached_bias' and 'position_embedder_index' may be scalars")
    return flat_batch_expand(x, n, offset)

  return jax.tree_util.tree_map_with_path(fix, cache)


@struct.dataclass
class DecodeLoopState:
  """State of the sampling loop (rows = batch * num_decodes = N).

  Attributes:
    step: [] int32 iterations done.
    cur_index: [N] int32 loop position of each row.
    sequences: [N, L + 2] int32 BOS, tokens, garbage slot.
    cache: the model cache returned by ``tokens_to_logits``.
    cur_token: [N, 1] int32 token fed at the next step.
    ended: [N] bool finished rows (they emit 0).
    log_prob: [N] float32 summed log-probabilities of sampled tokens.
  """

  step: jax.Array
  cur_index: jax.Array
  sequences: jax.Array
  cache: Mapping
  cur_token: jax.Array
  ended: jax.Array
  log_prob: jax.Array


def _is_tracer(x) -> bool:
  return isinstance(x, jax.core.Tracer)


def make_strategy(temperature, topk, topp, batch: int, num_decodes: int):
  """The sampling transform of t5x's (temperature, topk, topp) knobs.

  Args:
    temperature: [] or [batch] float; <= 1e-4 is greedy.
    topk: int; 0 keeps every token.
    topp: float; 0 keeps every token.
    batch: rows before expansion.
    num_decodes: decodes per row.

  Returns:
    A strategy of ``specdec_jax.decoding.rules.sampling`` whose knobs are
    [batch * num_decodes] arrays.

  Raises:
    ValueError for both top-k and top-p set, or bad values.
  """
  t = jnp.asarray(temperature, jnp.float32)
  if t.ndim not in (0, 1) or (t.ndim == 1 and t.shape[0] != batch):
    raise ValueError(f"temperature must be a scalar or one value per batch "
                     f"row ({batch},), got shape {t.shape}")
  if not _is_tracer(temperature):  # host check: works inside jit too
    tv = np.asarray(temperature, np.float64)
    if not np.all(np.isfinite(tv)) or np.any(tv < 0):
      raise ValueError(f"temperature must be a finite number >= 0 (0 = "
                       f"greedy), got {tv.tolist()}")
  t = jnp.broadcast_to(t, (batch,)) if t.ndim == 0 else t
  t = jnp.repeat(t, num_decodes)  # [B] -> [B * n]
  t = jnp.where(t > MIN_TEMPERATURE, t, 0.0)
  static_k = not _is_tracer(topk)
  static_p = not _is_tracer(topp)
  if static_k and static_p and topk and topp:
    raise ValueError(f"at most one of topk ({topk}) and topp ({topp}) may be "
                     f"non-zero")
  if not static_k and not static_p:
    raise ValueError("topk and topp cannot both be traced; pass one of them "
                     "as a Python number")
  if not static_k or topk:
    if static_k and (int(topk) != topk or topk < 0):
      raise ValueError(f"topk must be an integer >= 0, got {topk}")
    k = jnp.asarray(topk, jnp.int32)
    k = jnp.where(k > 0, k, _ALL)  # TopK clips k to the vocabulary size
    return sampling.TopK(k=jnp.broadcast_to(k, t.shape), temperature=t)
  if not static_p or topp:
    if static_p and not 0 < topp <= 1:
      raise ValueError(f"topp must be in [0, 1], got {topp}")
    p = jnp.asarray(topp, jnp.float32)
    p = jnp.where(p > 0, p, 1.0)
    return sampling.TopP(p=jnp.broadcast_to(p, t.shape), temperature=t)
  return sampling.Temperature(t)


def _row_keys(rng: jax.Array, cur_index: jax.Array) -> jax.Array:
  """[N] keys: fold_in(fold_in(rng, row), loop index)."""
  rows = jnp.arange(cur_index.shape[0], dtype=jnp.int32)
  one = lambda r, i: jax.random.fold_in(jax.random.fold_in(rng, r), i)
  return jax.vmap(one)(rows, cur_index)


def temperature_sample(
    *,
    inputs: jax.Array,
    cache: Mapping,
    tokens_to_logits: Callable[[DecodingState], tuple[jax.Array, Mapping]],
    eos_id: int,
    decode_rng: jax.Array | None = None,
    num_decodes: int = 1,
    temperature: float | jax.Array = 1.0,
    topk: int = 1,
    topp: float = 0.0,
    cache_offset: int = 0,
    initial_index: jax.Array | None = None,
    max_decode_steps: int | jax.Array | None = None,
    max_decode_steps_hard_limit: int | None = None,
    rescale_log_probs: bool = True,
) -> tuple[jax.Array, jax.Array]:
  """Samples ``num_decodes`` continuations per row in one ``lax.while_loop``.

  Defaults are t5x's (``topk=1`` makes the default greedy; set ``topk=0``
  to sample from the full distribution).

  Args:
    inputs: [B, L] int32, shifted right (position 0 is BOS = 0); non-zero
      entries are teacher-forced prompt tokens.
    cache: the model cache, [B, ...] leaves (batch axis ``cache_offset``).
    tokens_to_logits: ``DecodingState -> (logits [B * n, V], new_cache)``.
    eos_id: end-of-sequence id.
    decode_rng: PRNG key (default ``PRNGKey(0)``).
    num_decodes: samples per row, n >= 1.
    temperature: [] or [B] float; <= 1e-4 is greedy.
    topk: keep the k most likely tokens (0: all).
    topp: keep the top mass p (0: all); at most one of topk/topp is set.
    cache_offset: batch axis of the cache leaves (1 for scanned layers).
    initial_index: optional [B] int32 loop index each row starts at (its
      cache is prefilled up to there; its ``cache_index`` is a [B] vector).
    max_decode_steps: optional [] or [B] int, tokens to generate after the
      prompt (the non-zero inputs).
    max_decode_steps_hard_limit: optional int clipping max_decode_steps.
    rescale_log_probs: log-probabilities under the sampling distribution
      (True, t5x's default: 0 for greedy) or under the raw logits.

  Returns:
    (decodes [B, n, L] int32, log_probs [B, n] float32), sorted along n by
    increasing log-probability, so ``decodes[:, -1]`` is the best.
  """
  if isinstance(num_decodes, bool) or int(num_decodes) != num_decodes or (
      num_decodes < 1):
    raise ValueError(f"num_decodes must be an integer >= 1, got "
                     f"{num_decodes!r}")
  inputs = jnp.asarray(inputs)
  if inputs.ndim != 2:
    raise ValueError(f"inputs must be [batch, max_decode_len] token ids, got "
                     f"shape {inputs.shape}")
  batch, length = inputs.shape
  n = int(num_decodes)
  rng = jax.random.PRNGKey(0) if decode_rng is None else decode_rng
  if (max_decode_steps_hard_limit is not None and max_decode_steps_hard_limit
      > 0 and max_decode_steps is not None):
    max_decode_steps = jnp.minimum(max_decode_steps,
                                   max_decode_steps_hard_limit)
  if initial_index is not None:
    initial_index = jnp.asarray(initial_index, jnp.int32)
    if initial_index.shape != (batch,):
      raise ValueError(f"initial_index must be one loop index per row, shape "
                       f"({batch},), got {initial_index.shape}")
  if n > 1:
    inputs = flat_batch_expand(inputs, n)  # [B, L] -> [B * n, L]
    cache = expand_cache(cache, n, cache_offset,
                         apply_to_index=initial_index is not None)
    if initial_index is not None:
      initial_index = flat_batch_expand(initial_index, n)
  rows = batch * n

  # Per-row end of decoding: the whole buffer, or prompt + max_decode_steps.
  max_len = jnp.full((rows,), length, jnp.int32)
  if max_decode_steps is not None:
    if not _is_tracer(max_decode_steps) and np.any(
        np.asarray(max_decode_steps) > length):
      raise ValueError(f"max_decode_steps ({max_decode_steps}) exceeds the "
                       f"decode length {length}")
    steps = jnp.asarray(max_decode_steps, jnp.int32)
    if steps.ndim:
      steps = flat_batch_expand(steps, n)
    max_len = jnp.minimum(length, jnp.sum(inputs != 0, axis=1) + steps)

  seqs = jnp.concatenate(
      [inputs, jnp.zeros((rows, _EXTRA), inputs.dtype)], axis=1)  # [N, L+2]
  if initial_index is None:
    i0 = jnp.zeros((rows,), jnp.int32)
    tok0 = jnp.zeros((rows, 1), jnp.int32)
  else:
    i0 = initial_index
    tok0 = jnp.take_along_axis(seqs, i0[:, None], axis=1).astype(jnp.int32)
  eos_count0 = jnp.sum(seqs == eos_id, axis=1)  # [N]
  state0 = DecodeLoopState(
      step=jnp.int32(0), cur_index=i0, sequences=seqs, cache=cache,
      cur_token=tok0, ended=jnp.zeros((rows,), bool),
      log_prob=jnp.zeros((rows,), jnp.float32))
  strategy = make_strategy(temperature, topk, topp, batch, n)

  def cond_fn(s: DecodeLoopState) -> jax.Array:
    return ~jnp.all(s.ended)

  def body_fn(s: DecodeLoopState) -> DecodeLoopState:
    frozen = isinstance(s.cache, flax.core.FrozenDict)
    logits, new_cache = tokens_to_logits(DecodingState(
        cur_index=s.cur_index, sequences=s.sequences[:, :-_EXTRA],
        cur_token=s.cur_token, cache=s.cache))
    if frozen:
      new_cache = flax.core.freeze(new_cache)
    logits = logits.astype(jnp.float32)  # [N, V]
    probs = strategy.probs(logits)  # [N, V]
    sampled = sampling.sample(_row_keys(rng, s.cur_index), probs)  # [N]
    scores = (jnp.log(probs) if rescale_log_probs
              else jax.nn.log_softmax(logits))
    lp = jnp.take_along_axis(scores, sampled[:, None], axis=1)[:, 0]  # [N]

    # Rows past their end keep overwriting the garbage slot L + 1.
    i = jnp.minimum(s.cur_index, max_len)
    forced = jnp.take_along_axis(s.sequences, (i + 1)[:, None], axis=1)[:, 0]
    free = forced == 0  # not a teacher-forced prompt position
    tok = jnp.where(free, sampled, forced)
    log_prob = s.log_prob + jnp.where(free & ~s.ended, lp, 0.0)
    tok = jnp.where(s.ended, 0, tok).astype(s.sequences.dtype)  # [N]
    seqs = jax.vmap(lambda q, t, at: lax.dynamic_update_index_in_dim(
        q, t, at, 0))(s.sequences, tok, i + 1)  # [N, L + 2]
    new_eos = jnp.sum(seqs == eos_id, axis=1) > eos_count0
    ended = s.ended | new_eos | (i >= max_len - 1)
    return DecodeLoopState(
        step=s.step + 1, cur_index=i + 1, sequences=seqs, cache=new_cache,
        cur_token=tok[:, None].astype(jnp.int32), ended=ended,
        log_prob=log_prob)

  final = lax.while_loop(cond_fn, body_fn, state0)
  decodes = final.sequences[:, 1:-1].reshape(batch, n, length)  # [B, n, L]
  log_prob = final.log_prob.reshape(batch, n)
  order = jnp.argsort(log_prob, axis=-1)  # ascending: best last
  return (jnp.take_along_axis(decodes, order[:, :, None], axis=1),
          jnp.take_along_axis(log_prob, order, axis=1))
