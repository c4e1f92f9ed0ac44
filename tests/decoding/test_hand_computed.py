"""Exact tokens and counters on hand-computable fake models."""

import jax.numpy as jnp
import numpy as np

from specdec_jax import decoding
from tests.decoding.fakes import RuleModel, plus_one, plus_one_except


def _run(method, drafter, verifier, prompts, **kw):
  kw.setdefault("eos_id", None)
  return decoding.generate(method, drafter, verifier, {}, {}, prompts, **kw)


def test_drafter_diverging_at_a_known_position():
  # Target: +1. Drafter: +1 except that, fed the token at position 4, it
  # predicts prev + 2. Prompt [2, 3] (positions 0, 1), gamma = 4.
  # Iteration 1: drafts 4 5 6 8 for positions 2..5; the verifier predicts
  #   4 5 6 7 -> accepts 3, replaces 8 by 7.            emitted 4 5 6 7
  # Iteration 2: drafts 8 9 10 11, all accepted, bonus 12. emitted 8..12
  # Iteration 3: the drafter first catches up on 11 (never fed), then drafts
  #   13 14 15 2 (wrap skips 0, 1), all accepted, bonus 3.
  out = _run(decoding.make_method("spec_decode"), plus_one_except([4]),
             plus_one(), [[2, 3]], gamma=4, max_new_tokens=14)
  assert out.sequences() == [[4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 2, 3]]
  assert out.drafted.tolist() == [12]
  assert out.accepted.tolist() == [11]
  assert out.verifier_calls.tolist() == [3]
  # 4 drafter calls per iteration (the first is the 2-token catch-up block).
  assert out.drafter_calls.tolist() == [12]
  assert out.block_efficiency == 14 / 3


def test_ragged_rows_advance_independently():
  # Row 0 diverges at position 4, row 1 never: both reach max_new_tokens.
  drafter = plus_one_except([4])
  out = _run(decoding.make_method("spec_decode"), drafter, plus_one(),
             [[2, 3], [5, 6, 7, 8, 9]], gamma=4, max_new_tokens=[9, 6])
  assert out.sequences() == [[4, 5, 6, 7, 8, 9, 10, 11, 12],
                             [10, 11, 12, 13, 14, 15]]
  # Row 1 (prompt positions 0..4) drafts positions 5.. : the drafter's bad
  # position 4 is the prompt's last token, so its first draft is wrong.
  assert out.accepted.tolist() == [7, 4]
  assert out.verifier_calls.tolist() == [2, 2]


def test_eos_stops_a_row_and_is_kept():
  eos_at_7 = RuleModel(lambda t, p: jnp.where(p == 6, 1, t + 1), 16)
  out = _run(decoding.make_method("spec_decode"), plus_one(), eos_at_7,
             [[2, 3], [2]], gamma=3, max_new_tokens=10, eos_id=1)
  # Positions 2..6 get 4 5 6 7 then EOS at position 7 (fed position 6).
  assert out.sequences()[0] == [4, 5, 6, 7, 8, 1]
  assert out.sequences()[1] == [3, 4, 5, 6, 7, 8, 1]
  assert out.tokens[0, 6:].tolist() == [0, 0, 0, 0]


def test_target_only_and_token_cascade_on_fakes():
  tgt = decoding.generate(decoding.make_method("target_only"), None,
                          plus_one(), None, {}, [[2, 3]], max_new_tokens=5,
                          eos_id=None)
  assert tgt.sequences() == [[4, 5, 6, 7, 8]]
  assert tgt.verifier_calls.tolist() == [5]
  # Margin 5 over 16 ids: max q = e^5 / (e^5 + 15) = 0.908, so Chow with
  # alpha = 0.5 never defers: the drafter's (diverging) output is kept.
  drafter = plus_one_except([3], margin=5.0)
  tc = _run(decoding.make_method("token_cascade", alpha=0.5),
            drafter, plus_one(), [[2, 3]], max_new_tokens=5)
  assert tc.sequences() == [[4, 5, 7, 8, 9]]
  assert tc.verifier_calls.tolist() == [0]
  # alpha = 0 defers every token (max q < 1 always): the verifier's cache
  # holds the prefilled prompt, and it scores one token per call.
  tc0 = _run(decoding.make_method("token_cascade", alpha=0.0),
             drafter, plus_one(), [[2, 3]], max_new_tokens=5)
  assert tc0.sequences() == [[4, 5, 6, 7, 8]]
  assert tc0.verifier_calls.tolist() == [5]
  assert tc0.drafter_calls.tolist() == [5]
  assert tc0.deferral_rate == 1.0


def test_bild_fallback_and_rollback_on_fakes():
  # Margin-20 fakes are fully confident; BiLD with alpha_fallback 0.5 drafts
  # the whole window. The rollback threshold catches the divergence.
  out = _run(decoding.make_method("bild", alpha_fallback=0.5,
                                  alpha_rollback=1.0),
             plus_one_except([4]), plus_one(), [[2, 3]], gamma=4,
             max_new_tokens=9)
  assert out.sequences() == [[4, 5, 6, 7, 8, 9, 10, 11, 12]]
  assert out.accepted.tolist() == [7]
  # A margin-5 drafter has confidence 0.908 < alpha_fallback = 0.95: it
  # never drafts and the verifier produces every token (one call each).
  out = _run(decoding.make_method("bild", alpha_fallback=0.95,
                                  alpha_rollback=1.0),
             plus_one_except([4], margin=5.0), plus_one(), [[2, 3]], gamma=4,
             max_new_tokens=5)
  assert out.sequences() == [[4, 5, 6, 7, 8]]
  assert out.accepted.tolist() == [0]
  assert out.verifier_calls.tolist() == [5]
  assert out.drafter_calls.tolist() == [5]  # the loop exits at once


def test_kernel_docstring_example():
  drafts = jnp.array([[1, 2]])
  sq = jnp.array([[[.2, .5, .3], [.1, .3, .6], [1 / 3, 1 / 3, 1 / 3]]])
  sp = jnp.array([[[.1, .6, .3], [.5, .4, .1], [.0, .0, 1.]]])
  import jax  # pylint: disable=g-import-not-at-top
  keys = jax.random.split(jax.random.key(0), 2)
  out = decoding.verify_block(decoding.SpecDecode(), drafts, sq, sp, sq, sp,
                              jnp.array([[.9, .5]]), keys[:1], keys[1:])
  assert out.accepted.tolist() == [1]
  assert out.token.tolist()[0] in (0, 1)  # from the residual [.8, .2, 0]
  # The residual law: 80% token 0, 20% token 1.
  many = jax.random.split(jax.random.key(1), 20000)
  toks = jax.vmap(lambda k: decoding.verify_block(
      decoding.SpecDecode(), drafts, sq, sp, sq, sp, jnp.array([[.9, .5]]),
      k[None], k[None]).token[0])(many)
  frac0 = float(np.mean(np.asarray(toks) == 0))
  assert abs(frac0 - 0.8) < 0.015  # 5 sigma
  out = decoding.verify_block(decoding.SpecDecode(), drafts, sq, sp, sq, sp,
                              jnp.array([[.9, .1]]), keys[:1], keys[1:])
  assert out.accepted.tolist() == [2] and out.token.tolist() == [2]
