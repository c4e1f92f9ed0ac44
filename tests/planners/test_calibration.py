"""Calibration of per-rank acceptance and the planner's prediction on a fake
pair with known acceptance (context-independent distributions)."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decoding
from specdec_jax.decoding import planners
from specdec_jax.models import cache as cache_lib
from specdec_jax.models.cache import KVCache

Q_LOGITS = (2.0, 1.5, 1.0, 0.5, 0.0, -0.5)
P_LOGITS = (0.5, 1.8, 0.2, 1.2, -0.3, 0.9)


@dataclasses.dataclass(frozen=True)
class Fixed:
  """Decoder-only fake: the same next-token logits after every context."""

  logits: tuple
  eos_id = None
  is_encoder_decoder = False

  @property
  def vocab_size(self):
    return len(self.logits)

  def init_params(self, rng=None):
    return {}

  def init_cache(self, batch, max_length, encoded=None):
    return KVCache(lengths=jnp.zeros((batch,), jnp.int32),
                   layers=cache_lib.init_layers(batch, max_length, 1, 1, 1,
                                                jnp.float32))

  def step(self, params, tokens, cache, *, positions=None, mask=None,
           logits_at=None):
    b, n = tokens.shape
    width = n if logits_at is None else (
        1 if logits_at.ndim == 1 else logits_at.shape[1])
    out = jnp.broadcast_to(jnp.asarray(self.logits, jnp.float32),
                           (b, width, self.vocab_size))
    return out, cache.with_lengths(cache.lengths + n)


def _softmax(x):
  e = np.exp(np.asarray(x) - np.max(x))
  return e / e.sum()


def exact_acceptance(kind, ranks):
  """Per-rank acceptance at temperature 1 (a_1 of without replacement
  averages over the rejected first child)."""
  q, p = _softmax(Q_LOGITS), _softmax(P_LOGITS)
  norm = lambda x: x / x.sum()
  if kind == "iid":
    out, r = [], p
    for _ in range(ranks):
      out.append(np.minimum(q, r).sum())
      r = norm(np.maximum(r - q, 0))
    return out
  if kind == "top_k":
    out, r = [], p
    for x in np.argsort(-q, kind="stable")[:ranks]:
      out.append(r[x])
      r = norm(np.where(np.arange(len(r)) == x, 0, r))
    return out
  a0 = np.minimum(q, p).sum()
  r1 = norm(np.maximum(p - q, 0))
  rej = q * (1 - np.minimum(1, p / q))  # P(x0 drawn and rejected)
  a1 = sum(rej[x] * np.minimum(norm(np.where(np.arange(len(q)) == x, 0, q)),
                               r1).sum() for x in range(len(q))) / rej.sum()
  return [a0, a1]


@pytest.mark.parametrize("kind", ["iid", "without_replacement", "top_k"])
def test_rank_acceptance_matches_the_exact_rates(kind):
  ranks = 3 if kind != "without_replacement" else 2
  sims = 40_000
  q = np.asarray([Q_LOGITS]), np.asarray([P_LOGITS])
  got = planners.rank_acceptance(decoding.SpecDecode(),
                                 decoding.Temperature(1.0), kind, *q, ranks,
                                 sims=sims)
  want = exact_acceptance(kind, ranks)
  # standard error of a_j: reached_j >= sims * prod(1 - a_i) trials.
  reach = sims * np.cumprod([1.0] + [1 - a for a in want[:-1]])
  for j, (g, w) in enumerate(zip(got, want)):
    se = np.sqrt(w * (1 - w) / reach[j]) + 1e-9
    assert abs(g - w) < 5 * se, (j, g, w)


@pytest.mark.slow
def test_planned_tokens_per_call_match_the_measured_mean():
  """Calibrate on the fake pair through teacher-forced passes, plan a tree,
  decode 4,000 rows with it: the mean tokens per verifier call (untruncated:
  1 + accepted nodes per block) matches the plan within sampling error."""
  drafter, verifier = Fixed(Q_LOGITS), Fixed(P_LOGITS)
  t1 = decoding.Temperature(1.0)
  prompts = [[2, 3]] * 64
  acc = planners.calibrate(decoding.make_method("spec_decode"), drafter,
                           verifier, {}, {}, prompts, sampling=t1,
                           children=3, new_tokens=8, sims=64)
  exact = exact_acceptance("without_replacement", 2)
  assert abs(acc[0] - exact[0]) < 0.02 and abs(acc[1] - exact[1]) < 0.03
  plan = planners.plan_tree(acc, max_nodes=8, max_depth=3)
  assert plan.topology.max_children >= 2  # a real tree, not a chain
  out = decoding.generate(decoding.make_method("spec_decode"), drafter,
                          verifier, {}, {}, [[2, 3]] * 4000, sampling=t1,
                          max_new_tokens=12, eos_id=None, seeds=5,
                          tree=decoding.Tree(plan.topology),
                          return_trace=True)
  per_block = out.trace["accepted"]
  per_block = per_block[per_block >= 0].astype(float) + 1.0
  measured, se = per_block.mean(), per_block.std() / np.sqrt(per_block.size)
  assert abs(measured - plan.tokens_per_call) < 4 * se + 0.01, (
      measured, se, plan.tokens_per_call)
  assert measured == pytest.approx(
      (out.accepted.sum() + out.verifier_calls.sum()) /
      out.verifier_calls.sum())


def test_rank_acceptance_runs_in_memory_bounded_chunks(monkeypatch):
  """Contexts go through the simulation in chunks that fit a byte budget
  (a 32k-vocabulary pair asked XLA for 35 GB in one piece): the padded last
  chunk is not counted, and an exact rule gives the same rates chunked or
  not. Here: 7 contexts, chunks of 2 (3 full + 1 wrapped), greedy top-k."""
  from specdec_jax.decoding.planners import calibration  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  q = rng.normal(size=(7, 6)).astype(np.float32)
  p = rng.normal(size=(7, 6)).astype(np.float32)
  args = (decoding.SpecDecode(), decoding.Temperature(1.0), "top_k", q, p, 3)
  whole = planners.rank_acceptance(*args, sims=5)
  per_context = 5 * 4 * 6 * 4 * calibration._ARRAYS_PER_ROW  # pylint: disable=protected-access
  monkeypatch.setattr(calibration, "_CHUNK_BYTES", 2 * per_context)
  seen = []
  real = calibration._simulate  # pylint: disable=protected-access
  def spy(*a):
    out = real(*a)
    seen.append((a[3].shape[0], int(np.asarray(a[-1]).sum()),
                 int(np.asarray(out[0])[0])))
    return out
  monkeypatch.setattr(calibration, "_simulate", spy)
  chunked = planners.rank_acceptance(*args, sims=5)
  # rows per call, valid rows, rows that reached rank 0 (= valid rows)
  assert seen == [(10, 10, 10)] * 3 + [(10, 5, 5)]
  assert len(chunked) == len(whole) == 3
  assert all(0.0 <= a <= 1.0 for a in chunked)


def test_rank_acceptance_greedy_is_identical_chunked_or_not(monkeypatch):
  from specdec_jax.decoding.planners import calibration  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  q = rng.normal(size=(5, 8)).astype(np.float32)
  p = rng.normal(size=(5, 8)).astype(np.float32)
  args = (decoding.SpecDecode(), decoding.Greedy(), "top_k", q, p, 3)
  whole = planners.rank_acceptance(*args, sims=2)
  monkeypatch.setattr(calibration, "_CHUNK_BYTES",
                      2 * 4 * 8 * 4 * calibration._ARRAYS_PER_ROW)  # pylint: disable=protected-access
  assert planners.rank_acceptance(*args, sims=2) == whole
  # greedy acceptance is deterministic: rank 0 accepted where the drafter's
  # argmax equals the verifier's.
  assert whole[0] == np.mean(q.argmax(1) == p.argmax(1))
