"""The lean non-model paths (sampling.LEAN) give the reference's numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.rules import sampling
from specdec_jax.decoding.rules.targets import SpecDecode
from specdec_jax.decoding.verify.chain import verify_block


def _both(fn):
  """(lean, reference) results of jit(fn)() (traced under each setting)."""
  lean = jax.jit(fn)()
  sampling.LEAN = False
  try:
    ref = jax.jit(fn)()
  finally:
    sampling.LEAN = True
  return lean, ref


@pytest.mark.parametrize("temps", [[0.0, 0.0, 0.0, 0.0], [1.0, 0.7, 2.0, 1.0],
                                   [0.0, 1.0, 0.0, 0.5]])
def test_transform_draw_and_kernel_match_the_reference(temps):
  key = jax.random.key(3)
  logits = jax.random.normal(key, (4, 3, 50)) * 3  # [B, g + 1, V]
  strategy = sampling.TopK(jnp.asarray([50, 5, 50, 3]), jnp.asarray(temps))
  keys = jax.random.split(key, 4)
  drafts = jnp.asarray([[1, 2], [3, 4], [5, 6], [7, 8]], jnp.int32)
  u = jax.random.uniform(key, (4, 2))

  def fn():
    sq, sp = strategy.probs(logits), strategy.probs(logits[::-1])
    tok = sampling.draw(keys, logits[:, 0], strategy)
    out = verify_block(SpecDecode(), drafts, sq, sp, sq, sp, u, keys,
                       jax.random.split(jax.random.key(9), 4))
    return sq, tok, out.accepted, out.token

  lean, ref = _both(fn)
  for a, b in zip(lean, ref):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sample_at_is_sample_with_the_rows_uniforms():
  keys = jax.random.split(jax.random.key(0), 64)
  dist = jax.random.uniform(jax.random.key(1), (64, 37))
  u = jax.vmap(lambda k: jax.random.uniform(k, ()))(keys)
  np.testing.assert_array_equal(sampling.sample(keys, dist),
                                sampling.sample_at(u, dist))
