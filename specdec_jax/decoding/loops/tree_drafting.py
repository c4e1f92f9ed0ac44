"""The tree draft phase: the drafter fills a token tree level by level.

The block is ``[root = pending, node_0, ..., node_{N-1}]`` (breadth-first).
Drafter call k (k = 0..D) computes the logits at the depth-k nodes under the
ancestor mask, at positions ``lengths + depth``, so they are those of their
root-to-node paths. The children of the depth-k nodes are then drawn rank
by rank (the proposals of ``verify/tree.py``). Every node's keys and values
land at block slot ``start + j``; the cache length is reset to the block
start after each call, so after the last call the drafter's cache holds
every node and the accepted path is kept with ``cache.commit``. The last
call (k = D) also gives q at the depth-D leaves, which cascade targets need
at the bonus position; with ``sync='catchup'`` it is skipped and a depth-D
node on the accepted path is fed at the start of the next draft phase
instead: call 0 is then ONE 2-token block per row, ``[catchup, root]`` on
rows that lag and ``[root, pad]`` on the others (``_catch_up``).

How a call feeds the drafter depends on the model:

* A model with ``masks_cached_slots = True`` (the built-in T5 and Gemma; see
  ``models/interface.py``) is fed each level ONCE: call k writes the depth-k
  nodes (``level_bounds[k]`` block positions: the tree loop compiles the
  tree's exact level sizes) after the cached shallower levels, and its mask
  re-describes the last ``call_widths[k-1] + 1`` cached slots (ancestors
  visible, other branches hidden, keys at their tree depths). Fed at the
  bounds over (N, D, C) trees instead (``levels=None``), a row whose level
  would run past the block end starts earlier and re-writes a few
  shallower nodes (same keys and values).
* Any other model is fed the whole block prefix of depth <= k
  (``verify.tree.call_widths``; nodes of deeper levels hold the pad id and
  no query attends to them) with the plain in-block mask: same logits, more
  tokens per call.

Every block position keeps the logits and S(q) of the call that drew its
children (``logits``, ``sq``), so verification sees exactly the proposals
the children were drawn from.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from specdec_jax.decoding.loops.drafting import catch_up_block
from specdec_jax.decoding.loops.state import Request
from specdec_jax.decoding.rules import keys as keys_lib
from specdec_jax.decoding.rules import sampling
from specdec_jax.decoding.verify import tree as tree_lib
from specdec_jax.models.cache import KVCache


@struct.dataclass
class TreeDraft:
  """Output of one tree draft phase.

  Attributes:
    tokens: [B, N + 1] int32 block tokens (pending, then the drafted nodes).
    logits: [B, N + 1, V] drafter logits at every block position.
    sq: [B, N + 1, V] S(q) at every block position.
    cache: the drafter's cache, lengths = the block start (its K/V hold
      the block as written by the last call).
    start: [B] int32 cache slot of the block's root.
    calls: [] int32 drafter calls made.
  """

  tokens: jax.Array
  logits: jax.Array
  sq: jax.Array
  cache: KVCache
  start: jax.Array
  calls: jax.Array


def incremental_drafting(drafter) -> bool:
  """Whether tree drafting feeds ``drafter`` one level per call."""
  return bool(getattr(drafter, "masks_cached_slots", False))


@dataclasses.dataclass(frozen=True)
class PrefixFed:
  """``model`` seen without the cached-slot step form: tree drafting feeds
  it the block prefix per level (the form every model supports). Used to
  compare the two feeds (tests, ``scripts/bench_tree_feeds.py``).

  Attributes:
    model: any decode model; every other attribute is read from it.
  """

  model: Any
  masks_cached_slots = False

  def __getattr__(self, name):
    if name == "model":  # not set yet (copy / unpickle)
      raise AttributeError(name)
    return getattr(self.model, name)


@dataclasses.dataclass(frozen=True)
class _Feed:
  """The arguments of one tree-drafting call (built while tracing).

  Attributes:
    tokens: [B, W] int32 block fed.
    offset: [B] int32 block position of its first token.
    base: [B] int32 cache slot of the block's root.
    positions: [B, M + W] int32 or None.
    mask: [B, W, M + W] bool or None.
  """

  tokens: jax.Array
  offset: jax.Array
  base: jax.Array
  positions: jax.Array | None
  mask: jax.Array | None

  def cache_at(self, cache: KVCache) -> KVCache:
    """The cache with every row's length at the fed block's first slot."""
    return cache.with_lengths(self.base + self.offset)

  def logits_at(self, pos: jax.Array) -> jax.Array:
    """[B, P] indices into the fed block of block positions ``pos``."""
    rel = pos - self.offset[:, None]
    return jnp.clip(rel, 0, self.tokens.shape[1] - 1)


def _prefix_feed(k, toks, tree, base, shape, levels) -> _Feed:
  """Call k feeds the block prefix of depth <= k under the in-block mask."""
  w = tree_lib.call_widths(*shape, levels)[k] + 1
  depth = tree["tree.depth"]
  return _Feed(tokens=toks[:, :w], offset=jnp.zeros_like(base), base=base,
               positions=base[:, None] + depth[:, :w],
               mask=tree["tree.mask"][:, :w, :w])


def _level_feed(k, toks, tree, base, shape, levels) -> _Feed:
  """Call k feeds the depth-k level after the cached shallower levels.

  The fed block is block positions ``[s, s + P)`` with P = level_bounds[k]
  and s = min(first depth-k position, N + 1 - P) (it never runs past the
  block); the mask also covers the M = call_widths[k-1] + 1 block
  positions before s (slots before the block root, at s < M, are prefix).
  """
  n = shape[0]
  if k == 0:  # the root alone: a plain one-token step
    return _Feed(tokens=toks[:, :1], offset=jnp.zeros_like(base), base=base,
                 positions=None, mask=None)
  p = tree_lib.level_bounds(*shape, levels)[k]
  m = tree_lib.call_widths(*shape, levels)[k - 1] + 1
  start = jnp.minimum(tree["tree.first"][:, k], n + 1 - p)  # [B]
  cols = start[:, None] - m + jnp.arange(m + p)  # [B, M + P] block positions
  in_tree = cols >= 0
  at = jnp.clip(cols, 0, n)
  depth = jnp.take_along_axis(tree["tree.depth"], at, axis=1)
  positions = base[:, None] + jnp.where(in_tree, depth, cols)
  queries = at[:, m:]  # [B, P]
  rows = jnp.take_along_axis(tree["tree.mask"], queries[..., None],
                             axis=1)  # [B, P, N + 1]
  mask = jnp.take_along_axis(rows, jnp.broadcast_to(
      at[:, None, :], rows.shape[:2] + at.shape[1:]), axis=2)  # [B, P, M + P]
  mask = mask | ~in_tree[:, None, :]
  return _Feed(tokens=jnp.take_along_axis(toks, queries, axis=1),
               offset=start, base=base, positions=positions, mask=mask)


def _catch_up(drafter, q_params, cache: KVCache, pending, token, valid,
              pad_id: int):
  """Feeds ``token`` [B] first on rows where ``valid`` [B].

  Lean (``sampling.LEAN``): with the root, as ONE 2-token block per row
  (``drafting.catch_up_block``: ``[token, root]`` / ``[root, pad]``), which
  is then drafter call 0. Reference: a 1-token step under a ``lax.cond``
  on "some row lags" (whose branches XLA:CPU makes copy the drafter's
  cache every iteration); call 0 follows.

  Returns:
    (q logits [B, 1, V] at the root, or None (reference), the drafter's
    cache with lengths at the root's slot (the block start), extra drafter
    calls made).
  """
  if sampling.LEAN:
    l0, cache = catch_up_block(drafter, q_params, cache, pending, token,
                               valid, pad_id)  # [B, V]; lengths past root
    return l0[:, None], cache.with_lengths(cache.lengths - 1), 0

  def feed(cache):
    _, new = drafter.step(q_params, token[:, None], cache,
                          logits_at=jnp.zeros_like(token))
    return new.with_lengths(cache.lengths + valid.astype(jnp.int32))

  cache = lax.cond(jnp.any(valid), feed, lambda c: c, cache)
  return None, cache, jnp.any(valid).astype(jnp.int32)


def draw_children(kind: str, logits, sq, kids, slot_of, keys_at, c_max,
                  cold=None):
  """Children tokens of P parents, rank by rank.

  Args:
    kind: proposal kind (static).
    logits: [B, P, V] drafter logits at the parents.
    sq: [B, P, V] S(q) there.
    kids: [B, P, C] child nodes (-1: none).
    slot_of: [B, N] slot of every node.
    keys_at: slots [B, P] -> [B, P] DRAFT keys of the children.
    c_max: static C.
    cold: [] bool, every row greedy (``sampling.is_cold``), or None. With
      ``sampling.LEAN``, a greedy batch takes the tokens the draws give
      there without drawing (:func:`_greedy_children`).

  Returns:
    [B, P, C] int32 drawn tokens.
  """
  drawn = lambda: _drawn_children(kind, logits, sq, kids, slot_of, keys_at,
                                  c_max)
  if cold is None or not sampling.LEAN or kind == "top_k":
    return drawn()
  return lax.cond(cold, lambda: _greedy_children(kind, logits, c_max), drawn)


def _cold(strategy):
  """[] bool every row greedy (``sampling.is_cold``); None for a strategy
  without a temperature."""
  if (isinstance(strategy, sampling.Greedy)
      or getattr(strategy, "temperature", None) is not None):
    return sampling.is_cold(strategy)
  return None


def _greedy_children(kind: str, logits, c_max: int) -> jax.Array:
  """:func:`draw_children` of a greedy batch, without keys or V-wide draws.

  S(q) is one-hot at argmax q there, and a draw from a one-hot row is its
  argmax (``sampling.sample``). So 'iid' children are all the argmax, and
  'without_replacement' ones are the argmax, then -- the remaining mass
  being 0 -- the argmax of the logits without the earlier siblings: the
  top C logits in descending order, ties to the lower index, which is
  ``lax.top_k``'s order. (The two part only where fewer than C logits are
  finite: the rank-by-rank fallback repeats index 0 there; ``top_k`` takes
  the next unused indices.) The draws are C rounds of small XLA:CPU ops
  per level (inverse-CDF searches, masks over V); skipping them made the
  default T5 pair's greedy 16-node tree with 6 children per node decode
  1.21x / 1.10x faster at batch 1 / 8, a 2-children one 1.02-1.04x; the
  cond's cost where rows sample was not resolved from noise (0.88-1.04x;
  benchmarks/results/greedy_tree_children).

  Args:
    kind: 'iid' or 'without_replacement' (static).
    logits: [B, P, V]; c_max: static C.

  Returns:
    [B, P, C] int32 tokens.
  """
  if kind == "iid":
    best = sampling.argmax(logits)  # [B, P]
    return jnp.broadcast_to(best[..., None], best.shape + (c_max,))
  return lax.top_k(logits, c_max)[1].astype(jnp.int32)


def _drawn_children(kind: str, logits, sq, kids, slot_of, keys_at, c_max):
  """:func:`draw_children`, drawn rank by rank (any temperature)."""
  b, npar, v = sq.shape
  flat = lambda x: x.reshape((b * npar,) + x.shape[2:])
  iota = jnp.arange(v)
  used = jnp.zeros((b, npar, v), bool)
  top = lax.top_k(logits, c_max)[1] if kind == "top_k" else None
  out = []
  for i in range(c_max):
    slots = jnp.take_along_axis(slot_of, jnp.maximum(kids[..., i], 0),
                                axis=1)  # [B, P]
    if kind == "top_k":
      x = top[..., i]
    else:
      keys = flat(keys_at(slots))
      if kind == "iid" or i == 0:
        x = sampling.sample(keys, flat(sq)).reshape(b, npar)
      else:
        masked, mass = tree_lib.remaining(sq, used)
        drawn = sampling.sample(keys, flat(masked)).reshape(b, npar)
        best = sampling.argmax(jnp.where(used, -jnp.inf, logits))
        x = jnp.where(mass > 0, drawn, best)
    used = used | (iota == x[..., None])
    out.append(x.astype(jnp.int32))
  return jnp.stack(out, axis=-1)


def _call_level(drafter, q_params, cache: KVCache, k: int, toks: jax.Array,
                tree: dict, base: jax.Array, shape: tuple[int, int, int],
                pos: jax.Array, incremental: bool, levels):
  """Drafter call k of :func:`draft_tree`: (logits [B, P, V] at the block
  positions ``pos`` [B, P] of depth k, the cache back at lengths ``base``)."""
  if incremental:
    feed = _level_feed(k, toks, tree, base, shape, levels)
  else:
    feed = _prefix_feed(k, toks, tree, base, shape, levels)
  lg, new = drafter.step(q_params, feed.tokens, feed.cache_at(cache),
                         positions=feed.positions, mask=feed.mask,
                         logits_at=feed.logits_at(pos))  # [B, P, V]
  pos_in = jnp.minimum(pos, shape[0])
  if lg.shape[:2] != pos_in.shape:
    raise ValueError(
        f"the drafter's step returned logits of shape {lg.shape} for "
        f"logits_at of shape {pos_in.shape}; tree drafting needs [B, P, V] "
        f"for [B, P] indices (cache.select_positions does it; see "
        f"specdec_jax/models/interface.py)")
  return lg, new.with_lengths(base)


def draft_tree(drafter, q_params, cache: KVCache, pending: jax.Array,
               start_out: jax.Array, catchup: jax.Array,
               catchup_valid: jax.Array, tree: dict, strategy, req: Request,
               shape: tuple[int, int, int], kind: str, last_call: bool,
               pad_id: int, levels: tuple[int, ...] | None = None
               ) -> TreeDraft:
  """Drafts one tree per row.

  Args:
    drafter, q_params: the drafter and its parameters.
    cache: the drafter's cache (pending not yet fed).
    pending: [B] the root token.
    start_out: [B] output position of the first node (depth 1).
    catchup, catchup_valid: [B] a depth-D node of the last accepted path
      the drafter never fed, and whether to feed it first.
    tree: per-row tree arrays (``verify.tree.tree_arrays``).
    strategy: the sampling transform S.
    req: per-row Request (keys).
    shape: static (N, D, C).
    kind: proposal kind (static).
    last_call: run call D (q at the depth-D leaves, every node cached).
    pad_id: placeholder token of nodes not yet drawn.
    levels: static block positions of each depth (``level_sizes`` of every
      row's tree): each level fed at its exact width; None: at the bounds
      over (N, D, C) trees (rows holding different trees of one shape).

  Returns:
    TreeDraft.
  """
  n, d_max, c_max = shape
  bounds = tree_lib.level_bounds(*shape, levels)
  root_logits, cache, catch_up_calls = _catch_up(
      drafter, q_params, cache, pending, catchup, catchup_valid, pad_id)
  base = cache.lengths  # [B]: the root's slot
  b = pending.shape[0]
  depth = tree["tree.depth"]  # [B, N + 1]
  parents, ranks = tree["tree.parents"], tree["tree.rank"]
  toks = jnp.concatenate(
      [pending[:, None], jnp.full((b, n), pad_id, jnp.int32)], axis=1)
  logits_buf = sq_buf = None
  rows = jnp.arange(b)[:, None]
  cold = _cold(strategy)
  calls = d_max + int(last_call)
  incremental = incremental_drafting(drafter)
  for k in range(calls):
    # The block positions of depth k (contiguous, breadth-first).
    pos = tree["tree.first"][:, k:k + 1] + jnp.arange(bounds[k])  # [B, P]
    valid = (pos <= n) & (jnp.take_along_axis(
        depth, jnp.minimum(pos, n), axis=1) == k)
    if k == 0 and root_logits is not None:  # call 0 made by _catch_up
      lg = root_logits  # [B, 1, V]
    else:
      lg, cache = _call_level(drafter, q_params, cache, k, toks, tree, base,
                              shape, pos, incremental, levels)  # [B, P, V]
    pos_in = jnp.minimum(pos, n)
    sq = strategy.probs(lg)
    if logits_buf is None:
      logits_buf = jnp.zeros((b, n + 1) + lg.shape[2:], lg.dtype)
      sq_buf = jnp.zeros_like(logits_buf, jnp.float32)
    drop = jnp.where(valid, pos, n + 1)
    logits_buf = logits_buf.at[rows, drop].set(lg, mode="drop")
    sq_buf = sq_buf.at[rows, drop].set(sq, mode="drop")
    if k == d_max:
      break
    kids = jnp.take_along_axis(tree["tree.children"], pos_in[..., None],
                               axis=1)  # [B, P, C]
    kids = jnp.where(valid[..., None], kids, -1)
    out_pos = start_out + k
    keys_at = lambda slots, o=out_pos: tree_lib.node_keys(
        req.seed, req.request_id, o, slots, keys_lib.DRAFT)
    drawn = draw_children(kind, lg, sq, kids, tree["tree.slot"], keys_at,
                          c_max, cold)  # [B, P, C] children tokens
    # Node j of depth k + 1: child rank[j] of parent parents[j] + 1 - first[k].
    at = (parents + 1 - tree["tree.first"][:, k:k + 1]) * c_max + ranks
    at = jnp.clip(at, 0, bounds[k] * c_max - 1)
    vals = jnp.take_along_axis(drawn.reshape(b, -1), at, axis=1)  # [B, N]
    toks = toks.at[:, 1:].set(jnp.where(depth[:, 1:] == k + 1, vals,
                                        toks[:, 1:]))
  return TreeDraft(tokens=toks, logits=logits_buf, sq=sq_buf, cache=cache,
                   start=base, calls=jnp.int32(calls) + catch_up_calls)

