"""Identities between methods (sampled, same seeds: token-identical)."""

import numpy as np

from specdec_jax import decoding
from tests.decoding.pairs import random_prompts, tiny_pair


def _setup(n=16):
  drafter, verifier, qp, pp = tiny_pair("gemma")
  prompts = random_prompts(np.random.default_rng(2), n, verifier.vocab_size)
  return drafter, verifier, qp, pp, prompts


def test_lossy_alpha_zero_is_spec_decode():
  d, v, qp, pp, prompts = _setup()
  kw = dict(sampling=decoding.Temperature(1.0), gamma=4, max_new_tokens=16,
            seeds=11)
  spec = decoding.generate(decoding.make_method("spec_decode"), d, v, qp, pp,
                           prompts, **kw)
  lossy = decoding.generate(decoding.make_method("lossy", alpha=0.0, beta=1.0),
                            d, v, qp, pp, prompts, **kw)
  assert lossy.sequences() == spec.sequences()
  assert (lossy.accepted == spec.accepted).all()


def test_token_v3_at_temperature_zero_is_lossy_greedy():
  d, v, qp, pp, prompts = _setup()
  for alpha in (0.1, 0.4, 0.8):
    kw = dict(sampling=decoding.Temperature(0.0), gamma=3, max_new_tokens=16)
    v3 = decoding.generate(decoding.make_method("token_v3", alpha=alpha), d,
                           v, qp, pp, prompts, **kw)
    lg = decoding.generate(decoding.make_method("lossy_greedy", alpha=alpha),
                           d, v, qp, pp, prompts, **kw)
    assert v3.sequences() == lg.sequences()
    assert (v3.accepted == lg.accepted).all()


def test_chow_that_never_defers_is_drafter_only():
  d, v, qp, pp, prompts = _setup()
  kw = dict(sampling=decoding.TopP(0.9, temperature=0.8), gamma=4,
            max_new_tokens=16, seeds=5)
  chow = decoding.generate(decoding.make_method("chow", alpha=1.0), d, v, qp,
                           pp, prompts, **kw)
  drafter_only = decoding.generate(decoding.DrafterOnly(), d, v, qp, pp,
                                   prompts, **kw)
  assert chow.sequences() == drafter_only.sequences()
  assert chow.acceptance_rate == 1.0 and chow.deferral_rate == 0.0


def test_same_request_same_tokens_in_any_batch():
  """Per-request randomness: batch composition and padding do not matter."""
  d, v, qp, pp, prompts = _setup(8)
  method = decoding.make_method("token_v1", alpha=0.2)
  kw = dict(sampling=decoding.Temperature(1.0), gamma=3, max_new_tokens=12)
  full = decoding.generate(method, d, v, qp, pp, prompts, seeds=3,
                           request_ids=list(range(100, 108)), **kw)
  # Row 5 alone, then among other rows with longer prompts (more padding).
  alone = decoding.generate(method, d, v, qp, pp, [prompts[5]], seeds=3,
                            request_ids=[105], **kw)
  other = [[7] * 20, prompts[5], [9] * 3]
  mixed = decoding.generate(method, d, v, qp, pp, other, seeds=[1, 3, 2],
                            request_ids=[0, 105, 7], **kw)
  assert alone.sequences()[0] == full.sequences()[5]
  assert mixed.sequences()[1] == full.sequences()[5]
  # A different request id gives a different sample.
  moved = decoding.generate(method, d, v, qp, pp, [prompts[5]], seeds=3,
                            request_ids=[106], **kw)
  assert moved.sequences()[0] != full.sequences()[5]


def test_padding_width_never_changes_the_output():
  d, v, qp, pp, prompts = _setup(4)
  kw = dict(sampling=decoding.Temperature(1.0), gamma=3, max_new_tokens=10,
            seeds=9)
  method = decoding.make_method("token_v3", alpha=0.4)
  base = decoding.generate(method, d, v, qp, pp, prompts, **kw)
  wide = decoding.generate(method, d, v, qp, pp, prompts, pad_to=64, **kw)
  assert wide.sequences() == base.sequences()
