"""The generate() contract: request ids, a user's own model, traces, strict
inputs (issue 16 items 6-9, 12, 13, 17)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decoding
from specdec_jax.decoding.rules import sampling
from specdec_jax.models.cache import KVCache, LayerKV
from tests.decoding.fakes import plus_one, plus_one_except
from tests.decoding.pairs import random_prompts, tiny_pair


def test_same_request_same_seed_in_another_row_same_tokens_by_default():
  """Default request ids derive from the request, not the row index."""
  d, v, qp, pp = tiny_pair("gemma")
  prompts = random_prompts(np.random.default_rng(4), 4, v.vocab_size, 3, 8)
  kw = dict(sampling=decoding.Temperature(1.0), gamma=3, max_new_tokens=10,
            seeds=5)
  method = decoding.make_method("token_v3", alpha=0.3)
  first = decoding.generate(method, d, v, qp, pp, prompts, **kw)
  moved = decoding.generate(method, d, v, qp, pp, prompts[::-1], **kw)
  assert moved.sequences()[::-1] == first.sequences()
  alone = decoding.generate(method, d, v, qp, pp, [prompts[2]], **kw)
  assert alone.sequences()[0] == first.sequences()[2]
  # Copies of one request in a call are independent samples (the k-th copy
  # has the same tokens in any batch that holds it).
  twice = decoding.generate(method, d, v, qp, pp, [prompts[1]] * 2, **kw)
  assert twice.sequences()[0] == first.sequences()[1]
  assert twice.sequences()[1] != twice.sequences()[0]


@dataclasses.dataclass(frozen=True)
class CounterModel:
  """A user's model written from the protocol docs alone (no specdec_jax
  base class): next token = (token + position) mod vocab, with margin."""

  vocab_size: int = 11
  is_encoder_decoder: bool = False
  eos_id: int | None = None

  def init_cache(self, batch, max_length, encoded=None):
    zero = jnp.zeros((batch, max_length, 1, 1), jnp.float32)
    return KVCache(lengths=jnp.zeros((batch,), jnp.int32),
                   layers=(LayerKV(k=zero, v=zero),))

  def step(self, params, tokens, cache, *, positions=None, mask=None,
           logits_at=None):
    n = tokens.shape[1]
    if positions is None:
      positions = cache.lengths[:, None] + jnp.arange(n)[None, :]
    nxt = (tokens + positions + params["shift"]) % self.vocab_size
    logits = 30.0 * jax.nn.one_hot(nxt, self.vocab_size)
    if logits_at is not None:
      logits = jnp.take_along_axis(logits, logits_at[:, None, None], axis=1)
    return logits, cache.replace(lengths=cache.lengths + n)


def test_a_user_model_following_only_the_protocol_decodes():
  model = CounterModel()
  params = {"shift": jnp.int32(1)}
  prompt = [3, 4]  # positions 0, 1: the first new token is (4 + 1 + 1) % 11
  want, tok = [], 4
  for pos in range(1, 7):
    tok = (tok + pos + 1) % 11
    want.append(tok)
  for method in ("target_only", "spec_decode", "token_v3"):
    out = decoding.generate(decoding.make_method(method), model, model,
                            params, params, [prompt], gamma=2,
                            max_new_tokens=6)
    assert out.sequences() == [want], method


def test_a_model_missing_part_of_the_protocol_is_named():
  @dataclasses.dataclass(frozen=True)
  class NoMask(CounterModel):

    def step(self, params, tokens, cache, logits_at=None):  # pylint: disable=arguments-differ
      return super().step(params, tokens, cache, logits_at=logits_at)

  with pytest.raises(ValueError, match="verifier .NoMask.*positions"):
    decoding.generate(decoding.TargetOnly(), None, NoMask(), None,
                      {"shift": 1}, [[2]])
  with pytest.raises(ValueError, match="drafter .*object.* no attribute "
                     "'vocab_size'"):
    decoding.generate(decoding.make_method("spec_decode"), object(),
                      CounterModel(), None, {"shift": 1}, [[2]])


def test_top_p_one_keeps_every_token_exactly():
  # A peaked row: float32 cumulative sums reach 1 before the tiny tail.
  logits = jnp.asarray([[0.0, -18.0, -20.0, -21.0] + [-60.0] * 4])
  got = sampling.TopP(1.0).probs(logits)
  want = jax.nn.softmax(logits)
  assert bool(jnp.all(got > 0))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
  assert float(sampling.TopP(0.999).probs(logits)[0, 1]) == 0.0


def test_return_trace_records_every_block():
  # Target +1; the drafter diverges at position 4 (see test_hand_computed).
  out = decoding.generate(decoding.make_method("spec_decode"),
                          plus_one_except([4]), plus_one(), {}, {}, [[2, 3]],
                          gamma=4, max_new_tokens=14, eos_id=None,
                          return_trace=True)
  tr = out.trace
  assert tr["drafts"].shape == (1, 3, 4)
  assert tr["drafts"][0].tolist() == [[4, 5, 6, 8], [8, 9, 10, 11],
                                      [13, 14, 15, 2]]
  assert tr["accept"][0, 0].tolist() == [True, True, True, False]
  assert tr["accepted"][0].tolist() == [3, 4, 4]
  assert tr["token"][0].tolist() == [7, 12, 3]
  off = decoding.generate(decoding.make_method("spec_decode"),
                          plus_one_except([4]), plus_one(), {}, {}, [[2, 3]],
                          gamma=4, max_new_tokens=14, eos_id=None)
  assert off.trace is None and off.sequences() == out.sequences()
  with pytest.raises(ValueError, match="TargetOnly drafts none"):
    decoding.generate(decoding.TargetOnly(), None, plus_one(), None, {},
                      [[2]], return_trace=True)


@pytest.mark.parametrize("kw,match", [
    (dict(prompts=[[2, 3.7]]), r"prompts \(row 0\) must be integer token "
     r"ids, got 3.7"),
    (dict(prompts=np.asarray([[2.0, 3.0]])), "must be integer token ids"),
    (dict(prompts=["2 3"]), "must be integer token ids"),
    (dict(seeds=-1), r"seeds must be integers in \[0, 2\*\*32\)"),
    (dict(seeds=2**32), r"seeds must be integers in \[0, 2\*\*32\)"),
    (dict(seeds=0.5), "seeds must be integers"),
    (dict(max_new_tokens=2**31), "max_new_tokens 2147483648 is too large"),
    (dict(max_new_tokens=10**12), "is too large"),
    (dict(max_new_tokens=10**9), r"needs [0-9.]+ GiB for its KV caches"),
    (dict(request_ids=[1.5]), "request_ids must be integers"),
    # Issue 43: accepted silently before.
    (dict(prompts=[[2, True]]), r"prompts \(row 0\) must be integer token "
     r"ids, got the bool True at position 1; a bool is not a token id"),
    (dict(prompts=np.asarray([[True, False]])), "got a bool array"),
    (dict(request_ids=[-1]), r"request_ids must be integers in \[0, "
     r"2\*\*31\), got -1; ids are never wrapped"),
    (dict(request_ids=[2**32 - 1]), r"in \[0, 2\*\*31\), got 4294967295"),
    (dict(request_ids=[2**63 - 1]), r"got 9223372036854775807"),
    (dict(pad_to=-5), r"pad_to must be None or an integer >= 1 \(the minimum"
     r" padded prompt width\), got -5"),
    (dict(pad_to=2.5), "pad_to must be None or an integer >= 1"),
    (dict(eos_id=999), r"eos_id must be a token id in \[0, 64\) \(the "
     r"verifier's vocabulary\) or None \(never stop early\), got 999"),
    (dict(pad_id=-1), r"pad_id must be a token id in \[0, 64\) \(the "
     r"verifier's vocabulary\), got -1"),
])
def test_bad_inputs_are_clear_errors_before_anything_runs(kw, match):
  d, v, qp, pp = tiny_pair("gemma")
  kw.setdefault("prompts", [[2, 5]])
  with pytest.raises(ValueError, match=match):
    decoding.generate(decoding.make_method("spec_decode"), d, v, qp, pp,
                      **kw)


def test_params_of_the_wrong_model_name_the_model():
  """Issue 43: was a Flax scope error naming no model."""
  d, v, qp, pp = tiny_pair("gemma")
  with pytest.raises(ValueError, match=(
      r"the drafter's params do not fit the drafter model GemmaModel \([0-9]+ "
      r"ids, [0-9]+ decoder layers, [0-9,]+ parameters\): GemmaModel params "
      r".*; pass the params loaded with this model")):
    decoding.generate(decoding.make_method("spec_decode"), d, v,
                      {"embedder": qp["embedder"]}, pp, [[2, 5]])
