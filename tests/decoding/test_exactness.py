"""Statistical exactness of every target distribution (slow).

For each method, 24,000 generations of 3 tokens are sampled in one batched
call (one row per request id) from a tiny random Gemma pair with an 8-token
vocabulary. Their empirical law over the 512 possible sequences is compared
with the exact law of the token-level process that samples every token from
effective(T(q, p), S(q)) (= T(q, p) when T is a distribution), enumerated with
an independent numpy reference (tests/decoding/reference.py):

* chi-square goodness of fit (cells with expected count < 5 merged), false
  alarm rate 1e-4 per test;
* total variation distance below the null mean + 6 null standard deviations
  (null estimated by 200 multinomial draws from the exact law).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specdec_jax import decoding, models
from tests.decoding import reference as ref

V = 8
N = 24_000
NEW = 3
PROMPT = [2, 5]
FALSE_ALARM = 1e-4


@functools.lru_cache(maxsize=None)
def pair():
  """(drafter, verifier, q_params, p_params) with peaked random logits."""
  cfg = models.GemmaConfig(vocab_size=V, d_model=16, num_layers=1,
                           num_heads=2, num_kv_heads=1, head_dim=8,
                           mlp_dim=32)
  model = models.GemmaModel(cfg)

  def params(seed, scale):
    p = model.init_params(jax.random.PRNGKey(seed))
    p["embedder"]["input_embedding"] = p["embedder"]["input_embedding"] * scale
    return p

  return model, model, params(1, 20.0), params(2, 20.0)


@functools.lru_cache(maxsize=None)
def contexts():
  """Raw logits of drafter and verifier after every prefix of length < NEW.

  Returns:
    dict prefix tuple -> (q_logits [V], p_logits [V]) as float64.
  """
  drafter, verifier, qp, pp = pair()
  prefixes = [()]
  for _ in range(NEW - 1):
    prefixes += [pre + (v,) for pre in prefixes if len(pre) == len(
        prefixes[-1]) for v in range(V)]
  width = len(PROMPT) + NEW - 1
  toks = np.zeros((len(prefixes), width), np.int32)
  for i, pre in enumerate(prefixes):
    seq = PROMPT + list(pre)
    toks[i, :len(seq)] = seq
  ql = np.asarray(drafter.forward(qp, toks), np.float64)
  pl = np.asarray(verifier.forward(pp, toks), np.float64)
  at = [len(PROMPT) + len(pre) - 1 for pre in prefixes]
  return {pre: (ql[i, at[i]], pl[i, at[i]]) for i, pre in enumerate(prefixes)}


def exact_law(name, temperature, top_p, **knobs):
  """Exact probability of every 3-token continuation, [V] * 3 array."""
  ctx = contexts()

  def step_law(pre):
    ql, pl = ctx[pre]
    q, p = ref.softmax(ql), ref.softmax(pl)
    sq = ref.transform(ql, temperature, top_p)
    sp = ref.transform(pl, temperature, top_p)
    return ref.effective(ref.target(name, q, p, sq, sp, **knobs), sq)

  law = np.zeros((V,) * NEW)
  for idx in np.ndindex(law.shape):
    prob = 1.0
    for t in range(NEW):
      prob *= step_law(tuple(idx[:t]))[idx[t]]
      if prob == 0:
        break
    law[idx] = prob
  return law


def sample_law(method, strategy, gamma):
  drafter, verifier, qp, pp = pair()
  out = decoding.generate(method, drafter, verifier, qp, pp, [PROMPT] * N,
                          sampling=strategy, gamma=gamma, max_new_tokens=NEW,
                          seeds=7, eos_id=None)
  assert (out.lengths == NEW).all()
  flat = np.ravel_multi_index(out.tokens[:, :NEW].T, (V,) * NEW)
  return np.bincount(flat, minlength=V**NEW).reshape((V,) * NEW), out


def assert_same_law(counts, law):
  counts, law = counts.ravel(), law.ravel()
  assert abs(law.sum() - 1) < 1e-6
  expected = law * N
  big = expected >= 5
  obs = np.append(counts[big], counts[~big].sum())
  exp = np.append(expected[big], expected[~big].sum())
  if exp[-1] < 5:  # fold the small remainder into the smallest cell
    obs, exp = obs[:-1], exp[:-1]
    obs[np.argmin(exp)] += counts[~big].sum()
    exp[np.argmin(exp)] += expected[~big].sum()
  chi2 = float(((obs - exp) ** 2 / exp).sum())
  pval = float(stats.chi2.sf(chi2, len(obs) - 1))
  tv = 0.5 * np.abs(counts / N - law).sum()
  rng = np.random.default_rng(0)
  null = [0.5 * np.abs(rng.multinomial(N, law / law.sum()) / N - law).sum()
          for _ in range(200)]
  bound = np.mean(null) + 6 * np.std(null)
  assert pval > FALSE_ALARM, (chi2, len(obs), pval, tv)
  assert tv < bound, (tv, bound)


T1 = decoding.Temperature(1.0)
CASES = [
    # name, knobs, sampling, (temperature, top_p), gamma
    ("spec_decode", {}, T1, (1.0, 1.0), 3),
    ("lossy", dict(alpha=0.3, beta=1.0), T1, (1.0, 1.0), 2),
    ("lossy", dict(alpha=0.5, beta=0.8), T1, (1.0, 1.0), 1),
    ("lossy_tuned", dict(alpha=0.3), T1, (1.0, 1.0), 3),
    ("chow", dict(alpha=0.5), T1, (1.0, 1.0), 3),
    ("diff", dict(alpha=0.1), T1, (1.0, 1.0), 2),
    ("opt", dict(alpha=0.5), T1, (1.0, 1.0), 3),
    ("chow", dict(alpha=1.5, loss="log"), T1, (1.0, 1.0), 2),
    ("diff", dict(alpha=0.2, loss="log"), T1, (1.0, 1.0), 3),
    ("opt", dict(alpha=1.0, loss="log"), T1, (1.0, 1.0), 2),
    ("token_v1", dict(alpha=0.3), T1, (1.0, 1.0), 3),
    ("token_v2", dict(alpha=0.3), T1, (1.0, 1.0), 2),
    ("token_v3", dict(alpha=0.5), T1, (1.0, 1.0), 3),
    ("bild_star_tv", dict(alpha=0.4), T1, (1.0, 1.0), 3),
    ("bild_star_kl", dict(alpha=0.5), T1, (1.0, 1.0), 2),
    ("spec_decode", {}, decoding.Temperature(0.5), (0.5, 1.0), 2),
    ("lossy", dict(alpha=0.4, beta=1.0), decoding.Temperature(0.5),
     (0.5, 1.0), 3),
    ("chow", dict(alpha=0.5), decoding.Temperature(0.5), (0.5, 1.0), 2),
    ("opt", dict(alpha=0.5), decoding.Temperature(0.5), (0.5, 1.0), 3),
    ("token_v3", dict(alpha=0.5), decoding.Temperature(0.5), (0.5, 1.0), 2),
    ("spec_decode", {}, decoding.TopP(0.8), (1.0, 0.8), 3),
    ("lossy_tuned", dict(alpha=0.3), decoding.TopP(0.8), (1.0, 0.8), 2),
    ("diff", dict(alpha=0.1), decoding.TopP(0.8), (1.0, 0.8), 3),
    ("token_v1", dict(alpha=0.3), decoding.TopP(0.8), (1.0, 0.8), 2),
]


def _method(name, knobs):
  if name.startswith("bild_star"):
    return decoding.Speculative(decoding.BiLDStar(
        divergence=name.rsplit("_", 1)[1], **knobs))
  key = name
  if knobs.get("loss") == "log":
    key = f"{name}_log"
    knobs = {k: v for k, v in knobs.items() if k != "loss"}
  return decoding.make_method(key, **knobs)


@pytest.mark.slow
@pytest.mark.parametrize("name,knobs,strategy,st,gamma", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_output_law_matches_token_level_process(name, knobs, strategy, st,
                                                 gamma):
  law = exact_law(name, *st, **knobs)
  counts, out = sample_law(_method(name, knobs), strategy, gamma)
  assert_same_law(counts, law)
  if name not in ("spec_decode", "lossy", "lossy_tuned"):
    # The rule must really mix both models for the test to mean something.
    assert 0.02 < out.deferral_rate < 0.98, out.deferral_rate
  assert 0.0 < out.acceptance_rate < 1.0


@pytest.mark.slow
def test_lemma3_rejection_rate_is_delta_times_tv():
  """P(reject a q-draft) = delta(q, p) * D_TV(S(p), S(q)) at one position."""
  drafter, verifier, qp, pp = pair()
  ql, pl = contexts()[()]
  q, p = ref.softmax(ql), ref.softmax(pl)
  for alpha in (0.0, 0.9):  # Diff: defers at 0, not at 0.9 (max q vs max p)
    delta = float(ref.target("diff", q, p, q, p, alpha=alpha) is p)
    expect = delta * ref.tv(p, q)
    out = decoding.generate(decoding.make_method("diff", alpha=alpha),
                            drafter, verifier, qp, pp, [PROMPT] * N,
                            sampling=T1, gamma=1, max_new_tokens=1, seeds=3,
                            eos_id=None)
    rejected = 1.0 - out.accepted.mean()
    sd = np.sqrt(max(expect * (1 - expect), 1e-12) / N)
    assert abs(rejected - expect) <= 5 * sd + 1e-9, (alpha, rejected, expect)
  assert ref.tv(p, q) > 0.05  # the models disagree at that position
