"""models.NgramModel: the prompt-lookup drafter (hand example, cache and tree
consistency, greedy equality with the target, statistical exactness)."""

import functools

import jax
import numpy as np
import pytest

from specdec_jax import decoding, models
from tests.decoding import reference as ref
from tests.decoding import test_exactness as ex


def test_docstring_example_and_spread():
  m = models.NgramModel(16)
  logits = np.asarray(m.forward({}, np.array([[7, 3, 9, 4, 7, 3]])))
  # No earlier match -> repeat the last token; [7] -> 3; [7, 3] -> 9.
  np.testing.assert_array_equal(logits[0].argmax(-1), [7, 3, 9, 4, 3, 9])
  assert ((logits[0] > -1).sum(-1) == 1).all()  # one-hot
  tree = models.NgramModel(16, ns=(1,), spread=True)
  q = jax.nn.softmax(tree.forward({}, np.array([[7, 3, 7, 4, 7, 3, 7]]))[0, -1])
  # [7] was followed by 3, 4, 3: counts 2 and 1, +0.5 for the most recent (3).
  np.testing.assert_allclose(np.asarray(q)[[3, 4]], [2.5 / 3.5, 1 / 3.5], rtol=1e-6)
  assert m.num_params() == 0 and m.init_params() == {}
  with pytest.raises(ValueError, match="ns must be a non-empty list"):
    models.NgramModel(16, ns=())


def test_cached_steps_rollbacks_and_trees_match_forward():
  m = models.NgramModel(8, ns=(2, 1), spread=True)
  step, forward = jax.jit(m.step), jax.jit(m.forward)  # op by op: 40 s
  rng = np.random.default_rng(0)
  seq = rng.integers(0, 8, (2, 14))
  ref_logits = np.asarray(forward({}, seq))
  cache = m.init_cache(2, 20)
  l1, cache = step({}, seq[:, :5], cache)
  l2, cache = step({}, seq[:, 5:6], cache)
  _, cache = step({}, rng.integers(0, 8, (2, 3)), cache)  # rejected block
  cache = cache.with_lengths(np.array([6, 6]))
  l3, cache = step({}, seq[:, 6:], cache)
  np.testing.assert_array_equal(np.concatenate([l1, l2, l3], 1), ref_logits)
  # A tree block: root r, children a, b of r, child c of a.
  prefix, block = seq[:, :6], seq[:, 6:10]
  parents = [-1, 0, 0, 1]
  depth = np.array([0, 1, 1, 2])
  mask = np.array([[j == i or j in _ancestors(parents, i) for j in range(4)]
                   for i in range(4)])
  cache = m.init_cache(2, 20)
  _, cache = step({}, prefix, cache)
  got, _ = step({}, block, cache, positions=6 + depth[None].repeat(2, 0),
                  mask=mask[None].repeat(2, 0))
  for i in range(4):
    path = [j for j in range(4) if mask[i, j]]
    full = np.concatenate([prefix, block[:, path]], 1)
    np.testing.assert_array_equal(got[:, i], np.asarray(
        forward({}, full))[:, -1])


def _ancestors(parents, i):
  out = []
  while parents[i] >= 0:
    i = parents[i]
    out.append(i)
  return out


PROMPTS = [[2, 11, 12, 13, 14, 11, 12, 13], [2, 5, 6, 5, 6, 5, 6]]


@pytest.mark.parametrize("tree", [None, decoding.Topology.from_widths(
    [[2], [2, 1]])])
def test_greedy_speculation_equals_target(tree):
  target = models.get_model("gemma3_tiny")
  params = target.init_params(jax.random.PRNGKey(0))
  kw = dict(max_new_tokens=12, eos_id=None)
  base = decoding.generate(decoding.make_method("target_only"), target, target,
                           params, params, PROMPTS, **kw)
  drafter = models.NgramModel(target.vocab_size, spread=tree is not None)
  out = decoding.generate(
      decoding.make_method("spec_decode"), drafter, target, {}, params,
      PROMPTS, gamma=3, tree=None if tree is None else decoding.Tree(tree),
      **kw)
  np.testing.assert_array_equal(out.tokens, base.tokens)


NGRAM_PROMPT = [2, 5, 2, 5, 2]


@functools.lru_cache(maxsize=None)
def p_law():
  """Exact law of 3 tokens sampled from the verifier after NGRAM_PROMPT."""
  verifier, pp = ex.pair()[1], ex.pair()[3]
  prefixes = [()]
  for _ in range(ex.NEW - 1):
    prefixes += [pre + (v,) for pre in prefixes
                 if len(pre) == len(prefixes[-1]) for v in range(ex.V)]
  toks = np.zeros((len(prefixes), len(NGRAM_PROMPT) + ex.NEW - 1), np.int32)
  for i, pre in enumerate(prefixes):
    toks[i, :len(NGRAM_PROMPT) + len(pre)] = NGRAM_PROMPT + list(pre)
  pl = np.asarray(verifier.forward(pp, toks), np.float64)
  ctx = {pre: ref.softmax(pl[i, len(NGRAM_PROMPT) + len(pre) - 1])
         for i, pre in enumerate(prefixes)}
  law = np.zeros((ex.V,) * ex.NEW)
  for idx in np.ndindex(law.shape):
    law[idx] = np.prod([ctx[tuple(idx[:t])][idx[t]] for t in range(ex.NEW)])
  return law


@pytest.mark.slow
@pytest.mark.parametrize("tree", [False, True])
def test_ngram_speculation_is_exact(tree):
  """Speculative sampling with the n-gram q samples the verifier's law."""
  verifier, pp = ex.pair()[1], ex.pair()[3]
  drafter = models.NgramModel(ex.V, spread=tree)
  kw = {}
  if tree:
    kw["tree"] = decoding.Tree(decoding.Topology.from_widths([[2], [2, 1]]),
                               "without_replacement")
  out = decoding.generate(decoding.make_method("spec_decode"), drafter,
                          verifier, {}, pp, [NGRAM_PROMPT] * ex.N,
                          sampling=ex.T1, gamma=3, max_new_tokens=ex.NEW,
                          seeds=7, eos_id=None, **kw)
  assert (out.lengths == ex.NEW).all()
  flat = np.ravel_multi_index(out.tokens[:, :ex.NEW].T, (ex.V,) * ex.NEW)
  counts = np.bincount(flat, minlength=ex.V**ex.NEW).reshape((ex.V,) * ex.NEW)
  ex.assert_same_law(counts, p_law())
  assert 0.0 < out.acceptance_rate < 1.0  # the drafts are really tested
