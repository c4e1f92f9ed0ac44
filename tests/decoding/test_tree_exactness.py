"""Statistical exactness of tree verification (slow).

Same machinery as ``test_exactness.py`` (its exact-law enumeration and
``assert_same_law``): 24,000 generations of 3 tokens in one batched call
from a tiny 8-token Gemma pair, compared (chi-square and TV) with the
exactly enumerated law of the token-level process that samples every token
from effective(T(q, p), S(q)). The pair is flatter than the chain test's
(embeddings x4, not x20) so that first children are often rejected and the
later siblings' proposals matter: a kernel that tests a without-replacement
sibling against S(q) instead of the renormalised remainder fails here.

The tree has a node with three children, a node with two, a leaf at depth 1
and leaves at depth 2, so blocks exercise several sibling rejections,
descents, residual draws after 1-3 rejections and bonus draws at leaves of
both depths.
"""

import functools

import jax
import numpy as np
import pytest

from specdec_jax import decoding, models
from specdec_jax.decoding.verify.tree import PROPOSALS
from tests.decoding import reference as ref
from tests.decoding import test_exactness as ex

SCALE = 12.0
# root: 3 children (0, 1, 2); node 0: 2 children (3, 4); node 1: 1 child (5).
TREE = decoding.Topology.from_widths([[3], [2, 1, 0]])
STRATEGIES = {"T1": (decoding.Temperature(1.0), (1.0, 1.0)),
              "T0.5": (decoding.Temperature(0.5), (0.5, 1.0)),
              "topp0.8": (decoding.TopP(0.8), (1.0, 0.8))}
CASES = [("spec_decode", {}, s, kind) for kind in PROPOSALS
         for s in STRATEGIES] + [
             ("lossy", dict(alpha=0.3, beta=1.0), "T1", "without_replacement"),
             ("opt", dict(alpha=0.5), "T1", "without_replacement"),
             ("token_v3", dict(alpha=0.5), "T1", "without_replacement"),
             ("chow", dict(alpha=0.75), "T0.5", "iid"),
             ("token_v3", dict(alpha=0.5), "topp0.8", "top_k"),
         ]


@functools.lru_cache(maxsize=None)
def pair():
  """(drafter, verifier, q_params, p_params): the 8-token pair, flatter."""
  model = ex.pair()[0]

  def params(seed):
    p = model.init_params(jax.random.PRNGKey(seed))
    p["embedder"]["input_embedding"] = p["embedder"]["input_embedding"] * (
        SCALE)
    return p

  return model, model, params(1), params(2)


@functools.lru_cache(maxsize=None)
def contexts():
  """prefix tuple -> (q_logits [V], p_logits [V]) float64, every prefix of
  length < NEW."""
  drafter, verifier, qp, pp = pair()
  prefixes = [()]
  for _ in range(ex.NEW - 1):
    prefixes += [pre + (v,) for pre in prefixes
                 if len(pre) == len(prefixes[-1]) for v in range(ex.V)]
  toks = np.zeros((len(prefixes), len(ex.PROMPT) + ex.NEW - 1), np.int32)
  for i, pre in enumerate(prefixes):
    seq = ex.PROMPT + list(pre)
    toks[i, :len(seq)] = seq
  ql = np.asarray(drafter.forward(qp, toks), np.float64)
  pl = np.asarray(verifier.forward(pp, toks), np.float64)
  at = [len(ex.PROMPT) + len(pre) - 1 for pre in prefixes]
  return {pre: (ql[i, at[i]], pl[i, at[i]]) for i, pre in enumerate(prefixes)}


def exact_law(name, temperature, top_p, **knobs):
  """Exact probability of every 3-token continuation, [V] * 3 array."""
  ctx = contexts()
  law = np.zeros((ex.V,) * ex.NEW)
  for idx in np.ndindex(law.shape):
    prob = 1.0
    for t in range(ex.NEW):
      ql, pl = ctx[tuple(idx[:t])]
      sq = ref.transform(ql, temperature, top_p)
      sp = ref.transform(pl, temperature, top_p)
      pi = ref.target(name, ref.softmax(ql), ref.softmax(pl), sq, sp,
                      **knobs)
      prob *= ref.effective(pi, sq)[idx[t]]
      if prob == 0:
        break
    law[idx] = prob
  return law


def sample_law(method, strategy, kind):
  drafter, verifier, qp, pp = pair()
  out = decoding.generate(method, drafter, verifier, qp, pp,
                          [ex.PROMPT] * ex.N, sampling=strategy,
                          max_new_tokens=ex.NEW, seeds=7, eos_id=None,
                          tree=decoding.Tree(TREE, kind))
  assert (out.lengths == ex.NEW).all()
  flat = np.ravel_multi_index(out.tokens[:, :ex.NEW].T, (ex.V,) * ex.NEW)
  counts = np.bincount(flat, minlength=ex.V**ex.NEW)
  return counts.reshape((ex.V,) * ex.NEW), out


@pytest.mark.slow
@pytest.mark.parametrize("name,knobs,strategy,kind", CASES,
                         ids=[f"{c[0]}-{c[2]}-{c[3]}" for c in CASES])
def test_tree_output_law_matches_token_level_process(name, knobs, strategy,
                                                      kind):
  strat, st = STRATEGIES[strategy]
  law = exact_law(name, *st, **knobs)
  counts, out = sample_law(ex._method(name, knobs), strat, kind)
  ex.assert_same_law(counts, law)
  assert 0.0 < out.acceptance_rate < 1.0
  if name not in ("spec_decode", "lossy"):
    assert 0.02 < out.deferral_rate < 0.98, out.deferral_rate
