"""Inputs of the tree planner, measured: per-rank acceptance and block costs.

* ``rank_acceptance``: replays recorded (q, p) logit pairs through the EXACT
  tree primitive (``verify.tree.verify_tree`` on a one-level tree, children
  drawn by the loop's own proposal code) and counts, per rank j, how often
  child j is accepted when it is tested (all earlier siblings rejected).
* ``calibrate``: records those pairs from teacher-forced passes (the
  target's own continuation of a few prompts, then one forward of each model
  over prompt + continuation), then calls ``rank_acceptance``.
* ``measure_costs``: seconds of a drafter / verifier block step of w tokens
  (tree mask and positions given, as the tree loop calls them) in a jitted
  loop on this machine, at the serving batch size.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import timing
from specdec_jax.decoding import inputs as inputs_lib
from specdec_jax.decoding.loops.tree_drafting import draw_children
from specdec_jax.decoding.methods import TargetOnly
from specdec_jax.decoding.api import decode
from specdec_jax.decoding.rules import sampling as sampling_lib
from specdec_jax.decoding.rules.knobs import split
from specdec_jax.decoding.strategy import Strategy
from specdec_jax.decoding.verify import tree as tree_lib
from specdec_jax.decoding.verify.topology import Topology


def rank_acceptance(target, strategy, kind: str, q_logits, p_logits,
                    children: int, sims: int = 64,
                    seed: int = 0) -> tuple[float, ...]:
  """Per-rank acceptance a_j of the tree primitive on recorded logits.

  Args:
    target: the method's target T(q, p) (``method.target``).
    strategy: the sampling transform S.
    kind: proposal kind (``verify.tree.PROPOSALS``).
    q_logits, p_logits: [M, V] recorded drafter / verifier logits at the
      same M contexts.
    children: K, ranks to calibrate.
    sims: simulated nodes per context.
    seed: randomness of the simulation.

  Returns:
    (a_0, .., a_{K-1}): a_j = P(child j accepted | children < j rejected)
    (0 where no simulation reached rank j).
  """
  q_logits = np.asarray(q_logits, np.float32)
  p_logits = np.asarray(p_logits, np.float32)
  m, v = q_logits.shape
  # The simulation holds ~_ARRAYS_PER_ROW [rows, children + 1, V] float32
  # arrays: contexts go through it in chunks that fit _CHUNK_BYTES (a 256k
  # vocabulary with 256 contexts x 64 sims would otherwise ask for >1 TB).
  per_context = sims * (children + 1) * v * 4 * _ARRAYS_PER_ROW
  chunk = max(1, min(m, _CHUNK_BYTES // per_context))
  reached = np.zeros(children, np.int64)
  accepted = np.zeros(children, np.int64)
  for i, start in enumerate(range(0, m, chunk)):
    n = min(chunk, m - start)
    idx = np.arange(start, start + chunk) % m  # the last chunk wraps ...
    valid = np.repeat(np.arange(chunk) < n, sims)  # ... and is masked
    key = jax.random.key(seed)
    if i:
      key = jax.random.fold_in(key, i)
    counts = _simulate(target, strategy, kind,
                       jnp.repeat(jnp.asarray(q_logits[idx]), sims, axis=0),
                       jnp.repeat(jnp.asarray(p_logits[idx]), sims, axis=0),
                       children, key, jnp.asarray(valid))
    reached += np.asarray(counts[0])
    accepted += np.asarray(counts[1])
  return tuple(float(a / r) if r else 0.0 for a, r in zip(accepted, reached))


_CHUNK_BYTES = 1 << 30
_ARRAYS_PER_ROW = 8


def _simulate(target, strategy, kind, q_logits, p_logits, k, key, valid):
  static, knobs = split(target)
  s_static, s_knobs = split(sampling_lib.canonical(strategy))
  return _simulate_jit(static, s_static, kind, k, knobs, s_knobs, q_logits,
                       p_logits, key, valid)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _simulate_jit(static, s_static, kind, k, knobs, s_knobs, q_logits,
                  p_logits, key, valid):
  """Counts (reached [k], accepted [k]) over the rows where ``valid`` [b]."""
  b, v = q_logits.shape
  target, strategy = static.bind(knobs), s_static.bind(s_knobs)
  topo = Topology.from_widths([[k]])
  arrays = {n: jnp.asarray(a) for n, a in
            tree_lib.tree_arrays(topo, b).items()}
  sq = strategy.probs(q_logits)
  k_draw, k_u, k_res, k_bonus = jax.random.split(key, 4)
  row_keys = jax.random.split(k_draw, b)
  keys_at = lambda slots: jax.vmap(lambda kk, ss: jax.vmap(
      lambda s: jax.random.fold_in(kk, s))(ss))(row_keys, slots)
  kids = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (b, 1, k))
  toks = draw_children(kind, q_logits[:, None], sq[:, None], kids,
                       jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32),
                                        (b, k)), keys_at, k)[:, 0]  # [b, k]
  block = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), toks], axis=1)
  rep = lambda x: jnp.repeat(x[:, None], k + 1, axis=1)  # [b, k + 1, V]
  out = tree_lib.verify_tree(
      target, kind, block, arrays, rep(jax.nn.softmax(q_logits)),
      rep(jax.nn.softmax(p_logits)), rep(sq), rep(strategy.probs(p_logits)),
      jax.random.uniform(k_u, (b, k)), jax.random.split(k_res, b),
      lambda n: jax.random.split(k_bonus, b))
  rank = jnp.where(out.accepted > 0, out.path[:, 1] - 1, k)  # k: none
  iota = jnp.arange(k)[None, :]
  ok = valid[:, None]
  reached = jnp.sum((rank[:, None] >= iota) & ok, axis=0)
  accepted = jnp.sum((rank[:, None] == iota) & ok, axis=0)
  return reached, accepted


def _forward_logits(model, params, prefix, inputs=None):
  """Logits of ``model`` after every prefix of rows [B, T] (one step)."""
  enc = model.encode(params, inputs) if model.is_encoder_decoder else None
  cache = model.init_cache(prefix.shape[0], prefix.shape[1] + 1, enc)
  logits, _ = model.step(params, prefix, cache)
  return logits  # [B, T, V]


def calibrate(method, drafter, verifier, q_params, p_params, prompts=None,
              *, inputs=None, sampling=None, proposal: str = (
                  "without_replacement"), children: int = 8,
              new_tokens: int = 32, sims: int = 64,
              seed: int = 0) -> tuple[float, ...]:
  """Per-rank acceptance of ``method`` from teacher-forced passes.

  The target continues each prompt (``new_tokens``, target-only decoding at
  ``sampling``); both models then score prompt + continuation in one
  forward each, and the (q, p) pairs at the continuation's positions are
  replayed through the tree primitive (``rank_acceptance``).

  Args:
    method: a speculative method (its target T).
    drafter, verifier, q_params, p_params: the pair.
    prompts / inputs: as for ``decoding.generate``.
    sampling: sampling strategy (default greedy).
    proposal: proposal kind.
    children: ranks to calibrate.
    new_tokens: continuation length per prompt.
    sims: simulated nodes per recorded position.
    seed: randomness.

  Returns:
    (a_0, ..., a_{children-1}).
  """
  strategy = sampling_lib.Greedy() if sampling is None else sampling
  out = decode(Strategy(TargetOnly(), sampling=strategy),
               (drafter, verifier), (q_params, p_params), prompts, inputs=inputs,
               max_new_tokens=new_tokens, seeds=seed, eos_id=None)
  if verifier.is_encoder_decoder:
    start = getattr(verifier.config, "decoder_start_id", 0)
    rows = [[start] + s for s in out.sequences()]
    enc, _ = inputs_lib.pad_ragged(inputs, inputs_lib.PAD_TO, "inputs")
    enc = jnp.asarray(enc, jnp.int32)
  else:
    rows = [list(p) + s for p, s in zip(prompts, out.sequences())]
    enc = None
  starts = [len(r) - len(s) - 1 for r, s in zip(rows, out.sequences())]
  width = max(len(r) for r in rows)
  toks = jnp.asarray([r + [0] * (width - len(r)) for r in rows], jnp.int32)
  ql = _forward_logits(drafter, q_params, toks, enc)
  pl = _forward_logits(verifier, p_params, toks, enc)
  pick = [(b, t) for b, (s, r) in enumerate(zip(starts, rows))
          for t in range(s, len(r) - 1)]
  bi, ti = (np.asarray(x) for x in zip(*pick))
  return rank_acceptance(method.target, strategy, proposal,
                         np.asarray(ql)[bi, ti], np.asarray(pl)[bi, ti],
                         children, sims, seed)


@dataclasses.dataclass(frozen=True)
class Costs:
  """Measured seconds of block steps, by block width.

  Attributes:
    widths: measured block widths (ascending, starting at 1).
    drafter_s, verifier_s: seconds of one block step of each width.
    overhead: seconds per loop iteration outside model calls.
    node_overhead: further seconds per iteration per tree node (work the
      loop does for every node: draws, acceptance, masks).
    depth_overhead: further seconds per iteration per tree level (the
      drafter's calls' non-model work: a top-k draw per level).
    drafter_level_fed: tree drafting feeds the drafter one level per call
      (its ``masks_cached_slots``; the built-in models) rather than the
      block prefix per call.
  """

  widths: tuple[int, ...]
  drafter_s: tuple[float, ...]
  verifier_s: tuple[float, ...]
  overhead: float = 0.0
  drafter_level_fed: bool = True
  node_overhead: float = 0.0
  depth_overhead: float = 0.0

  def drafter(self, w: int) -> float:
    return float(np.interp(w, self.widths, self.drafter_s))

  def verifier(self, w: int) -> float:
    return float(np.interp(w, self.widths, self.verifier_s))


def _block_seconds(model, params, batch: int, width: int, iters: int,
                   repeats: int) -> float:
  """Median seconds of one tree-masked block step of ``width`` tokens
  (``timing.step_timer``'s jitted loop)."""
  timer = timing.step_timer(model, params, batch, width,
                            mask=np.tril(np.ones((width, width), bool)),
                            min_iters=iters)
  return timing.medians({"t": timer}, repeats)["t"]


def measure_costs(drafter, verifier, q_params, p_params, batch: int = 1,
                  widths: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
                  iters: int = 16, repeats: int = 5,
                  overhead: float = 0.0) -> Costs:
  """Times drafter and verifier block steps of each width (this machine).

  Args:
    drafter, verifier, q_params, p_params: the pair.
    batch: serving batch size.
    widths: block widths to time (costs are interpolated in between).
    iters: steps per jitted loop; repeats: loops timed (median kept).
    overhead: seconds per iteration outside model calls.

  Returns:
    Costs.
  """
  widths = tuple(sorted({1, *map(int, widths)}))
  d = tuple(_block_seconds(drafter, q_params, batch, w, iters, repeats)
            for w in widths)
  v = tuple(_block_seconds(verifier, p_params, batch, w, iters, repeats)
            for w in widths)
  return Costs(widths, d, v, overhead,
               bool(getattr(drafter, "masks_cached_slots", False)))
