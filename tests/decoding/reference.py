"""Independent numpy reference of the sampling transforms and targets.

Written from ../shared/reference/algorithms.md, not from the library code, so
the statistical tests check the formulas as well as the sampling machinery.
All float64.
"""

import numpy as np


def softmax(x):
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def transform(logits, temperature=1.0, top_p=1.0):
  """S(.): temperature (0 = one-hot argmax) then nucleus truncation."""
  logits = np.asarray(logits, np.float64)
  if temperature == 0:
    return np.eye(logits.shape[-1])[logits.argmax(-1)]
  probs = softmax(logits / temperature)
  if top_p >= 1.0:
    return probs
  out = np.zeros_like(probs)
  for idx in np.ndindex(probs.shape[:-1]):
    row = probs[idx]
    order = np.argsort(-row, kind="stable")
    mass, keep = 0.0, []
    for i in order:
      keep.append(i)
      mass += row[i]
      if mass >= top_p:
        break
    kept = np.zeros_like(row)
    kept[keep] = row[keep]
    out[idx] = kept / kept.sum()
  return out


def tv(a, b):
  return 0.5 * np.abs(a - b).sum(-1)


def entropy(d):
  d = np.where(d > 0, d, 1.0)
  return -(d * np.log(d)).sum(-1) * 1.0


def _loss(d, loss):
  return 1 - d.max(-1) if loss == "0-1" else entropy(d)


def _tuned_beta(a, sp):
  lo, hi = 1.0, 1e6
  f = lambda b: np.maximum(a, sp / b).sum()
  if f(hi) > 1:
    return hi
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if f(mid) > 1 else (lo, mid)
  return hi


def target(name, q, p, sq, sp, alpha=0.0, beta=1.0, loss="0-1"):
  """pi = T(q, p) for one position (1-D arrays), per algorithms.md."""
  if name == "spec_decode":
    return sp
  if name in ("lossy", "lossy_tuned"):
    a = np.minimum(sq, sp / (1 - alpha))
    b = _tuned_beta(a, sp) if name == "lossy_tuned" else beta
    return np.maximum(a, sp / b)
  if name in ("chow", "diff", "opt", "bild_star_tv", "bild_star_kl"):
    if name == "chow":
      delta = _loss(q, loss) > alpha
    elif name == "diff":
      delta = _loss(q, loss) > _loss(p, loss) + alpha
    elif name == "opt":
      delta = _loss(q, loss) > _loss(p, loss) + alpha * tv(sp, sq)
    elif name == "bild_star_tv":
      delta = tv(p, q) > alpha
    else:
      delta = (p * (np.log(p) - np.log(q))).sum() > alpha
    return sp if delta else sq
  if name in ("token_v1", "token_v2", "token_v3"):
    if name == "token_v1":
      r = q < p.max() - alpha
    elif name == "token_v2":
      r = p < p.max() - alpha
    else:
      r = p < (1 - alpha) * p.max()
    eta = (r * sq).sum()
    return sq * (1 - r) + sp * eta
  raise ValueError(name)


def effective(pi, sq):
  """Law of one Alg. 4 position drafting from sq toward pi."""
  kept = np.minimum(sq, pi)
  res = np.maximum(pi - sq, 0)
  z = res.sum()
  res = res / z if z > 0 else pi / pi.sum()
  return kept + (1 - kept.sum()) * res
