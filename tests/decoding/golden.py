"""Golden tokens: every method's output, pinned before the decoding core was
reshaped (issue 12), so any later change to the loops is checked against it.

Recorded with ``python -m tests.decoding.golden --record`` on the commit that
preceded the reshaping (fe5d16d); retrained default pairs are added with
``--record_new`` (which keeps the tiny pairs' original record). The test
``test_golden_tokens.py`` replays every case and compares tokens and
counters exactly.

Cases: every method of the registry, both built-in default pairs (keyed by
the fingerprint of their shipped weights, so a retrained pair is recorded
anew rather than compared against another model's tokens) and the two tiny
random test pairs; 8 prompts greedy (rows 0-7) and the same 8 prompts at
temperature 1 (rows 8-15) in ONE call (per-row temperature), explicit seeds
and request ids. Greedy-only methods decode the 8 greedy rows only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import numpy as np

from specdec_jax import decoding

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                    "golden_tokens.json")
GAMMA = 3
MAX_NEW = 12
GREEDY_ONLY = ("bild", "lossy_greedy")
KNOBS = {"lossy": dict(alpha=0.5, beta=1.0), "lossy_tuned": dict(alpha=0.5),
         "lossy_greedy": dict(alpha=0.5), "chow": dict(alpha=0.5),
         "diff": dict(alpha=0.1), "opt": dict(alpha=0.5),
         "chow_log": dict(alpha=2.0), "diff_log": dict(alpha=0.1),
         "opt_log": dict(alpha=0.5), "token_v1": dict(alpha=0.2),
         "token_v2": dict(alpha=0.2), "token_v3": dict(alpha=0.5),
         "bild_star": dict(alpha=0.3), "token_cascade": dict(alpha=0.5),
         "oracle_diff": dict(alpha=0.1), "oracle_opt": dict(alpha=0.5),
         "seq_cascade": dict(alpha=0.5),
         "bild": dict(alpha_fallback=0.5, alpha_rollback=3.0)}
METHOD_NAMES = ("target_only", "drafter_only", "spec_decode", "lossy",
                "lossy_tuned", "lossy_greedy", "chow", "diff", "opt",
                "chow_log", "diff_log", "opt_log", "token_v1", "token_v2",
                "token_v3", "bild_star", "bild", "token_cascade",
                "oracle_diff", "oracle_opt", "seq_cascade")


def fingerprint(params) -> str:
  """sha256 of a parameter tree's leaves (names, shapes, bytes)."""
  import jax  # pylint: disable=g-import-not-at-top
  h = hashlib.sha256()
  for path, leaf in sorted(jax.tree_util.tree_flatten_with_path(params)[0],
                           key=lambda kv: jax.tree_util.keystr(kv[0])):
    arr = np.asarray(leaf)
    h.update(jax.tree_util.keystr(path).encode())
    h.update(str(arr.shape).encode() + str(arr.dtype).encode())
    h.update(np.ascontiguousarray(arr).tobytes())
  return h.hexdigest()[:16]


def pairs():
  """name -> (drafter, verifier, q_params, p_params, generate kwargs)."""
  from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
  from tests.decoding.pairs import random_prompts, tiny_pair  # pylint: disable=g-import-not-at-top
  out = {}
  for name in default_models.PAIRS:
    pair = default_models.load(name)
    exs = default_models.examples(name, "test", limit=8)
    fp = fingerprint(pair.p_params)[:8] + fingerprint(pair.q_params)[:8]
    out[f"{name}@{fp}"] = (pair.drafter, pair.verifier, pair.q_params,
                           pair.p_params, pair.encode(exs))
  for family in ("gemma", "t5"):
    d, v, qp, pp = tiny_pair(family)
    rows = random_prompts(np.random.default_rng(5), 8, v.vocab_size, 2, 9)
    kw = {"inputs": rows} if family == "t5" else {"prompts": rows}
    out[f"tiny_{family}"] = (d, v, qp, pp, kw)
  return out


def run_case(method_name: str, pair) -> dict:
  d, v, qp, pp, kw = pair
  greedy_only = method_name in GREEDY_ONLY
  kw = {k: list(val) * (1 if greedy_only else 2) for k, val in kw.items()}
  n = len(next(iter(kw.values())))
  temps = [0.0] * 8 + [1.0] * (n - 8)
  out = decoding.generate(
      decoding.make_method(method_name, **KNOBS.get(method_name, {})), d, v,
      qp, pp, sampling=decoding.Temperature(temps), gamma=GAMMA,
      max_new_tokens=MAX_NEW, seeds=list(range(10, 10 + n)),
      request_ids=list(range(100, 100 + n)), **kw)
  return dict(tokens=out.sequences(), accepted=out.accepted.tolist(),
              drafted=out.drafted.tolist(),
              verifier_calls=out.verifier_calls.tolist(),
              drafter_calls=out.drafter_calls.tolist(),
              deferrals=[round(float(x), 4) for x in out.deferrals])


def record(path: str = PATH, only_new: bool = False) -> None:
  """Writes the record: every case, or (``only_new``) the new pairs' cases.

  ``only_new`` keeps every case already recorded for a pair that still
  exists (the tiny pairs and unchanged default pairs: their record stays the
  one made before the reshaping), records the pairs that have none (a
  retrained default pair, under its new fingerprint), and drops the cases
  of default pairs whose weights are no longer shipped.
  """
  current = pairs()
  cases = {}
  if only_new and os.path.isfile(path):
    with open(path) as f:
      cases = {k: v for k, v in json.load(f)["cases"].items()
               if k.split("/")[0] in current}
  for pname, pair in current.items():
    if any(k.startswith(pname + "/") for k in cases):
      continue
    for m in METHOD_NAMES:
      cases[f"{pname}/{m}"] = run_case(m, pair)
      print(pname, m, flush=True)
    decoding.clear_compiled()
  with open(path, "w") as f:
    json.dump(dict(gamma=GAMMA, max_new_tokens=MAX_NEW, cases=cases), f,
              indent=0, sort_keys=True)


if __name__ == "__main__":
  ap = argparse.ArgumentParser()
  ap.add_argument("--record", action="store_true",
                  help="record every case anew")
  ap.add_argument("--record_new", action="store_true",
                  help="record only pairs without a record (retrained default "
                  "pairs); keep the others' records")
  a = ap.parse_args()
  if a.record or a.record_new:
    record(only_new=a.record_new)
