"""Exact tree verification: recursive rejection sampling over a token tree.

The primitive (SpecInfer / Sequoia; ../shared/reference/trees-and-hierarchies.md
section 2.1). At a node with target ``pi`` and children x_1 .. x_k in rank
order, child x_i drawn from Q_i (which may depend on the earlier siblings):

    r <- pi
    for i = 1..k:  accept x_i iff u_i * Q_i(x_i) < r(x_i)   (prob min(1, r/Q_i))
                   if accepted: descend into x_i (r <- pi there)
                   else r <- norm(max(0, r - Q_i))
    no child accepted, or a leaf: emit one token ~ r

By the rejection-sampling lemma (over siblings, then depth) the emitted path
plus token is distributed exactly as the token-level process that samples
every token from ``pi``, for ANY proposals Q_i that the children really were
drawn from. Proposal kinds (``Tree.proposal``):

* ``iid`` (SpecInfer): Q_i = S(q), children drawn independently;
* ``without_replacement`` (Sequoia / RSD, the default): Q_i = S(q) with the
  earlier siblings zeroed and renormalised (children are distinct). When no
  mass is left (a one-hot S(q) at temperature 0, or an exhausted top-p
  nucleus) the child is the most likely unscaled-q token not yet used, with a
  one-hot proposal (exact: Q_i may depend on the earlier siblings);
* ``top_k`` (EAGLE-style, deterministic): child i is the i-th most likely
  token of the UNSCALED q, Q_i = one-hot(x_i).

Worked example (the test suite runs it): vocabulary {0, 1, 2}, the root has
children x_1 = 1, x_2 = 2 (without replacement), pi = S(p) = [.1, .3, .6],
S(q) = [.2, .5, .3], uniforms u_1 = .9, u_2 = .5:

    child 1: u*Q_1(1) = .9 * .5 = .45 >= r(1) = .3           -> reject
             r <- max(0, pi - Q_1) = [0, 0, .3] (mass z = .3)
    child 2: Q_2 = S(q) without token 1 = [.4, 0, .6]
             u*Q_2(2)*z = .5 * .6 * .3 = .09 < r(2) = .3      -> accept

so token 2 is emitted and the walk descends into child 2.

Randomness (per request, ``rules/keys.py``): the node of depth d with slot s
(its index among the nodes of depth d) is drawn with the DRAFT stream at
output position ``start + d - 1`` (folded with s when s > 0) and tested with
the ACCEPT stream likewise; the final token after rejections at depth n uses
``fold_in(RESIDUAL at start, n)``, at a leaf of depth n the DRAFT stream at
``start + n``. A chain-shaped tree therefore uses exactly the chain kernel's
streams, and gives its tokens (``verify/chain.py``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax.decoding.rules import keys as keys_lib
from specdec_jax.decoding.rules import sampling
from specdec_jax.decoding.rules.targets import Target, effective
from specdec_jax.decoding.verify.topology import Topology
from specdec_jax.decoding.verify.tree_static import (  # re-exported
    call_widths, feed_widths, level_bounds, level_sizes, tree_feed_widths)

PROPOSALS = ("iid", "without_replacement", "top_k")
SYNCS = ("auto", "commit", "catchup")
# Keys of the per-row tree arrays inside ``Batch.knobs`` (a '.' keeps them
# apart from the method's own knobs).
ARRAYS = ("tree.parents", "tree.depth", "tree.rank", "tree.slot",
          "tree.children", "tree.mask", "tree.first")


@dataclasses.dataclass(frozen=True)
class Tree:
  """A draft tree for ``decoding.generate(..., tree=Tree(...))``.

  Attributes:
    topology: the static shape (``Topology.kary(2, 3)``, ``from_paths``,
      ``chain``, or a planner's ``planners.plan_tree(...).topology``).
    proposal: how children are drawn: 'without_replacement' (default),
      'iid' or 'top_k' (see the module docstring).
    drafter_sync: how the drafter's cache follows the accepted path:
      'commit' (one more drafter call over the whole tree, then
      ``cache.commit``), 'catchup' (skip that call; the next block's
      first call feeds the last accepted node, when never fed, before the
      root), or 'auto' (catchup when the target never reads q at the
      leaves, i.e. SpecDecode, else commit).
  """

  topology: Topology
  proposal: str = "without_replacement"
  drafter_sync: str = "auto"

  def __post_init__(self):
    if isinstance(self.topology, (list, tuple)):
      object.__setattr__(self, "topology", Topology(tuple(self.topology)))
    if not isinstance(self.topology, Topology):
      raise ValueError(f"Tree needs a Topology (Topology.kary(2, 3), "
                       f"Topology.from_paths(...)) or a list of parent "
                       f"indices, got {type(self.topology).__name__}")
    if self.proposal not in PROPOSALS:
      raise ValueError(f"unknown tree proposal {self.proposal!r}; choose "
                       f"one of {', '.join(PROPOSALS)}")
    if self.drafter_sync not in SYNCS:
      raise ValueError(f"drafter_sync must be one of {', '.join(SYNCS)}, "
                       f"got {self.drafter_sync!r}")

  @property
  def shape(self) -> tuple[int, int, int]:
    """(nodes N, max depth D, max children C): what a program compiles for."""
    t = self.topology
    return t.num_nodes, t.max_depth, t.max_children


# -- a tree's arrays (its drafter calls' widths: tree_static.py) --------------


def tree_arrays(topology: Topology, batch: int) -> dict[str, np.ndarray]:
  """The per-row arrays of a tree (host side; they travel in the Batch).

  Returns:
    dict of ``tree.parents`` [B, N] (parent node, -1 = root),
    ``tree.depth`` [B, N + 1] block depths (root 0), ``tree.rank`` [B, N],
    ``tree.slot`` [B, N] (index among the nodes of the same depth),
    ``tree.children`` [B, N + 1, C] child nodes of block position j (-1
    padded), ``tree.mask`` [B, N + 1, N + 1] ancestor-or-self mask,
    ``tree.first`` [B, D + 2] block position of the first token of each
    depth (N + 1 past the last).
  """
  t = topology
  n, d, c = t.num_nodes, t.max_depth, t.max_children
  depth = t.block_depths()
  first = [int(np.argmax(depth == k)) for k in range(d + 1)] + [n + 1]
  slot = [i + 1 - first[depth[i + 1]] for i in range(n)]
  children = np.full((n + 1, c), -1, np.int32)
  for j, kids in enumerate(t.children):
    children[j, :len(kids)] = kids
  one = {"tree.parents": np.asarray(t.parents, np.int32), "tree.depth": depth,
         "tree.rank": np.asarray(t.ranks, np.int32),
         "tree.slot": np.asarray(slot, np.int32), "tree.children": children,
         "tree.mask": t.block_mask(), "tree.first": np.asarray(first,
                                                               np.int32)}
  return {k: np.broadcast_to(v, (batch,) + v.shape).copy()
          for k, v in one.items()}


# -- proposals and keys (shared by drafting and verification) ----------------


def node_keys(seed, request_id, position, slot, purpose: int) -> jax.Array:
  """Keys of nodes: the plain stream at ``position`` for slot 0, else
  folded with the slot.

  Args:
    seed, request_id: [B].
    position: [B] int32 output position (start + depth - 1).
    slot: [B, K] int32 slots of K nodes.
    purpose: DRAFT or ACCEPT.

  Returns:
    [B, K] typed keys.
  """
  base = keys_lib.row_keys(seed, request_id, position, purpose)  # [B]
  folded = jax.vmap(lambda k, s: jax.vmap(
      lambda ss: jax.random.fold_in(k, ss))(s))(base, slot)  # [B, K]
  return jnp.where(slot == 0, base[:, None], folded)


def node_uniforms(seed, request_id, start, depth, slot) -> jax.Array:
  """Accept uniforms of the nodes (ACCEPT stream, ``node_keys`` scheme).

  Args:
    seed, request_id, start: [B] (start = output position of depth 1).
    depth: [B, N] int32 node depths (1..D); slot: [B, N] int32 slots.

  Returns:
    [B, N] float32 uniforms in [0, 1).
  """
  pos = start[:, None] + depth - 1  # [B, N]
  keys = jax.vmap(lambda p: keys_lib.row_keys(seed, request_id, p,
                                               keys_lib.ACCEPT),
                  in_axes=1, out_axes=1)(pos)  # [B, N]
  folded = jax.vmap(jax.vmap(jax.random.fold_in))(keys, slot)
  keys = jnp.where(slot == 0, keys, folded)
  return jax.vmap(jax.vmap(lambda k: jax.random.uniform(k, ())))(keys)


def remaining(sq: jax.Array, used: jax.Array) -> tuple[jax.Array, jax.Array]:
  """S(q) without the earlier siblings' tokens.

  Args:
    sq: [..., V] transformed drafter distribution.
    used: [..., V] bool, tokens of the earlier siblings.

  Returns:
    (masked weights [..., V], their mass [...]); mass 0 means the proposal
    falls back to one-hot.
  """
  masked = jnp.where(used, 0.0, sq)
  return masked, jnp.sum(masked, axis=-1)


def proposal_dist(kind: str, rank: int, sq, used, x) -> jax.Array:
  """Q_rank, the law the child of this rank was drawn from.

  Args:
    kind: one of PROPOSALS (static).
    rank: the child's rank (static).
    sq: [..., V] transformed drafter distribution at the parent.
    used: [..., V] bool tokens of the earlier siblings (without
      replacement).
    x: [...] the child's token (for one-hot proposals).

  Returns:
    [..., V] normalised Q (rank 0 of a sampled kind: ``sq`` itself, bit for
    bit, as the chain kernel uses).
  """
  onehot = jax.nn.one_hot(x, sq.shape[-1], dtype=sq.dtype)
  if kind == "top_k":
    return onehot
  if kind == "iid" or rank == 0:
    return sq
  masked, mass = remaining(sq, used)
  safe = jnp.where(mass > 0, mass, 1.0)[..., None]
  return jnp.where((mass > 0)[..., None], masked / safe, onehot)


def _take(x: jax.Array, idx: jax.Array) -> jax.Array:
  """x [B, K, ...] at per-row index idx [B] -> [B, ...]."""
  idx = idx.reshape(idx.shape + (1,) * (x.ndim - 1))
  return jnp.take_along_axis(x, idx, axis=1)[:, 0]


# -- the walk ------------------------------------------------------------------


@struct.dataclass
class TreeResult:
  """Outcome of verifying one tree block.

  Attributes:
    accepted: [B] int32 nodes accepted along the path (0..D).
    path: [B, D + 1] int32 block positions of the accepted path: 0 (the
      root), then the accepted nodes (+1); entries past ``accepted`` are
      their own index (ignored by ``cache.commit``).
    token: [B] int32 the token emitted after the path (residual or bonus).
    rejected: [B] bool whether the token is a residual draw (some child of
      the last node was rejected) rather than a bonus draw.
    defer: [B, D + 1] float32 deferral mass at the path positions.
    accept: [B, N] bool outcome of each node's accept test (False where
      not tested).
  """

  accepted: jax.Array
  path: jax.Array
  token: jax.Array
  rejected: jax.Array
  defer: jax.Array
  accept: jax.Array


def _sibling_tests(kind, pi, sq, nodes, children, u):
  """The accept test of every child, as if its parent were reached and its
  earlier siblings rejected, for all parents at once.

  The residual a parent holds before testing its rank-i child depends only
  on pi there and the proposals of ranks < i, never on the walk, so every
  test is decided in parallel and the walk is index arithmetic.

  Args:
    kind: proposal kind (static).
    pi, sq: [B, W, V] target and S(q) at every block position (W = N + 1).
    nodes: [B, N] node tokens; children: [B, W, C]; u: [B, N] uniforms.

  Returns:
    (ok [B, W, C] child of rank i accepted when tested, r [B, W, V] the
    unnormalised residual after every child was rejected (pi at leaves)).
  """
  b, w, v = pi.shape
  r, z = pi, jnp.ones((b, w), jnp.float32)  # z: r's mass, 1.0 exactly first
  used = jnp.zeros((b, w, v), bool)
  iota = jnp.arange(v)
  oks = []
  for i in range(children.shape[-1]):
    c = children[..., i]  # [B, W]
    has = c >= 0
    ci = jnp.maximum(c, 0)
    x = jnp.take_along_axis(nodes, ci, axis=1)  # [B, W]
    big_q = proposal_dist(kind, i, sq, used, x)  # [B, W, V]
    used = used | (iota == x[..., None])
    qx = jnp.take_along_axis(big_q, x[..., None], axis=-1)[..., 0]
    rx = jnp.take_along_axis(r, x[..., None], axis=-1)[..., 0]
    ux = jnp.take_along_axis(u, ci, axis=1)
    oks.append(has & (ux * qx * z < rx))  # [B, W]
    res = jnp.maximum(r - z[..., None] * big_q, 0.0)  # [B, W, V]
    mass = jnp.sum(res, axis=-1)
    # No residual mass only happens through rounding: fall back to pi.
    res = jnp.where((mass > 0)[..., None], res, pi)
    r = jnp.where(has[..., None], res, r)
    z = jnp.where(has, jnp.where(mass > 0, mass, 1.0), z)
  return jnp.stack(oks, axis=-1), r


def verify_tree(target: Target, kind: str, tokens: jax.Array, tree: dict,
                q: jax.Array, p: jax.Array, sq: jax.Array, sp: jax.Array,
                u: jax.Array, key_residual: jax.Array,
                key_bonus) -> TreeResult:
  """Walks a drafted tree against pi = T(q, p) and picks the next token.

  Args:
    target: the target distribution T (pi is replaced by its effective law
      ``effective(pi, S(q))`` when T is not normalised).
    kind: the proposal kind the children were drawn with (static).
    tokens: [B, N + 1] int32 block tokens (root = pending, then nodes).
    tree: the per-row tree arrays (``tree_arrays``; keys 'tree.*').
    q, p: [B, N + 1, V] unscaled drafter / verifier distributions.
    sq, sp: [B, N + 1, V] transformed ones (children were drawn from sq).
    u: [B, N] float32 accept uniforms of the nodes.
    key_residual: [B] RESIDUAL key at the block start (the accepted depth
      is folded in).
    key_bonus: n [B] -> [B] keys of a bonus draw at a leaf of depth n (the
      DRAFT stream at start + n).

  Returns:
    TreeResult.
  """
  b, width, _ = p.shape
  children = tree["tree.children"]  # [B, N + 1, C]
  c_max, d_max = children.shape[-1], tree["tree.first"].shape[1] - 2
  pi, defer = target(q, p, sq, sp)  # [B, N+1, V], [B, N+1]
  if not target.normalized:
    pi = effective(pi, sq)
  ok, r = _sibling_tests(kind, pi, sq, tokens[:, 1:], children, u)
  n, path, cur, rejected, accept = walk(ok, children, d_max)
  key_n = jax.vmap(jax.random.fold_in)(key_residual, n)
  key = jnp.where(rejected, key_n, key_bonus(n))
  token = sampling.sample(key, _take(r, cur))
  defer_path = jnp.take_along_axis(defer, path, axis=1)  # [B, D + 1]
  return TreeResult(accepted=n, path=path, token=token, rejected=rejected,
                    defer=defer_path, accept=accept)


def walk(ok: jax.Array, children: jax.Array, d_max: int):
  """(accepted n [B], path [B, D + 1], last position cur [B], rejected [B],
  accept [B, N]) of :class:`TreeResult` from ``ok`` [B, W, C] bool (the
  rank-i child of block position w passes its test, as if its earlier
  siblings were rejected), ``children`` [B, W, C] (-1 padded), depth D."""
  b, width = children.shape[:2]
  # The accepted child of every parent: its first passing test (-1: none).
  first = jnp.argmax(jnp.concatenate(
      [ok, jnp.ones_like(ok[..., :1])], axis=-1), axis=-1)  # [B, W]
  nxt_of = jnp.take_along_axis(jnp.concatenate(
      [children, jnp.full_like(children[..., :1], -1)], axis=-1),
                               first[..., None], axis=-1)[..., 0]  # [B, W]
  cur = jnp.zeros((b,), jnp.int32)  # block position of the current node
  live = jnp.ones((b,), bool)
  n = jnp.zeros((b,), jnp.int32)
  path = [cur]
  for depth in range(d_max):  # index arithmetic only
    nxt = jnp.take_along_axis(nxt_of, cur[:, None], axis=1)[:, 0]
    live = live & (nxt >= 0)
    cur = jnp.where(live, nxt + 1, cur)
    n = n + live.astype(jnp.int32)
    path.append(jnp.where(live, cur, depth + 1))
  path = jnp.stack(path, axis=1).astype(jnp.int32)  # [B, D + 1]
  rejected = jnp.take_along_axis(children[..., 0], cur[:, None],
                                 axis=1)[:, 0] >= 0
  iota_n = jnp.arange(1, width)[None, None, :]
  accept = jnp.any((path[:, 1:, None] == iota_n) & (
      jnp.arange(1, d_max + 1)[None, :, None] <= n[:, None, None]), axis=1)
  return n, path, cur, rejected, accept

