"""The host-side result of a decode (:class:`DecodeResult`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from specdec_jax.decoding import transfer


@dataclasses.dataclass
class DecodeResult:
  """Host-side result of a decode (``decoding.decode`` / ``generate``).

  Attributes:
    tokens: [B, max_new_tokens] int32 generated ids, ``pad_id`` after the end
      (an EOS, when hit, is included).
    lengths: [B] number of generated tokens.
    drafted, accepted: [B] draft tokens proposed to / accepted by the
      verifier (the top level).
    verifier_calls: [B] calls of the verifier (the top level).
    drafter_calls: [B] calls of every model below it.
    deferrals: [B] float summed deferral mass.
    finite: [B] bool, False where a NaN/inf logit was met.
    calls, level_drafted, level_accepted, level_rejected: [B, K] the same
      counters per level of the stack (cheapest first; K = 2 for a
      drafter/verifier pair); ``level_rejected`` counts the verification
      rounds that ended with a rejection.
    trace: per-block trace (``return_trace=True``), else None: a dict of
      ``drafts`` [B, blocks, gamma], ``accept`` [B, blocks, gamma] bool (the
      accept test of every draft), ``accepted`` [B, blocks] (leading drafts
      kept; -1 where the row ran no such block) and ``token`` [B, blocks]
      (the residual or bonus token emitted after them).
  """

  tokens: np.ndarray
  lengths: np.ndarray
  drafted: np.ndarray
  accepted: np.ndarray
  verifier_calls: np.ndarray
  drafter_calls: np.ndarray
  deferrals: np.ndarray
  finite: np.ndarray
  calls: np.ndarray | None = None
  level_drafted: np.ndarray | None = None
  level_accepted: np.ndarray | None = None
  level_rejected: np.ndarray | None = None
  trace: dict | None = None

  def sequences(self) -> list[list[int]]:
    """Generated tokens of each row, without padding."""
    return [list(map(int, t[:n])) for t, n in zip(self.tokens, self.lengths)]

  @property
  def acceptance_rate(self) -> float:
    """Accepted drafts / drafted tokens, over the batch (nan if no drafts)."""
    d = self.drafted.sum()
    return float(self.accepted.sum() / d) if d else float("nan")

  @property
  def block_efficiency(self) -> float:
    """Generated tokens per verifier call, over the batch."""
    c = self.verifier_calls.sum()
    return float(self.lengths.sum() / c) if c else float("nan")

  @property
  def mean_accepted_length(self) -> np.ndarray:
    """[B] tokens per verifier call of each row."""
    return self.lengths / np.maximum(self.verifier_calls, 1)

  @property
  def deferral_rate(self) -> float:
    """Deferral mass per generated token, over the batch."""
    n = self.lengths.sum()
    return float(self.deferrals.sum() / n) if n else float("nan")

  def level_acceptance(self) -> list[float]:
    """Acceptance rate (accepted / drafted tokens) of each level over the
    level below (level 0: nan)."""
    d, a = self.level_drafted.sum(0), self.level_accepted.sum(0)
    return [float(x / y) if y else float("nan") for x, y in zip(a, d)]

  def level_alpha(self) -> list[float]:
    """Measured alpha of each adjacent pair (level 0: nan): the fraction
    of accept tests passed, accepted / (accepted + rejections); for
    i.i.d. acceptance this estimates E[sum_v min(q, p)]."""
    a, r = self.level_accepted.sum(0), self.level_rejected.sum(0)
    return [float(x / (x + y)) if x + y else float("nan")
            for x, y in zip(a, r)]

  def summary(self) -> dict[str, float]:
    """Aggregates as a flat dict (for JSONL / tables)."""
    return dict(tokens=int(self.lengths.sum()),
                acceptance_rate=self.acceptance_rate,
                block_efficiency=self.block_efficiency,
                deferral_rate=self.deferral_rate,
                verifier_calls=int(self.verifier_calls.sum()),
                drafter_calls=int(self.drafter_calls.sum()))

  def row_stats(self, i: int) -> dict[str, Any]:
    """Per-row statistics of row ``i``."""
    return dict(tokens=int(self.lengths[i]), drafted=int(self.drafted[i]),
                accepted=int(self.accepted[i]),
                verifier_calls=int(self.verifier_calls[i]),
                drafter_calls=int(self.drafter_calls[i]),
                deferrals=float(self.deferrals[i]),
                mean_accepted_length=float(self.mean_accepted_length[i]))


def result(out, batch: int, width: int) -> DecodeResult:
  """DecodeResult of a LoopOutput (device arrays) for the first ``batch``
  rows (the rest is mesh padding)."""
  out = jax.tree.map(lambda x: transfer.gather(x)[:batch], out)
  stack = lambda f: np.stack([getattr(lv, f) for lv in out.levels], axis=1)
  calls = stack("calls")  # [B, K]
  trace = None
  if out.trace is not None:
    blocks = max(1, int(out.levels[-1].calls.max()))
    trace = {f.name: getattr(out.trace, f.name)[:, :blocks]
             for f in dataclasses.fields(out.trace)}
  return DecodeResult(
      tokens=out.tokens[:, :width], lengths=out.num_out,
      drafted=out.levels[-1].drafted, accepted=out.levels[-1].accepted,
      verifier_calls=calls[:, -1], drafter_calls=calls[:, :-1].sum(1),
      deferrals=out.deferrals, finite=out.finite, calls=calls,
      level_drafted=stack("drafted"), level_accepted=stack("accepted"),
      level_rejected=stack("rejected"), trace=trace)


def raise_nonfinite(res: DecodeResult) -> None:
  """FloatingPointError naming the rows that met NaN/inf logits, if any."""
  if res.finite.all():
    return
  rows = np.nonzero(~res.finite)[0].tolist()
  raise FloatingPointError(
      f"non-finite logits (NaN/inf) from the drafter or verifier in rows "
      f"{rows}; the parameters are corrupt or overflow in this dtype "
      f"(try float32); pass on_nonfinite='return' to get partial output")
