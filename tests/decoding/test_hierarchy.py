"""Hierarchical speculative decoding: exact tokens, counters, equivalences,
the latency model against simulation and real runs, the planner, errors."""

import numpy as np
import pytest

from specdec_jax import decoding, models
from specdec_jax.decoding.hierarchy import latency, planner
from specdec_jax.decoding.hierarchy.api import generate_hierarchy
from tests.decoding.fakes import FixedModel, plus_one, plus_one_except
from tests.decoding.pairs import random_prompts, tiny_pair


def test_three_levels_on_fakes_hand_traced():
  """M0: +1 except fed position 4 (+2); M1: +1 except fed position 6; M2:
  +1 (the target). Buffers T0 = 2, T1 = 3; prompt [2, 3].

  Round 1: M0 drafts 4 5; M1 accepts both, bonus 6 (buffer 4 5 6); M2
    accepts all three, bonus 7.                      emitted 4 5 6 7
  Round 2 (start 6): M0 catches up on 5 6 7 in one block, drafts 8 9; M1
    accepts 8, replaces 9 by 10 (its own +2 at fed position 6): buffer 8 10,
    short of 3, so another round: M0 drafts 11 12, M1 accepts both, bonus
    13 -> buffer 8 10 11 12 13; M2 accepts 8, replaces 10 by 9.  emitted 8 9
  Round 3 (start 8): M0 drafts 10 11; M1 accepts, bonus 12; M2 accepts all,
    bonus 13.                                         emitted 10 11 12 13
  """
  levels = [(plus_one_except([4]), {}), (plus_one_except([6]), {}),
            (plus_one(), {})]
  out = generate_hierarchy(levels, [2, 3], [[2, 3]], max_new_tokens=10,
                           eos_id=None)
  assert out.sequences() == [[4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]
  assert out.calls.tolist() == [[8, 4, 3]]
  assert out.level_drafted.tolist() == [[0, 8, 11]]
  assert out.level_accepted.tolist() == [[0, 7, 7]]
  assert out.verifier_calls.tolist() == [3]
  assert out.drafter_calls.tolist() == [12]


def test_decreasing_buffers_are_legitimate():
  """Issue 43: buffers [6, 2] (T_1 < T_0). M_1 holds >= 2 tokens after one
  batch of 6 from M_0, so it asks once per round and hands up all 7; the
  target emits 8 per round: 16 tokens in 2 rounds (docs/hierarchy.md). When
  M_1 rejects (M_0 wrong at fed position 5) it asks again: 3 calls."""
  from specdec_jax import hierarchy_spec  # pylint: disable=g-import-not-at-top
  assert hierarchy_spec.HierarchySpec(("exit:1", "exit:2"),
                                      [6, 2]).buffers == (6, 2)
  ref = generate_hierarchy([(plus_one(), {}), (plus_one(), {})], [6],
                           [[2, 3]], max_new_tokens=16, eos_id=None)
  out = generate_hierarchy([(plus_one(), {})] * 3, [6, 2], [[2, 3]],
                           max_new_tokens=16, eos_id=None)
  assert out.sequences() == ref.sequences()
  assert out.calls.tolist() == [[12, 2, 2]]
  assert out.level_drafted.tolist() == [[0, 12, 14]]
  bad = generate_hierarchy([(plus_one_except([5]), {}), (plus_one(), {}),
                            (plus_one(), {})], [6, 2], [[2, 3]],
                           max_new_tokens=16, eos_id=None)
  assert bad.sequences() == ref.sequences()
  assert bad.calls.tolist() == [[18, 3, 3]]


@pytest.mark.parametrize("family", ["gemma", "t5"])
def test_greedy_hierarchy_is_greedy_target_only(family):
  d, v, qp, pp = tiny_pair(family)
  mid = models.early_exit(v, 1)  # first layer of the target, its params
  rng = np.random.default_rng(0)
  rows = random_prompts(rng, 6, v.vocab_size, 2, 9)
  kw = {"inputs": rows} if family == "t5" else {"prompts": rows}
  budgets = rng.integers(1, 14, size=6).tolist()  # ragged
  ref = decoding.generate(decoding.TargetOnly(), d, v, qp, pp,
                          max_new_tokens=budgets, **kw)
  for levels, bufs in (([(d, qp), (mid, pp), (v, pp)], [2, 4]),
                       ([(d, qp), (mid, pp), (d, qp), (v, pp)], [1, 3, 2])):
    out = generate_hierarchy(levels, bufs, max_new_tokens=budgets, **kw)
    assert out.sequences() == ref.sequences(), bufs
    assert (out.verifier_calls <= ref.verifier_calls).all()
    alphas = out.level_acceptance()[1:]
    assert all(0.0 < a <= 1.0 for a in alphas), alphas


@pytest.mark.parametrize("name,knobs,sampling", [
    ("spec_decode", {}, decoding.Temperature(1.0)),
    ("token_v3", {"alpha": 0.4}, decoding.TopP(0.8, temperature=0.7)),
    ("lossy", {"alpha": 0.3}, decoding.Temperature(1.0)),
    ("opt", {"alpha": 0.5}, decoding.Greedy()),
])
def test_two_levels_are_the_speculative_loop(name, knobs, sampling):
  d, v, qp, pp = tiny_pair("gemma")
  rows = random_prompts(np.random.default_rng(1), 6, v.vocab_size, 2, 9)
  method = decoding.make_method(name, **knobs)
  kw = dict(sampling=sampling, max_new_tokens=10, seeds=3)
  chain = decoding.generate(method, d, v, qp, pp, rows, gamma=3, **kw)
  stack = generate_hierarchy([(d, qp), (v, pp)], [3], rows, method=method,
                             **kw)
  assert stack.sequences() == chain.sequences()
  assert (stack.calls == chain.calls).all()
  assert (stack.deferrals == chain.deferrals).all()


def test_latency_model_matches_a_simulation_within_two_percent():
  a = {(0, 1): 0.62, (0, 2): 0.45, (0, 3): 0.40, (1, 2): 0.70,
       (1, 3): 0.60, (2, 3): 0.85}
  alpha = lambda i, j: a[i, j]
  c = [0.02, 0.06, 0.25, 1.0]
  cost = lambda i, w: c[i] * (1 + 0.01 * (w - 1))
  for chain, bufs in (((0,), (4,)), ((0, 2), (3, 6)), ((1, 2), (2, 3)),
                      ((0, 1, 2), (2, 4, 6)), ((0, 1, 2), (3, 1, 5))):
    exact = latency.evaluate(chain, bufs, alpha, cost, 3)
    sim = latency.simulate(chain, bufs, alpha, cost, 3, tokens=200_000)
    assert abs(exact.per_token / sim.per_token - 1) < 0.02, (chain, bufs)
    np.testing.assert_allclose(exact.calls_per_token, sim.calls_per_token,
                               rtol=0.02)


def _fixed_stack():
  """Three context-free fakes: alpha = sum min(p_i, p_j), i.i.d."""
  logits = ([1.0, 0.0, 0.5, 1.5, 0.2, 0.0],
            [1.2, 0.3, 0.4, 1.0, 0.0, 0.4],
            [1.0, 0.5, 0.0, 1.2, 0.3, 0.6])
  ms = [FixedModel(tuple(x)) for x in logits]
  p = [np.exp(x) / np.exp(x).sum() for x in map(np.asarray, logits)]
  alpha = lambda i, j: float(np.minimum(p[i], p[j]).sum())
  return ms, alpha


def test_latency_model_matches_real_runs_with_known_alpha():
  ms, alpha = _fixed_stack()
  levels = [(m, {}) for m in ms]
  n, new = 400, 40
  for bufs in ((2, 3), (3, 7)):
    out = generate_hierarchy(levels, list(bufs), [[1]] * n,
                             sampling=decoding.Temperature(1.0),
                             max_new_tokens=new, eos_id=None, seeds=1,
                             request_ids=list(range(n)))
    pred = latency.evaluate((0, 1), bufs, alpha, lambda i, w: 1.0, 2)
    # Tokens each target round yields (accepted + 1), before the budget
    # cuts a row's last round short.
    calls = out.verifier_calls.sum()
    measured = calls / (out.accepted.sum() + calls)
    want = 1.0 / pred.tokens_per_target_call
    assert abs(measured / want - 1) < 0.05, (bufs, measured, want)
    got_alpha = out.level_alpha()
    assert abs(got_alpha[1] - alpha(0, 1)) < 0.02, got_alpha
    assert abs(got_alpha[2] - alpha(1, 2)) < 0.02, got_alpha


def test_planner_equals_brute_force_on_random_instances():
  rng = np.random.default_rng(0)
  for _ in range(60):
    n = int(rng.integers(3, 6))
    c = np.sort(rng.uniform(0.01, 1.0, n))
    c[-1] = 1.0
    quality = np.sort(rng.uniform(0.2, 0.95, n))
    a = np.clip(np.minimum.outer(quality, quality)
                + rng.uniform(-0.05, 0.05, (n, n)), 0, 1)
    slope = rng.uniform(0, 0.05, n)
    cost = lambda i, w, c=c, slope=slope: c[i] * (1 + slope[i] * (w - 1))
    t_max = int(rng.integers(2, 6))
    dp = planner.plan(a, cost, t_max, method="dp")
    brute = planner.plan(a, cost, t_max, method="brute")
    assert (dp.best.chain, dp.best.buffers) == (brute.best.chain,
                                                brute.best.buffers)
    assert dp.best_single.per_token == brute.best_single.per_token


@pytest.mark.parametrize("call,match", [
    (lambda d, v, qp, pp: generate_hierarchy([(v, pp)], [], [[2]]),
     "at least two levels"),
    (lambda d, v, qp, pp: generate_hierarchy([(d, qp), (v, pp)], [0], [[2]]),
     "buffer T_0 must be an integer >= 1, got 0"),
    (lambda d, v, qp, pp: generate_hierarchy([(d, qp), (v, pp)], [2, 3],
                                             [[2]]),
     "2 levels need 1 buffer sizes"),
    (lambda d, v, qp, pp: generate_hierarchy(
        [(models.get_model("gemma_tiny", vocab_size=80), None), (v, pp)],
        [2], [[2]]), r"level 1 has a vocabulary of 64 ids but level 0 has 80"),
    (lambda d, v, qp, pp: generate_hierarchy(
        [(models.early_exit(v, 7), pp), (v, pp)], [2], [[2]]),
     "early exit at layer 7 but the model has 2"),
    (lambda d, v, qp, pp: generate_hierarchy(
        [(d, qp), (d, qp), (v, pp)], [2, 2], [[2]],
        method=decoding.make_method("opt"),
        lenient={1: decoding.make_method("token_v3")}),
     "lenient intermediate levels need an exact top"),
    (lambda d, v, qp, pp: generate_hierarchy(
        [(d, qp), (v, pp)], [2], [[2]], method=decoding.TargetOnly()),
     "the top level verifies with a speculative method"),
    (lambda d, v, qp, pp: planner.plan([[1, .5], [.5, 1]],
                                       lambda i, w: [1.0, 0.1][i]),
     "ordered cheapest first"),
])
def test_bad_stacks_are_clear_errors(call, match):
  d, v, qp, pp = tiny_pair("gemma")
  with pytest.raises(ValueError, match=match):
    call(d, v, qp, pp)


@pytest.mark.parametrize("bad_level", [0, 1])
def test_nan_weights_below_the_target_are_reported(bad_level):
  """NaN weights in the drafter (level 0) or the middle level (1) of a
  3-level stack flag every row non-finite (as the chain loop does), and
  'raise' raises; the target's own logits stay finite."""
  import jax  # pylint: disable=g-import-not-at-top
  d, v, qp, pp = tiny_pair("gemma")
  nan = lambda p: jax.tree.map(lambda x: x * float("nan"), p)
  levels = [(d, qp), (d, qp), (v, pp)]
  levels[bad_level] = (d, nan(qp))
  kw = dict(max_new_tokens=4, eos_id=None)
  out = generate_hierarchy(levels, [2, 2], [[2, 3], [4]],
                           on_nonfinite="return", **kw)
  assert not out.finite.any()
  with pytest.raises(FloatingPointError, match="non-finite logits"):
    generate_hierarchy(levels, [2, 2], [[2, 3], [4]], **kw)
