"""Greedy SpecDecode is token-identical to greedy target-only decoding."""

import numpy as np
import pytest

from specdec_jax import decoding
from tests.decoding.pairs import random_prompts, tiny_pair


@pytest.mark.parametrize("family", ["gemma", "t5"])
def test_greedy_spec_decode_equals_target_only(family):
  drafter, verifier, qp, pp = tiny_pair(family)
  rng = np.random.default_rng(0)
  vocab = verifier.vocab_size
  kw = {}
  if family == "t5":
    kw["inputs"] = random_prompts(rng, 12, vocab, 3, 12)
    prompts = None
  else:
    prompts = random_prompts(rng, 12, vocab)
  budgets = rng.integers(1, 24, size=12).tolist()  # ragged budgets too
  ref = decoding.generate(decoding.TargetOnly(), drafter, verifier, qp, pp,
                          prompts, max_new_tokens=budgets, **kw)
  assert ref.lengths.min() >= 1
  rates = []
  for gamma in (1, 2, 5, 8):
    out = decoding.generate(decoding.make_method("spec_decode"), drafter,
                            verifier, qp, pp, prompts, gamma=gamma,
                            max_new_tokens=budgets, **kw)
    assert out.sequences() == ref.sequences(), gamma
    rates.append(out.acceptance_rate)
    assert (out.verifier_calls <= ref.verifier_calls).all()
  # The pair agrees often but not always: the test exercises rejections.
  assert 0.05 < min(rates) and max(rates) < 0.98, rates


def test_greedy_cascade_rules_at_extreme_alphas():
  """Rules that always defer are the verifier; never-deferring ones the
  drafter (greedy, exact token identity)."""
  drafter, verifier, qp, pp = tiny_pair("gemma")
  prompts = random_prompts(np.random.default_rng(1), 6, verifier.vocab_size)
  run = lambda m: decoding.generate(m, drafter, verifier, qp, pp, prompts,
                                    gamma=3, max_new_tokens=10).sequences()
  tgt = run(decoding.TargetOnly())
  drf = run(decoding.DrafterOnly())
  assert tgt != drf
  assert run(decoding.make_method("chow", alpha=0.0)) == tgt  # max q < 1
  assert run(decoding.make_method("chow", alpha=1.0)) == drf
  assert run(decoding.make_method("diff", alpha=-1.0)) == tgt
  assert run(decoding.make_method("diff", alpha=1.0)) == drf
  assert run(decoding.make_method("token_v3", alpha=0.0)) == tgt
  assert run(decoding.make_method("token_v3", alpha=1.0)) == drf
  assert run(decoding.make_method("lossy_greedy", alpha=0.0)) == tgt
  assert run(decoding.make_method("oracle_diff", alpha=-1.0)) == tgt
  assert run(decoding.make_method("seq_cascade", alpha=0.0)) == tgt
  assert run(decoding.make_method("seq_cascade", alpha=1.0)) == drf
  assert run(decoding.make_method("token_cascade", alpha=0.0)) == tgt
  assert run(decoding.make_method("token_cascade", alpha=1.0)) == drf


@pytest.mark.parametrize("chunk", [2, 16])
def test_greedy_token_cascade_matches_an_uncached_reference(chunk):
  """TokenCascade[Chow] at intermediate alpha, against a from-scratch loop.

  Each token: full uncached forward of both models over the prefix; the
  token is argmax p where the drafter defers (max q < 1 - alpha), else
  argmax q. ``chunk=2`` makes the verifier catch up on several generated
  tokens in several calls; prompts are longer than the chunk.
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  drafter, verifier, qp, pp = tiny_pair("gemma")
  prompts = random_prompts(np.random.default_rng(3), 4, verifier.vocab_size,
                           5, 9)
  new, width = 10, 32

  def last_logits(model, params, seq):
    # One padded width (one compilation); causal attention, so the padding
    # after the last real token does not change its logits.
    cache = model.init_cache(1, width + 8)
    toks = jnp.asarray([list(seq) + [0] * (width - len(seq))], jnp.int32)
    logits, _ = model.step(params, toks, cache,
                           logits_at=jnp.asarray([len(seq) - 1]))
    return np.asarray(logits[0, 0])

  def reference(alpha):
    want, deferred, conf = [], 0, []
    for prompt in prompts:
      seq = list(prompt)
      for _ in range(new):
        ql = last_logits(drafter, qp, seq)
        q = np.exp(ql - ql.max())
        conf.append(q.max() / q.sum())
        if conf[-1] < 1 - alpha:
          deferred += 1
          seq.append(int(np.argmax(last_logits(verifier, pp, seq))))
        else:
          seq.append(int(np.argmax(ql)))
      want.append(seq[len(prompt):])
    return want, deferred, conf

  # alpha = 1 never defers; then defer below a threshold halfway between
  # two middle confidences (no ties with float32 rounding).
  _, _, conf = reference(1.0)
  mid = np.sort(conf)[len(conf) // 2 - 1:len(conf) // 2 + 1]
  alpha = 1.0 - float(mid.mean())
  want, deferred, _ = reference(alpha)
  assert 0 < deferred < len(prompts) * new  # both branches exercised
  out = decoding.generate(
      decoding.make_method("token_cascade", alpha=alpha, chunk=chunk),
      drafter, verifier, qp, pp, prompts, max_new_tokens=new, eos_id=None)
  assert out.sequences() == want
  assert float(out.deferrals.sum()) == deferred
