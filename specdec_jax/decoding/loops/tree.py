"""The tree speculative loop: draft a token tree, verify it in ONE step.

Each iteration of the ``lax.while_loop``:

1. level 0 (the drafter) drafts a tree per row (``tree_drafting.py``: D + 1
   block calls over [root, nodes] with ancestor masks);
2. level 1 (the verifier) scores the whole block ``[pending, nodes]`` in ONE
   step with ``positions = lengths + depth`` and the ancestor mask;
3. the recursive rejection walk of ``verify/tree.py`` picks the accepted
   path and one more token (exact for the method's target pi = T(q, p));
4. the path and the token are emitted; both caches keep the path with
   ``cache.commit(start, [root, path...], 1 + accepted)``.

The tree is DATA: per-row arrays in ``Batch.structure`` (a ``TreeArrays``,
``structure_data.py``), so every tree with the same (nodes N, max depth D,
max children C), the same nodes per level and the same proposal kind shares
one compiled program (the program key holds only those: ``TreeConfig``
compares by shape and level sizes; the drafter is fed each level at its
exact width, ``verify.tree.level_sizes``). A
chain-shaped tree gives exactly the chain loop's tokens, up to float rounding of the drafter's block steps.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax

from specdec_jax.decoding.loops import state as state_lib
from specdec_jax.decoding.loops.program import LoopProgram
from specdec_jax.decoding.loops.output import BlockTrace, output
from specdec_jax.decoding.loops.state import (
    Batch, DraftState, Level, LoopConfig, Stream, all_finite)
from specdec_jax.decoding.loops.tree_drafting import draft_tree
from specdec_jax.decoding.rules import keys as keys_lib
from specdec_jax.decoding.rules import sampling
from specdec_jax.decoding.verify import tree as tree_lib
from specdec_jax.decoding.verify import greedy
from specdec_jax.decoding.verify.topology import Topology


@dataclasses.dataclass(frozen=True)
class TreeConfig(LoopConfig):
  """A LoopConfig whose draft block is a tree (``topology``).

  Equality and hash (the program key) see the tree's SHAPE and level
  sizes, not the tree: ``topology`` is excluded from them, the tree itself
  is batch data.

  Attributes:
    proposal: how children are drawn (``verify.tree.PROPOSALS``).
    drafter_sync: 'commit' or 'catchup' (resolved, see ``verify.tree.Tree``).
    shape: (nodes N, max depth D, max children C), set from ``topology``.
    levels: block positions of each depth 0..D (``level_sizes``), set from
      ``topology``: the widths the drafter's level calls compile at.
  """

  topology: Topology = dataclasses.field(compare=False)
  proposal: str = "without_replacement"
  drafter_sync: str = "commit"
  shape: tuple[int, int, int] = ()
  levels: tuple[int, ...] = ()

  def __post_init__(self):
    t = self.topology
    object.__setattr__(self, "shape",
                       (t.num_nodes, t.max_depth, t.max_children))
    object.__setattr__(self, "levels", tree_lib.level_sizes(t))


def _body(models, params, batch: Batch, cfg: TreeConfig, rule,
          state: DraftState) -> DraftState:
  drafter, verifier = models
  (q_level, p_level), stream = state.levels, state.stream
  target, _ = rule.bind(batch.knobs)
  tree = batch.structure.as_dict()  # the 'tree.*' arrays of the kernels
  strategy, req, active = cfg.strategy(batch), batch.req, ~stream.done
  n_nodes, d_max, _ = cfg.shape
  commit_drafter = cfg.drafter_sync == "commit"
  start = stream.num_out
  draft = draft_tree(drafter, params[0], q_level.cache, stream.pending, start,
                     state.catchup, state.catchup_valid & active, tree,
                     strategy, req, cfg.shape, cfg.proposal, commit_drafter,
                     cfg.pad_id, cfg.levels)
  block = draft.tokens  # [B, N + 1]
  p_len = p_level.cache.lengths
  p_logits, p_cache = verifier.step(
      params[1], block, p_level.cache,
      positions=p_len[:, None] + tree["tree.depth"],
      mask=tree["tree.mask"])  # [B, N + 1, V]
  finite = stream.finite & (~active | (all_finite(draft.logits)
                                       & all_finite(p_logits)))

  def verify():
    q, p = sampling.unscaled(draft.logits), sampling.unscaled(p_logits)
    sp = strategy.probs(p_logits)  # [B, N + 1, V]
    u = tree_lib.node_uniforms(req.seed, req.request_id, start,
                               tree["tree.depth"][:, 1:], tree["tree.slot"])
    return tree_lib.verify_tree(
        target, cfg.proposal, block, tree, q, p, draft.sq, sp, u,
        key_residual=keys_lib.row_keys(req.seed, req.request_id, start,
                                       keys_lib.RESIDUAL),
        key_bonus=lambda n: keys_lib.row_keys(req.seed, req.request_id,
                                              start + n, keys_lib.DRAFT))

  if greedy.greedy_verifiable(target, None):
    out = lax.cond(sampling.is_cold(strategy),
                   lambda: greedy.verify_tree_greedy(block, tree, p_logits),
                   verify)
  else:
    out = verify()

  n, tok = out.accepted, out.token  # [B], [B]
  iota = jnp.arange(d_max + 1)[None, :]
  path_tok = jnp.take_along_axis(block, out.path, axis=1)  # [B, D + 1]
  path_tok = jnp.concatenate([path_tok[:, 1:], path_tok[:, :1]], axis=1)
  cand = jnp.where(iota < n[:, None], path_tok,
                   jnp.where(iota == n[:, None], tok[:, None], cfg.pad_id))
  new_stream, _ = stream.emit(cand, n + 1, req, cfg, finite, out.defer)

  keep = lambda new, old: jnp.where(active, new, old)
  p_cache = p_cache.commit(p_len, out.path, 1 + n)
  lag = jnp.zeros_like(active) if commit_drafter else n == d_max
  q_cache = draft.cache.commit(draft.start, out.path,
                               1 + n - lag.astype(jnp.int32))
  q_level = q_level.replace(cache=q_cache.with_lengths(
      keep(q_cache.lengths, q_level.cache.lengths))).count(
          active, calls=draft.calls)
  p_level = p_level.replace(cache=p_cache.with_lengths(
      keep(p_cache.lengths, p_len))).count(active, calls=1, drafted=n_nodes,
                                           accepted=n)
  last = jnp.take_along_axis(block, out.path[:, -1:], axis=1)[:, 0]
  trace = state.trace
  if trace is not None:
    trace = trace.record(stream.step, active, block[:, 1:], out.accept, n,
                         tok)
  return DraftState(stream=new_stream, levels=(q_level, p_level),
                   catchup=keep(last, state.catchup),
                   catchup_valid=keep(lag, state.catchup_valid), trace=trace)


def runs_as_chain(cfg: TreeConfig) -> bool:
  """Whether the chain loop decodes this tree with identical results.

  A chain-shaped tree (one child per node) whose proposal draws rank 0 from
  S(q) (every kind but 'top_k') drafts, verifies and samples exactly as the
  chain loop of gamma = its depth, with the same keys (tested in
  tests/decoding/test_tree_decode.py); the chain loop needs no per-level
  masks or logits gathers, so it is faster.
  """
  return cfg.topology.is_chain and cfg.proposal != "top_k"


def as_chain(cfg: TreeConfig) -> LoopConfig:
  """The chain LoopConfig of a ``runs_as_chain`` tree config."""
  fields = {f.name: getattr(cfg, f.name)
            for f in dataclasses.fields(LoopConfig)}
  return LoopConfig(**fields)


def make_config(tree, method, vocab_size: int, **loop_fields) -> TreeConfig:
  """The TreeConfig of ``generate(..., tree=tree)``, checked on the host.

  Args:
    tree: a ``verify.tree.Tree`` (or a Topology: default proposal).
    method: the decoding method (must run on trees).
    vocab_size: the models' vocabulary size.
    **loop_fields: the other LoopConfig fields (max_new, eos_id, ...).

  Raises:
    ValueError for a method that cannot run on trees, more children than
    the vocabulary, or a proposal the method cannot use.
  """
  if isinstance(tree, Topology):
    tree = tree_lib.Tree(tree)
  if not isinstance(tree, tree_lib.Tree):
    raise ValueError(f"tree must be a decoding.Tree (e.g. decoding.Tree("
                     f"decoding.Topology.kary(2, 3))), got "
                     f"{type(tree).__name__}")
  name = type(getattr(method, "target", method)).__name__
  if not getattr(method, "trees", False):
    raise ValueError(
        f"{name} does not run on draft trees (only speculative methods "
        f"with a target T(q, p) do: spec_decode, lossy, the cascades, "
        f"bild_star; BiLD's fallback stop drafts a chain); drop tree= or "
        f"pick another method")
  n, d, c = tree.shape
  if c > vocab_size:
    raise ValueError(f"the tree has a node with {c} children but the "
                     f"vocabulary has only {vocab_size} tokens; use at most "
                     f"{vocab_size} children per node")
  if method.greedy_only and tree.proposal == "iid" and c > 1:
    raise ValueError(
        f"{name} is greedy: i.i.d. children of a greedy drafter are all "
        f"its argmax (duplicates); use proposal='top_k' or "
        f"'without_replacement'")
  needs_q = bool(method.target.needs_drafter_at_bonus)
  sync = tree.drafter_sync
  if sync == "auto":
    sync = "commit" if needs_q else "catchup"
  if sync == "catchup" and needs_q:
    raise ValueError(f"drafter_sync='catchup' skips the drafter's call at "
                     f"the leaves, but {name} reads q there (the bonus "
                     f"target); use 'commit' or 'auto'")
  return TreeConfig(topology=tree.topology, proposal=tree.proposal,
                    drafter_sync=sync, **loop_fields)


def tree_program(models: tuple, cfg: TreeConfig, rule) -> LoopProgram:
  """Tree speculative decoding of a (drafter, verifier) pair.

  Args:
    models: (drafter, verifier) DecodeModels sharing a vocabulary.
    cfg: static TreeConfig; only its tree SHAPE (N, D, C), level sizes
      and proposal enter the program (the tree itself is batch data).
    rule: the method's static rule (``methods.TargetRule``).
  """
  if not isinstance(cfg, TreeConfig):
    raise ValueError("the tree loop needs a TreeConfig (pass tree= to "
                     "decoding.generate)")
  shape = cfg.shape

  def init(args) -> DraftState:
    params, batch = args
    b, width = batch.prompt.shape
    cap = state_lib.capacity(width, cfg, chunk=1)  # + a catch-up token
    q_cache, pending = state_lib.start_cache(models[0], params[0], batch, cap)
    p_cache, _ = state_lib.start_cache(models[1], params[1], batch, cap)
    trace = (BlockTrace.start(b, cfg.max_new, shape[0]) if cfg.trace
             else None)
    return DraftState(
        stream=Stream.start(pending, batch.req, cfg.max_new + shape[1] + 1,
                            cfg.pad_id),
        levels=(Level.start(q_cache, b), Level.start(p_cache, b)),
        catchup=jnp.zeros((b,), jnp.int32),
        catchup_valid=jnp.zeros((b,), bool), trace=trace)

  def cond(args, s: DraftState):
    return (s.stream.step < cfg.max_new) & ~jnp.all(s.stream.done)

  def body(args, s: DraftState) -> DraftState:
    params, batch = args
    return _body(models, params, batch, cfg, rule, s)

  def finish(args, s: DraftState):
    return output(s.stream, s.levels, cfg, trace=s.trace)

  # cfg compares by the tree's shape and level sizes: such trees share it.
  return LoopProgram(("tree", models, cfg, rule), init, cond, body, finish)
