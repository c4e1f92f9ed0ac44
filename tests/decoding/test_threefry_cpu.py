"""keys.py lowers Threefry on CPU without loops: same bits, no while loop.

The decode loops derive every key and draw with Threefry-2x32; on CPU JAX
lowers it as a 5-trip ``while`` loop, which ``keys.unroll_threefry_on_cpu``
replaces with JAX's straight-line (GPU/TPU) rounds at import. These tests
pin that the switch is on, that it changes how the hash is compiled (no
``while`` left), never its value (Random123 known-answer vectors; the same
draws as a process that keeps JAX's loops), and that the opt-out works.
"""

import json
import os
import subprocess
import sys

import jax
from jax.extend import random as jax_random
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.rules import keys

# Random123's known-answer vectors for Threefry-2x32 with 20 rounds:
# (key, counter) -> output (also in JAX's own random tests).
KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6b200159, 0x99ba4efe)),
    ((0xffffffff, 0xffffffff), (0xffffffff, 0xffffffff),
     (0x1cb996fc, 0xbb002be7)),
    ((0x13198a2e, 0x03707344), (0x243f6a88, 0x85a308d3),
     (0xc4923a9c, 0x483df7a0)),
]

# Draws a decode makes: per-row keys, acceptance uniforms, a categorical.
_DRAWS = """
import json, sys
import jax, jax.numpy as jnp
from specdec_jax.decoding.rules import keys
seed = jnp.array([0, 7, 123], jnp.uint32)
rid = jnp.array([0, 1, 5], jnp.int32)
pos = jnp.array([0, 3, 40], jnp.int32)

@jax.jit
def draws(seed, rid, pos):
  k = keys.row_keys(seed, rid, pos, keys.DRAFT)
  u = keys.block_uniforms(seed, rid, pos, 4)
  c = jax.vmap(lambda kk: jax.random.categorical(kk, jnp.arange(9.0)))(k)
  return jax.random.key_data(k), u, c

text = draws.lower(seed, rid, pos).compile().as_text()
out = [x.tolist() for x in draws(seed, rid, pos)]
print(json.dumps(dict(unrolled=keys.UNROLLED, loops=" while(" in text,
                      draws=out)))
"""


def _draws(rolled: bool) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop(keys.ROLLED_ENV, None)
  if rolled:
    env[keys.ROLLED_ENV] = "1"
  out = subprocess.run([sys.executable, "-c", _DRAWS], env=env, check=True,
                       capture_output=True, text=True, timeout=300)
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_threefry_is_unrolled_and_known_answers_hold():
  if os.environ.get(keys.ROLLED_ENV, "") not in ("", "0"):
    pytest.skip(f"{keys.ROLLED_ENV} is set: JAX's loops kept on purpose")
  assert keys.UNROLLED
  threefry = jax.jit(jax_random.threefry_2x32)
  for key, count, want in KNOWN_ANSWERS:
    got = threefry(np.array(key, np.uint32), np.array(count, np.uint32))
    assert [int(x) for x in got] == list(want)
  fold = jax.jit(lambda k, i: jax.random.uniform(jax.random.fold_in(k, i)))
  text = fold.lower(jax.random.key(3), jnp.int32(5)).compile().as_text()
  assert " while(" not in text


def test_same_draws_as_jax_loops_and_the_opt_out():
  unrolled, rolled = _draws(rolled=False), _draws(rolled=True)
  assert unrolled["unrolled"] and not unrolled["loops"]
  assert not rolled["unrolled"] and rolled["loops"]  # the opt-out
  assert unrolled["draws"] == rolled["draws"]
