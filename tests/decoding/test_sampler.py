"""The token sampler and argmax used on the decode hot path.

``sampling.sample`` searches a two-level prefix sum (blocks of ~sqrt(V));
these tests pin its contract: exact argmax on one-hot rows, zero-mass entries
never drawn, an all-zero row gives 0, unnormalised weights work, and the law
of the draws is the normalised distribution (chi-square, false alarm 1e-4).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specdec_jax.decoding.rules import sampling

FALSE_ALARM = 1e-4


def keys(n, seed=0):
  return jax.random.split(jax.random.key(seed), n)


@pytest.mark.parametrize("v", [1, 3, 16, 37, 1000, 2048, 32128])
def test_one_hot_rows_give_their_argmax(v):
  rows = np.array([0, v - 1, v // 2, v // 3, (7 * v) // 11]) % v
  dist = jax.nn.one_hot(rows, v)
  for seed in range(3):
    got = sampling.sample(keys(len(rows), seed), dist)
    np.testing.assert_array_equal(np.asarray(got), rows)


@pytest.mark.parametrize("v", [5, 64, 1000])
def test_zero_mass_entries_are_never_drawn(v):
  rng = np.random.default_rng(0)
  n = 4000
  dist = rng.random((n, v)) * (rng.random((n, v)) < 0.05)
  dist[np.arange(n), rng.integers(0, v, n)] = 1e-30  # tiny but positive
  dist[:7, :] = 0.0
  dist[:7, v - 1] = 1e-30  # only the last entry has mass
  got = np.asarray(sampling.sample(keys(n), jnp.asarray(dist, jnp.float32)))
  assert (dist[np.arange(n), got] > 0).all()
  np.testing.assert_array_equal(got[:7], v - 1)


def test_all_zero_row_gives_zero():
  got = sampling.sample(keys(3), jnp.zeros((3, 50)))
  np.testing.assert_array_equal(np.asarray(got), [0, 0, 0])


@pytest.mark.parametrize("v,scale", [(37, 1.0), (37, 1e-3), (300, 7.0)])
def test_draws_follow_the_normalised_distribution(v, scale):
  rng = np.random.default_rng(v)
  p = rng.dirichlet(np.full(v, 0.3))
  n = 40_000
  dist = jnp.broadcast_to(jnp.asarray(p * scale, jnp.float32), (n, v))
  got = np.asarray(sampling.sample(keys(n, seed=v), dist))
  obs = np.bincount(got, minlength=v)
  exp = p * n
  big = exp >= 5  # merge small cells
  obs_m = np.append(obs[big], obs[~big].sum())
  exp_m = np.append(exp[big], exp[~big].sum())
  if exp_m[-1] == 0:
    obs_m, exp_m = obs_m[:-1], exp_m[:-1]
  chi2 = float(((obs_m - exp_m) ** 2 / exp_m).sum())
  assert chi2 < stats.chi2.isf(FALSE_ALARM, len(exp_m) - 1), chi2


def test_argmax_matches_numpy_first_maximum():
  rng = np.random.default_rng(1)
  x = rng.integers(0, 5, (200, 2048)).astype(np.float32)  # many ties
  np.testing.assert_array_equal(np.asarray(sampling.argmax(jnp.asarray(x))),
                                np.argmax(x, axis=-1))
  y = rng.standard_normal((3, 4, 37)).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(sampling.argmax(jnp.asarray(y))),
                                np.argmax(y, axis=-1))
