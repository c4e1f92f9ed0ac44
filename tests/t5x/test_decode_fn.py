"""The t5x decode_fn: exact tokens, t5x semantics, sampling, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decoding
from specdec_jax.t5x import decoding as t5x_decoding
from tests.decoding.pairs import random_prompts, tiny_pair
from tests.t5x.helpers import successor_decoder, t5x_style_decoder

decode = t5x_decoding.temperature_sample


def _calls(batch):
  return {"calls": jnp.zeros((batch,), jnp.int32)}


def test_worked_example_forced_eos_does_not_end_the_row():
  # t5x's docstring example 1: 5, 6, 1 are forced; 1 is the EOS id.
  ttl, _ = successor_decoder(8)
  out, lp = decode(inputs=jnp.array([[0, 5, 6, 1, 0]]), cache=_calls(1),
                   tokens_to_logits=ttl, eos_id=1, temperature=0.0)
  np.testing.assert_array_equal(out, [[[5, 6, 1, 2, 3]]])
  np.testing.assert_array_equal(lp, [[0.0]])  # greedy, rescaled


def test_eos_then_padding_and_exact_log_probs():
  ttl, lp = successor_decoder(8)
  inputs = jnp.array([[0, 2, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
  out, scores = decode(inputs=inputs, cache=_calls(2), tokens_to_logits=ttl,
                       eos_id=4, temperature=0.0, rescale_log_probs=False)
  np.testing.assert_array_equal(out[:, 0], [[2, 3, 4, 0, 0, 0],
                                            [1, 2, 3, 4, 0, 0]])
  # Forced tokens and tokens after EOS add nothing.
  np.testing.assert_allclose(scores[:, 0], [2 * lp, 4 * lp], rtol=1e-6)


def test_max_decode_steps_per_row_and_initial_index():
  ttl, _ = successor_decoder(16)
  inputs = jnp.array([[0, 2, 0, 0, 0, 0, 0, 0], [0, 3, 4, 0, 0, 0, 0, 0]])
  out, _ = decode(inputs=inputs, cache=_calls(2), tokens_to_logits=ttl,
                  eos_id=15, temperature=0.0, max_decode_steps=2,
                  initial_index=jnp.array([1, 2]))
  # t5x's docstring example 4: two new tokens after each prompt.
  np.testing.assert_array_equal(out[:, 0], [[2, 3, 4, 0, 0, 0, 0, 0],
                                            [3, 4, 5, 6, 0, 0, 0, 0]])
  out, _ = decode(inputs=inputs, cache=_calls(2), tokens_to_logits=ttl,
                  eos_id=15, temperature=0.0,
                  max_decode_steps=jnp.array([1, 3]))
  np.testing.assert_array_equal(out[:, 0], [[2, 3, 0, 0, 0, 0, 0, 0],
                                            [3, 4, 5, 6, 7, 0, 0, 0]])


def _t5_reference(src, length, prompts=None):
  _, model, _, params = tiny_pair("t5")
  ref = decoding.generate(decoding.TargetOnly(), model, model, params,
                          params, prompts, inputs=src,
                          max_new_tokens=length)
  return model, params, ref


@pytest.mark.parametrize("num_decodes", [1, 2])
def test_greedy_t5_equals_target_only_decoding(num_decodes):
  rng = np.random.default_rng(0)
  length, batch = 12, 3
  src = np.zeros((batch, 8), np.int64)
  for i, r in enumerate(random_prompts(rng, batch, 64, 3, 8)):
    src[i, :len(r)] = r
  model, params, ref = _t5_reference(src, length)
  cache, ttl = t5x_style_decoder(model, params, batch, 2 * length,
                                 src=jnp.asarray(src),
                                 num_decodes=num_decodes)
  out, lp = decode(inputs=jnp.zeros((batch, length), jnp.int32), cache=cache,
                   tokens_to_logits=ttl, eos_id=model.eos_id,
                   num_decodes=num_decodes, temperature=0.0)
  assert out.shape == (batch, num_decodes, length)
  for j in range(num_decodes):
    np.testing.assert_array_equal(out[:, j], ref.tokens)
  np.testing.assert_array_equal(lp, np.zeros((batch, num_decodes)))


def test_teacher_forced_decoder_prompt_t5():
  rng = np.random.default_rng(1)
  src = np.asarray([[5, 9, 13, 2, 0], [7, 3, 0, 0, 0]])
  prefix = [[11, 12], [30]]
  length = 10
  prompts = [[0] + p for p in prefix]
  model, params, ref = _t5_reference(src, length, prompts)
  inputs = np.zeros((2, length), np.int32)
  for i, p in enumerate(prefix):
    inputs[i, 1:1 + len(p)] = p
  cache, ttl = t5x_style_decoder(model, params, 2, 2 * length,
                                 src=jnp.asarray(src))
  out, _ = decode(inputs=jnp.asarray(inputs), cache=cache,
                  tokens_to_logits=ttl, eos_id=model.eos_id, temperature=0.0)
  del rng
  for i, p in enumerate(prefix):
    got = np.asarray(out[i, 0])
    np.testing.assert_array_equal(got[:len(p)], p)
    want = ref.tokens[i, :length - len(p)]
    np.testing.assert_array_equal(got[len(p):], want)


def test_initial_index_prefilled_gemma_equals_target_only():
  _, model, _, params = tiny_pair("gemma")
  rng = np.random.default_rng(2)
  prompts = [[0] + p for p in random_prompts(rng, 3, model.vocab_size, 1, 6)]
  length = 14
  inputs = np.zeros((3, length), np.int32)
  for i, p in enumerate(prompts):
    inputs[i, :len(p)] = p
  lengths = np.array([len(p) - 1 for p in prompts])  # non-zero tokens
  # t5x's DecoderOnlyModel caches BOS + prompt[:-1]; cache_index = lengths.
  cache, ttl = t5x_style_decoder(model, params, 3, 2 * length,
                                 prefill=(inputs, lengths), num_decodes=2)
  out, _ = decode(inputs=jnp.asarray(inputs), cache=cache,
                  tokens_to_logits=ttl, eos_id=model.eos_id, temperature=0.0,
                  initial_index=jnp.asarray(lengths), num_decodes=2)
  ref = decoding.generate(decoding.TargetOnly(), model, model, params,
                          params, prompts,
                          max_new_tokens=(length - lengths).tolist())
  for i, p in enumerate(prompts):
    for j in range(2):
      got = np.asarray(out[i, j])
      np.testing.assert_array_equal(got[:len(p) - 1], p[1:])
      np.testing.assert_array_equal(got[len(p) - 1:],
                                    ref.tokens[i, :length - len(p) + 1])


def _sequence_log_probs(model, params, src, decodes, eos_id, temperature):
  """Rescaled log-probability of each [B, L] decode under the model."""
  dec_in = np.concatenate([np.zeros_like(decodes[:, :1]), decodes[:, :-1]],
                          axis=1)
  logits = model.forward(params, jnp.asarray(dec_in), inputs=jnp.asarray(src))
  logp = jax.nn.log_softmax(np.asarray(logits, np.float64) / temperature)
  tok_lp = np.take_along_axis(np.asarray(logp), decodes[..., None], -1)[..., 0]
  is_eos = decodes == eos_id
  first = np.where(is_eos.any(1), is_eos.argmax(1), decodes.shape[1] - 1)
  mask = np.arange(decodes.shape[1])[None] <= first[:, None]
  return (tok_lp * mask).sum(1)


def test_sampling_log_probs_sorted_and_rows_independent():
  _, model, _, params = tiny_pair("t5")
  src = np.asarray([[5, 9, 13, 2, 0], [7, 3, 0, 0, 0]])
  length, n, temp = 8, 3, 1.5

  def run(rows):
    cache, ttl = t5x_style_decoder(model, params, len(rows), 2 * length,
                                   src=jnp.asarray(src[rows]), num_decodes=n)
    return decode(inputs=jnp.zeros((len(rows), length), jnp.int32),
                  cache=cache, tokens_to_logits=ttl, eos_id=model.eos_id,
                  num_decodes=n, temperature=temp, topk=0,
                  decode_rng=jax.random.PRNGKey(7))

  out, lp = run([0, 1])
  out, lp = np.asarray(out), np.asarray(lp)
  assert (np.diff(lp, axis=1) >= 0).all()  # ascending: best last
  for b in range(2):
    want = _sequence_log_probs(model, params, np.repeat(src[b:b + 1], n, 0),
                               out[b], model.eos_id, temp)
    np.testing.assert_allclose(lp[b], want, rtol=2e-4, atol=2e-4)
  assert len({tuple(r) for r in out.reshape(-1, length)}) > 2  # not greedy
  alone, alone_lp = run([0])
  np.testing.assert_array_equal(alone[0], out[0])
  np.testing.assert_allclose(alone_lp[0], lp[0], rtol=1e-6)


def _fixed_logits(vocab):
  logits = jnp.arange(vocab, dtype=jnp.float32) / 2.0  # best: vocab - 1

  def ttl(state):
    rows = state.cur_token.shape[0]
    return jnp.broadcast_to(logits, (rows, vocab)), state.cache

  return ttl


@pytest.mark.parametrize("knobs,allowed", [
    (dict(topk=2, temperature=5.0), {6, 7}),
    (dict(topk=0, topp=0.01, temperature=5.0), {7}),
    (dict(topk=0, temperature=100.0), set(range(8))),
])
def test_topk_topp_restrict_the_support(knobs, allowed):
  out, _ = decode(inputs=jnp.zeros((64, 6), jnp.int32), cache=_calls(64),
                  tokens_to_logits=_fixed_logits(8), eos_id=99, **knobs)
  seen = set(np.unique(np.asarray(out)).tolist())
  assert seen <= allowed, seen
  if len(allowed) > 1:  # 384 draws: every allowed token shows up
    assert seen == allowed


def test_per_row_temperature_zero_rows_are_greedy():
  out, _ = decode(inputs=jnp.zeros((2, 30), jnp.int32), cache=_calls(2),
                  tokens_to_logits=_fixed_logits(8), eos_id=99, topk=0,
                  temperature=jnp.array([0.0, 50.0]))
  np.testing.assert_array_equal(out[0, 0], np.full(30, 7))
  assert len(set(np.asarray(out[1, 0]).tolist())) > 2


@pytest.mark.parametrize("kwargs,message", [
    (dict(topk=3, topp=0.9), "at most one of topk"),
    (dict(temperature=-1.0), "temperature must be"),
    (dict(temperature=jnp.ones(3)), "one value per batch row"),
    (dict(num_decodes=0), "num_decodes must be"),
    (dict(initial_index=jnp.array([1])), "initial_index must be"),
    (dict(max_decode_steps=9), "exceeds the decode length"),
    (dict(topp=1.5, topk=0), "topp must be"),
])
def test_bad_arguments_raise_clear_errors(kwargs, message):
  ttl, _ = successor_decoder(8)
  with pytest.raises(ValueError, match=message):
    decode(inputs=jnp.zeros((2, 6), jnp.int32), cache=_calls(2),
           tokens_to_logits=ttl, eos_id=1, **kwargs)


def test_expand_cache_follows_t5x_rules():
  cache = {"dec": {"cached_key": jnp.arange(6).reshape(2, 3),
                   "cache_index": jnp.array([4, 5]),
                   "cached_bias": jnp.ones((1, 3))}}
  out = t5x_decoding.expand_cache(cache, 2)
  np.testing.assert_array_equal(out["dec"]["cached_key"],
                                [[0, 1, 2], [0, 1, 2], [3, 4, 5], [3, 4, 5]])
  np.testing.assert_array_equal(out["dec"]["cache_index"], [4, 5])
  assert out["dec"]["cached_bias"].shape == (1, 3)
  out = t5x_decoding.expand_cache(cache, 2, apply_to_index=True)
  np.testing.assert_array_equal(out["dec"]["cache_index"], [4, 4, 5, 5])
  scanned = t5x_decoding.expand_cache({"k": jnp.zeros((3, 2, 5))}, 2,
                                      offset=1)
  assert scanned["k"].shape == (3, 4, 5)
  with pytest.raises(ValueError, match="no batch axis"):
    t5x_decoding.expand_cache({"k": jnp.zeros(())}, 2)
