"""Hierarchical speculative decoding (HSD, Globerson et al.) in one jit.

A stack M_0 .. M_K (cheapest first, M_K the target). One iteration of the
outer ``lax.while_loop`` is one top-level round:

    fill(K-1, s)       level K-1 builds a buffer of >= T_{K-1} tokens at s
      fill(n, s):      while the buffer holds < T_n tokens:
        fill(n-1, s')    the level below proposes a batch d at s' (nested
                         while loop; level 0 drafts T_0 tokens itself)
        M_n scores [tokens it has not seen, d] in ONE block step
        standard speculative sampling of d against S(p_n), with per
        position the distribution each token was actually drawn from:
        accept the longest valid prefix, then append a residual token (at
        the first rejection) or a bonus token from S(p_n)
    M_K verifies level K-1's buffer the same way, with ANY target of the
    engine (T(q, p) with q = p_{K-1}), and the accepted tokens plus one are
    emitted; every level's cache is rolled back by index.

Buffers live in place in one per-row context array ``ctx`` [B, C] (prompt,
emitted tokens, then the in-flight batch): level n's accepted tokens are the
lower batch's tokens where they already stand, so no token is copied. Every
buffer ends with a token its own level has not fed, so each level's cache
lags the context by at most one token per level above it plus one; a level
feeds that lag together with the batch it verifies.

Exactness: each level's batch is an adaptively stopped draft whose tokens
follow, given the past, the distribution recorded with them (``props``), so
the next level's rejection sampling is exact (Theorem 2.1); a lenient level
(a cascade target) records ``effective(pi, S(q))`` at draft positions and
S(p_n) at bonus positions, so an exact top level still gives exactly M_K.

Static shapes: level 0's batch has T_0 tokens; level n's buffer at most
B_n = T_n + B_{n-1} (fewer than T_n before its last round, plus a batch of
at most B_{n-1} + 1).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from specdec_jax.decoding.loops import state as state_lib
from specdec_jax.decoding.loops.output import output
from specdec_jax.decoding.loops.program import LoopProgram
from specdec_jax.decoding.hierarchy.stack import (Batchlet, HState, StackShape,
                                                 put, take_rows, window)
from specdec_jax.decoding.loops.state import (Batch, Level, LoopConfig,
                                              Stream, all_finite)
from specdec_jax.decoding.rules import keys as keys_lib
from specdec_jax.decoding.rules import sampling
from specdec_jax.decoding.rules.knobs import Static
from specdec_jax.decoding.rules.targets import SpecDecode, effective
from specdec_jax.decoding.verify.chain import verify_block


@dataclasses.dataclass(frozen=True)
class Call:
  """What one top-level round reads besides the loop state (per call).

  Attributes:
    models: the K + 1 DecodeModels, cheapest first (static).
    params: their parameter trees.
    batch: the Batch of the call (knobs, request, lenient levels' knobs in
      ``batch.structure``).
    cfg: the static LoopConfig.
    stack: the static StackShape (buffers, lenient rules).
    strategy: the sampling transform with the batch's knobs.
    target: the top level's target T(q, p) with the batch's knobs.
    extra: whether the target reads q at the bonus position (static).
  """

  models: tuple
  params: tuple
  batch: Batch
  cfg: LoopConfig
  stack: StackShape
  strategy: object
  target: object
  extra: bool

  @classmethod
  def of(cls, models, params, batch: Batch, cfg: LoopConfig,
         stack: StackShape, top: Static) -> "Call":
    target = top.bind(batch.knobs)
    return cls(models=models, params=params, batch=batch, cfg=cfg,
               stack=stack, strategy=cfg.strategy(batch), target=target,
               extra=bool(target.needs_drafter_at_bonus))

  @property
  def req(self):
    return self.batch.req


# -- model calls -----------------------------------------------------------


def forward(c: Call, n: int, level: Level, ctx, end, width: int, first,
            rows: int, active):
  """Level n feeds ctx[len : end] (<= width tokens) in ONE block step.

  Returns:
    (logits [B, rows, V] before ctx positions first .. first + rows - 1,
    level with lengths = end on active rows and one more call).
  """
  cache = level.cache
  toks = window(ctx, cache.lengths, width)  # [B, width]
  logits, new = c.models[n].step(c.params[n], toks, cache)
  out = take_rows(logits, first - 1 - cache.lengths, rows)  # [B, rows, V]
  level = level.replace(cache=new.with_lengths(
      jnp.where(active, end, cache.lengths))).count(active, calls=1)
  return out, level


def catch_up(c: Call, n: int, level: Level, ctx, end, active):
  """Feeds the tokens level n lags behind ctx[:end]; logits at end - 1.

  One token (the usual case) is a plain 1-token step; a longer lag is
  one right-padded block with ``logits_at``.
  """
  cache, model = level.cache, c.models[n]
  lag = end - cache.lengths  # [B] >= 1 on active rows

  def one(_):
    tok = window(ctx, cache.lengths, 1)
    logits, new = model.step(c.params[n], tok, cache)
    return logits[:, 0], new

  def block(_):
    toks = window(ctx, cache.lengths, c.stack.lag)
    at = jnp.clip(lag - 1, 0, c.stack.lag - 1)
    logits, new = model.step(c.params[n], toks, cache, logits_at=at)
    return logits[:, 0], new

  logits, new = lax.cond(jnp.all((lag == 1) | ~active), one, block, None)
  level = level.replace(cache=new.with_lengths(
      jnp.where(active, end, cache.lengths))).count(active, calls=1)
  return logits, level


# -- keys ------------------------------------------------------------------


def level_keys(c: Call, pos, purpose: int, n: int | None):
  """[B] keys of ctx positions ``pos`` for a level's stream."""
  out = pos - c.batch.prompt_len
  return keys_lib.row_keys(c.req.seed, c.req.request_id, out,
                           keys_lib.level_purpose(purpose, n))


# -- the levels --------------------------------------------------------------


def draft(c: Call, levels, ctx, start, active):
  """Level 0 drafts T_0 tokens at ``start``: (levels, ctx, Batchlet)."""
  t0, b = c.stack.buffers[0], start.shape[0]
  feeds = t0 - 1 + int(c.extra and c.stack.depth == 1)
  q, lv0 = catch_up(c, 0, levels[0], ctx, start, active)  # [B, V]
  v = q.shape[-1]
  props = jnp.zeros((b, t0 + 1, v), jnp.float32)
  logits = jnp.zeros((b, t0 + 1, v), jnp.float32).at[:, 0].set(q)

  def body(j, carry):
    lv0, ctx, props, logits = carry
    q = logits[:, j]
    sq = c.strategy.probs(q)  # [B, V]
    tok = sampling.sample(level_keys(c, start + j, keys_lib.DRAFT, None), sq)
    ctx = put(ctx, start + j, tok, active)
    props = props.at[:, j].set(sq)

    def feed(carry):
      lv0, logits = carry
      nxt, cache = c.models[0].step(c.params[0], tok[:, None],
                                       lv0.cache)
      lv0 = lv0.replace(cache=cache.with_lengths(jnp.where(
          active, cache.lengths, lv0.cache.lengths))).count(active,
                                                              calls=1)
      return lv0, logits.at[:, j + 1].set(nxt[:, 0])

    lv0, logits = lax.cond(j < feeds, feed, lambda c: c, (lv0, logits))
    return lv0, ctx, props, logits

  lv0, ctx, props, logits = lax.fori_loop(0, t0, body,
                                          (lv0, ctx, props, logits))
  if feeds == t0:  # the extra step: S(q) at the bonus position too
    props = props.at[:, t0].set(c.strategy.probs(logits[:, t0]))
  count = jnp.where(active, t0, 0).astype(jnp.int32)
  finite = all_finite(logits)  # [B]: level 0's logits of this batch
  return (lv0,) + tuple(levels[1:]), ctx, Batchlet(count, props, logits,
                                                   finite)


def verify(c: Call, n: int, levels, ctx, start, sub: Batchlet, active,
           target, purpose_level):
  """Level n scores the batch ``sub`` at ``start`` and accepts a prefix.

  Returns:
    (levels, accepted [B], token [B], its distribution rows
    out_props/out_logits [B, W + 1, V] at the batch positions, deferral
    mass [B, W + 1], target pi [B, W + 1, V]).
  """
  w = sub.props.shape[1] - 1  # B_{n-1}
  end = start + sub.count
  width = w + 1 if n == c.stack.depth else w + c.stack.lag
  p_logits, lv = forward(c, n, levels[n], ctx, end, width, start, w + 1,
                              active)
  drafts = window(ctx, start, w)  # [B, W]
  q = sampling.unscaled(sub.logits)
  sq, sp = sub.props, c.strategy.probs(p_logits)
  p = sampling.unscaled(p_logits)
  key = lambda pos, purpose: level_keys(c, pos, purpose, purpose_level)
  u = keys_lib.block_uniforms(c.req.seed, c.req.request_id,
                              start - c.batch.prompt_len, w,
                              keys_lib.level_purpose(keys_lib.ACCEPT,
                                                     purpose_level))
  out = verify_block(target, drafts, q, p, sq, sp, u,
                     key_residual=key(start, keys_lib.RESIDUAL),
                     key_bonus=key(start + w, keys_lib.DRAFT))
  pi = out.pi if target.normalized else effective(out.pi, sq)  # [B,W+1,V]
  n_acc = jnp.minimum(out.accepted, sub.count)  # [B]
  full = out.accepted >= sub.count
  bonus_at = lambda x: jnp.take_along_axis(
      x, sub.count[:, None, None], axis=1)[:, 0]  # [B, V]
  bonus_dist = bonus_at(pi) if purpose_level is None and c.extra else (
      bonus_at(sp))
  bonus = sampling.sample(key(end, keys_lib.DRAFT), bonus_dist)
  tok = jnp.where(full, bonus, out.token)
  iota = jnp.arange(w + 1)[None, :]
  out_props = jnp.where((iota < sub.count[:, None])[..., None],
                        effective(pi, sq), sp)
  levels = tuple(levels[:n]) + (lv,) + tuple(levels[n + 1:])
  return levels, n_acc, tok, out_props, p_logits, out.defer, full


def fill(c: Call, n: int, levels, ctx, start, active):
  """Level n's batch at ``start`` (>= T_n tokens): (levels, ctx, Batchlet).

  Rows with ``active`` False change nothing (fixed shapes: they compute).
  """
  if n == 0:
    return draft(c, levels, ctx, start, active)
  t_n, bound = c.stack.buffers[n], c.stack.bound(n)
  w = c.stack.bound(n - 1)
  lenient = c.stack.lenient[n - 1]
  target = level_target(c, n, lenient)
  b, v = start.shape[0], c.models[n].vocab_size
  first = Batchlet(count=jnp.zeros((b,), jnp.int32),
                   props=jnp.zeros((b, bound + 1, v), jnp.float32),
                   logits=jnp.zeros((b, bound + 1, v), jnp.float32),
                   finite=jnp.ones((b,), bool))

  def cond(carry):
    _, _, buf = carry
    return jnp.any(active & (buf.count < t_n))

  def body(carry):
    levels, ctx, buf = carry
    need = active & (buf.count < t_n)
    s = start + buf.count
    levels, ctx, sub = fill(c, n - 1, levels, ctx, s, need)
    levels, n_acc, tok, props, logits, _, _ = verify(c, 
        n, levels, ctx, s, sub, need, target, n)
    ctx = put(ctx, s + n_acc, tok, need)
    levels = roll_back(levels, n, s + n_acc, need)
    levels = tuple(
        lv.count(need, drafted=sub.count, accepted=n_acc,
                 rejected=n_acc < sub.count) if m == n else lv
        for m, lv in enumerate(levels))
    # Append rows 0..n_acc of the batch's distributions at buf.count.
    iota = jnp.arange(w + 1)[None, :]
    dst = jnp.where(need[:, None] & (iota <= n_acc[:, None]),
                    buf.count[:, None] + iota, bound + 1)  # [B, W + 1]
    scatter = jax.vmap(lambda x, i, y: x.at[i].set(y, mode="drop"))
    buf = Batchlet(count=jnp.where(need, buf.count + n_acc + 1,
                                   buf.count),
                   props=scatter(buf.props, dst, props),
                   logits=scatter(buf.logits, dst, logits),
                   finite=jnp.where(need, buf.finite & sub.finite
                                    & all_finite(logits), buf.finite))
    return levels, ctx, buf

  return lax.while_loop(cond, body, (levels, ctx, first))


def level_target(c: Call, n: int, lenient: Static | None):
  """The target level n verifies with: exact, or its lenient rule."""
  if lenient is None:
    return SpecDecode()
  return lenient.bind(c.batch.structure.lenient[n - 1])


def roll_back(levels, n: int, keep, active):
  """Level n keeps ctx[:keep]; every level below at most that much."""
  out = []
  for m, lv in enumerate(levels):
    if m <= n:
      old = lv.cache.lengths
      new = keep if m == n else jnp.minimum(old, keep)
      lv = lv.replace(cache=lv.cache.with_lengths(
          jnp.where(active, new, old)))
    out.append(lv)
  return tuple(out)


def one_round(c: Call, s: HState) -> HState:
  """One top-level round: fill, verify with the method's target, emit."""
  k, stream = c.stack.depth, s.stream
  active = ~stream.done
  start = c.batch.prompt_len + stream.num_out  # first new position
  levels, ctx, sub = fill(c, k - 1, s.levels, s.ctx, start, active)
  if c.extra and k > 1:  # q at the bonus position of level K-1
    q, lv = catch_up(c, k - 1, levels[k - 1], ctx, start + sub.count,
                          active)
    at = sub.count[:, None, None]
    sub = sub.replace(
        logits=jnp.where(jnp.arange(sub.logits.shape[1])[None, :, None]
                         == at, q[:, None], sub.logits))
    sub = sub.replace(props=jnp.where(
        jnp.arange(sub.props.shape[1])[None, :, None] == at,
        c.strategy.probs(q)[:, None], sub.props),
                      finite=sub.finite & all_finite(q))
    levels = tuple(levels[:k - 1]) + (lv,) + (levels[k],)
  levels, n_acc, tok, _, p_logits, defer, _ = verify(c, 
      k, levels, ctx, start, sub, active, c.target, None)
  w = sub.props.shape[1] - 1
  # Every level's logits: the top's and those under its batch.
  finite = stream.finite & (~active | (all_finite(p_logits) & sub.finite))
  cand = window(ctx, start, w + 1)  # [B, W + 1]
  iota = jnp.arange(w + 1)[None, :]
  cand = jnp.where(iota < n_acc[:, None], cand,
                   jnp.where(iota == n_acc[:, None], tok[:, None],
                             c.cfg.pad_id))
  new_stream, _ = stream.emit(cand, n_acc + 1, c.req, c.cfg, finite,
                              defer)
  ctx = put(ctx, start + n_acc, tok, active)
  levels = roll_back(levels, k, start + n_acc, active)
  levels = tuple(lv.count(active, drafted=sub.count, accepted=n_acc,
                          rejected=n_acc < sub.count)
                 if m == k else lv for m, lv in enumerate(levels))
  return HState(stream=new_stream, levels=levels, ctx=ctx)


def hierarchy_program(models: tuple, cfg: LoopConfig, stack: StackShape,
                      top: Static) -> LoopProgram:
  """HSD over ``models`` (M_0 .. M_K) as a LoopProgram.

  Args:
    models: K + 1 DecodeModels sharing a vocabulary, cheapest first.
    cfg: static LoopConfig (its topology is unused).
    stack: buffers and lenient intermediate rules.
    top: static half of the top level's target (its knobs in the batch).
  """
  if len(models) != stack.depth + 1:
    raise ValueError(f"{len(models)} models need {len(models) - 1} buffers, "
                     f"got {len(stack.buffers)}")

  def init(args) -> HState:
    params, batch = args
    b, width = batch.prompt.shape
    cap = stack.context_width(width, cfg.max_new)
    levels, pending = [], None
    for model, p in zip(models, params):
      cache, pending = state_lib.start_cache(model, p, batch, cap)
      levels.append(Level.start(cache, b))
    ctx = jnp.zeros((b, cap), jnp.int32)
    ctx = lax.dynamic_update_slice(ctx, batch.prompt, (0, 0))
    width_out = cfg.max_new + stack.bound(stack.depth - 1) + 1
    return HState(stream=Stream.start(pending, batch.req, width_out,
                                      cfg.pad_id),
                  levels=tuple(levels), ctx=ctx)

  def cond(args, s: HState):
    return (s.stream.step < cfg.max_new) & ~jnp.all(s.stream.done)

  def body(args, s: HState) -> HState:
    params, batch = args
    return one_round(Call.of(models, params, batch, cfg, stack, top), s)

  def finish(args, s: HState):
    return output(s.stream, s.levels, cfg)

  return LoopProgram(("hierarchy", models, cfg, stack, top), init, cond,
                     body, finish)
