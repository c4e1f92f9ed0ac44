"""Shared pieces of the serving tests: a tiny 3-level stack and the offline
reference decode of an engine request."""

import functools

import numpy as np

from specdec_jax import decoding
from specdec_jax.decoding import inputs as inputs_lib
from specdec_jax.serving import Engine, EngineRequest, Speculation
from specdec_jax.serving.recipes import parse_speculation
from tests.decoding import pairs


@functools.lru_cache(maxsize=None)
def levels(family: str = "gemma"):
  """[(drafter, params), (middle, params), (target, params)], tiny models."""
  q, p, qp, pp = pairs.tiny_pair(family)
  mid = pairs._noisy(pp, 7, 0.02)  # pylint: disable=protected-access
  return ((q, qp), (p, mid), (p, pp))


def engine(family: str = "gemma", **kw) -> Engine:
  kw = {"slots": 2, "max_prompt": 16, "max_tokens": 12, "steps": 2,
        "max_pools": 8, **kw}
  return Engine(levels(family), **kw)


def _rid(req: EngineRequest, encdec: bool) -> int:
  """The engine's default request id (the prompt hash of ``generate``)."""
  if req.request_id is not None:
    return req.request_id
  row = np.zeros((1, 16), np.int64)
  row[0, :len(req.prompt)] = req.prompt
  if encdec:
    prompt, plen, inputs = np.zeros((1, 16), np.int64), np.asarray([1]), row
  else:
    prompt, plen, inputs = row, np.asarray([len(req.prompt)]), None
  return int(inputs_lib.default_request_ids(prompt, plen, inputs,
                                            np.asarray([req.seed]))[0])


def offline(reqs, width: int = 16, family: str = "gemma"):
  """``decoding.generate`` (or ``generate_hierarchy``) of the requests.

  Requests with the same static choices go in one call (per-row budgets,
  seeds and request ids): every draw is keyed by (seed, request id,
  position), so a row's tokens are those of the request decoded alone
  (tests/decoding checks that batch invariance); one call per group keeps
  the compiles few. A single request gives its token list.
  """
  if isinstance(reqs, EngineRequest):
    return offline([reqs], width, family)[0]
  groups = {}
  for i, r in enumerate(reqs):
    groups.setdefault((r.speculation, r.method, r.knobs, r.temperature,
                       r.top_k), []).append(i)
  out = [None] * len(reqs)
  lv = levels(family)
  encdec = lv[-1][0].is_encoder_decoder
  for (spec, name, knobs, temperature, top_k), rows in groups.items():
    sampling = (decoding.Temperature(temperature) if top_k is None else
                decoding.TopK(top_k, temperature))
    rows_in = [list(reqs[i].prompt) for i in rows]
    common = dict(sampling=sampling,
                  **{("inputs" if encdec else "prompts"): rows_in},
                  max_new_tokens=[reqs[i].max_tokens for i in rows],
                  seeds=[reqs[i].seed for i in rows], pad_to=width,
                  request_ids=[_rid(reqs[i], encdec) for i in rows])
    method = decoding.make_method(name, **dict(knobs))
    if spec.mode == "hierarchy":
      res = decoding.generate_hierarchy(list(lv), list(spec.buffers),
                                        method=method, **common)
    else:
      (q, qp), (p, pp) = lv[-2], lv[-1]
      if spec.mode == "off":
        method, extra = decoding.TargetOnly(), {}
      elif spec.mode == "chain":
        extra = {"gamma": spec.gamma}
      else:
        extra = {"tree": decoding.Tree(decoding.Topology.kary(*spec.kary))}
      res = decoding.generate(method, q, p, qp, pp, **common, **extra)
    for i, seq in zip(rows, res.sequences()):
      out[i] = seq
  return out


def requests(n: int, seed: int, specs, temps, methods=("spec_decode",),
             vocab: int = 64, max_tokens: int = 12):
  """n requests cycling over specs x temperatures x methods."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    method = methods[i % len(methods)]
    knobs = (("alpha", 0.3),) if method == "token_v3" else ()
    out.append(EngineRequest(
        prompt=tuple(int(x) for x in rng.integers(2, vocab,
                                                   size=int(rng.integers(1, 9)))),
        max_tokens=int(rng.integers(3, max_tokens + 1)),
        speculation=parse_speculation(specs[i % len(specs)], depth=3),
        method=method, knobs=knobs, temperature=temps[i % len(temps)],
        seed=int(rng.integers(0, 1000))))
  return out


def drive(eng: Engine, reqs) -> list[list[int]]:
  """Runs requests through the engine, inserting each as soon as its pool
  has a free slot (so requests join pools mid-flight)."""
  out = [[] for _ in reqs]
  waiting, live = list(range(len(reqs))), {}
  while waiting or live:
    for i in list(waiting):
      pre = eng.prefill(reqs[i])
      pool = eng.pool(pre)
      slot = pool.free_slot()
      if slot is None:
        continue
      eng.insert(pre, pool, slot)
      live[(pre.key, slot)] = i
      waiting.remove(i)
      break  # one insert per round: the others join later
    for pool in list(eng.pools.values()):
      res = eng.generate(pool)
      for slot, toks in res.tokens.items():
        i = live[(pool.recipe.key, slot)]
        out[i] += toks
        if res.done[slot]:
          eng.free(pool, slot)
          del live[(pool.recipe.key, slot)]
  return out
