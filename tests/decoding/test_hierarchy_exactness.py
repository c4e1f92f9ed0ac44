"""Statistical exactness of hierarchical speculative decoding (slow).

24,000 generations of 3 tokens per case in ONE call (one row per request
id), on stacks of tiny random Gemmas over an 8-token vocabulary; the
empirical law of the 512 sequences is compared with the exact law
(chi-square, false alarm 1e-4, and TV below the null mean + 6 sd) from
``test_exactness.py``'s enumeration: the target's own law for lossless
stacks (Theorem 2.1), the token-level T(q, p) process (q = the level below
the top) for a cascade at the top.
"""

import functools

import jax
import pytest

from specdec_jax import decoding, models
from specdec_jax.decoding.hierarchy.api import generate_hierarchy
from tests.decoding import test_exactness as ex

T1 = decoding.Temperature(1.0)


@functools.lru_cache(maxsize=None)
def extra_params(seed):
  """Another peaked random model of the same shape (a cheaper level)."""
  model = ex.pair()[0]
  p = model.init_params(jax.random.PRNGKey(seed))
  p["embedder"]["input_embedding"] = p["embedder"]["input_embedding"] * 20.0
  return p


def stack(depth):
  """[(model, params)] * (depth + 1); the top two are ex.pair()'s q and p,
  so ex.exact_law applies with q = the level below the top."""
  model, _, qp, pp = ex.pair()
  low = [(model, extra_params(s)) for s in (4, 3)][2 - (depth - 1):]
  return low + [(model, qp), (model, pp)]


def sample(levels, buffers, strategy, method=None, lenient=None):
  out = generate_hierarchy(levels, buffers, [ex.PROMPT] * ex.N,
                           method=method, lenient=lenient,
                           sampling=strategy, max_new_tokens=ex.NEW,
                           seeds=7, eos_id=None)
  assert (out.lengths == ex.NEW).all()
  import numpy as np  # pylint: disable=g-import-not-at-top
  flat = np.ravel_multi_index(out.tokens[:, :ex.NEW].T, (ex.V,) * ex.NEW)
  counts = np.bincount(flat, minlength=ex.V**ex.NEW).reshape(
      (ex.V,) * ex.NEW)
  return counts, out


CASES = [
    # depth (K), buffers, sampling, (temperature, top_p)
    (2, (2, 4), T1, (1.0, 1.0)),
    (2, (3, 2), T1, (1.0, 1.0)),   # T_1 smaller than the batch below
    (2, (1, 5), decoding.Temperature(0.5), (0.5, 1.0)),
    (2, (2, 3), decoding.TopP(0.8), (1.0, 0.8)),
    (3, (2, 3, 6), T1, (1.0, 1.0)),
    (3, (3, 1, 2), decoding.Temperature(0.5), (0.5, 1.0)),
    (3, (1, 2, 4), decoding.TopP(0.8), (1.0, 0.8)),
]


@pytest.mark.slow
@pytest.mark.parametrize("depth,buffers,strategy,st", CASES,
                         ids=[f"K{c[0]}-{c[1]}-{i}"
                              for i, c in enumerate(CASES)])
def test_lossless_stack_is_exactly_the_target(depth, buffers, strategy, st):
  counts, out = sample(stack(depth), buffers, strategy)
  ex.assert_same_law(counts, ex.exact_law("spec_decode", *st))
  alphas = out.level_acceptance()[1:]
  assert all(0.0 < a < 1.0 for a in alphas), alphas  # real rejections
  assert (out.calls > 0).all()


@pytest.mark.slow
def test_lenient_middle_level_with_exact_top_is_still_the_target():
  levels = stack(2)
  counts, out = sample(levels, (2, 4), T1,
                       lenient={1: decoding.make_method("token_v3",
                                                        alpha=0.6)})
  ex.assert_same_law(counts, ex.exact_law("spec_decode", 1.0, 1.0))
  assert out.level_acceptance()[1] > 0.0


@pytest.mark.slow
@pytest.mark.parametrize("name,knobs", [("opt", dict(alpha=0.5)),
                                        ("token_v3", dict(alpha=0.5))])
def test_cascade_at_the_top_of_a_hierarchy(name, knobs):
  """A speculative cascade whose drafts come from a hierarchy: every token
  follows the token-level T(q, p) process with q = the level below."""
  counts, out = sample(stack(2), (2, 3), T1,
                       method=decoding.make_method(name, **knobs))
  ex.assert_same_law(counts, ex.exact_law(name, 1.0, 1.0, **knobs))
  assert 0.02 < out.deferral_rate < 0.98


def test_cases_use_distinct_models():
  seeds = {id(p) for _, p in stack(3)}
  assert len(seeds) == 4 and isinstance(stack(3)[0][0], models.GemmaModel)
