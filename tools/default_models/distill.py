"""Distillation data: a teacher's own outputs and its top-k log-probabilities.

The default drafters are distilled from the large model (DistillSpec-style):
on each training input the teacher writes a greedy and a sampled output, and
the student matches the teacher's next-token distribution along those
outputs (and along the ground-truth targets, where it also gets the data
loss). The teacher's distribution is stored once as its top ``K`` ids and
log-probabilities per target position, so the students train without running
the teacher.

A row is a :class:`Row`: model input ids, target ids (no EOS), whether the
cross-entropy on the targets counts (ground truth) and the teacher's top-k at
each target position (the EOS one included):

    t5:    target position j (0-based, EOS at len(targets)) of the decoder
    gemma: sequence = prompt + targets + [EOS]; target position j predicts
           sequence[len(prompt) + j]

``batch(rows, ...)`` builds a ``train.seq2seq_batch`` / ``train.lm_batch``
batch and adds ``teacher_idx`` / ``teacher_logp`` / ``kl_weights``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Sequence

import numpy as np

from tools.default_models import train as train_lib


@dataclasses.dataclass(frozen=True)
class Row:
  """One distillation sequence.

  Attributes:
    inputs: encoder ids (t5, EOS included) or BOS + prompt ids (gemma).
    targets: target ids without EOS.
    data: True for ground truth (cross-entropy counts), False for a teacher
      output (KL only).
    teacher_logp: [n, K] float16 top-k log-probabilities of the teacher at
      the row's first n target positions (n <= len(targets) + 1).
    teacher_idx: [n, K] int16 their ids.
  """

  inputs: tuple[int, ...]
  targets: tuple[int, ...]
  data: bool
  teacher_logp: np.ndarray
  teacher_idx: np.ndarray


def target_start(family: str, inputs: Sequence[int]) -> int:
  """Batch position of a row's first target (0 for t5, len(prompt) - 1)."""
  return 0 if family == "t5" else len(inputs) - 1


def batch(rows: Sequence[Row], make: Callable[[list], dict],
          family: str) -> dict:
  """A training batch of ``rows`` with the teacher fields.

  Args:
    rows: distillation rows.
    make: ``[(inputs, targets)] -> batch`` (``seq2seq_batch`` or
      ``lm_batch`` with the task's buckets and prompt weight).
    family: 't5' or 'gemma'.

  Returns:
    The base batch with ``weights`` zeroed on teacher rows, plus
    ``teacher_idx`` [B, T, K] int32, ``teacher_logp`` [B, T, K] float32 and
    ``kl_weights`` [B, T] float32 (1 on each row's stored target positions).
  """
  base = dict(make([(r.inputs, r.targets) for r in rows]))
  b, t = base["targets"].shape
  k = rows[0].teacher_idx.shape[1]
  idx = np.zeros((b, t, k), np.int32)
  logp = np.zeros((b, t, k), np.float32)
  klw = np.zeros((b, t), np.float32)
  weights = base["weights"].copy()
  for i, r in enumerate(rows):
    if not r.data:
      weights[i] = 0.0
    start = target_start(family, r.inputs)
    n = max(min(len(r.teacher_idx), t - start), 0)
    idx[i, start:start + n] = r.teacher_idx[:n]
    logp[i, start:start + n] = r.teacher_logp[:n]
    klw[i, start:start + n] = 1.0
  base.update(weights=weights, teacher_idx=idx, teacher_logp=logp,
              kl_weights=klw)
  return base


def teacher_rows(model, params, pairs: Sequence[tuple[Sequence[int],
                                                      Sequence[int]]],
                 data: Sequence[bool], make: Callable[[list], dict],
                 family: str, k: int = 32, batch_size: int = 64,
                 log: Callable[[str], None] | None = None) -> list[Row]:
  """Rows with the teacher's top-k along each (inputs, targets) pair.

  Args:
    model, params: the teacher.
    pairs: [(inputs, targets)] (targets without EOS).
    data: per pair, True for ground truth.
    make: batch maker with prompt weight 0 (target positions have weight > 0,
      everything else 0).
    family: 't5' or 'gemma'.
    k: ids kept per position.
    batch_size: rows per teacher forward (pairs are length-sorted).
    log: progress printer.

  Returns:
    Rows in the order of ``pairs``.
  """
  topk = train_lib.make_teacher_topk(model, k)
  order = sorted(range(len(pairs)),
                 key=lambda i: (len(pairs[i][0]), len(pairs[i][1])))
  out: list[Row | None] = [None] * len(pairs)
  for n_done, lo in enumerate(range(0, len(order), batch_size)):
    idx = order[lo:lo + batch_size]
    b = make([pairs[i] for i in idx])
    logp, ids = (np.asarray(x) for x in topk(params, b))  # [B, T, k] each
    for j, i in enumerate(idx):
      x, y = pairs[i]
      mask = b["weights"][j] > 0  # [T]: the row's target positions
      start = target_start(family, x)
      n = int(mask.sum())
      out[i] = Row(tuple(map(int, x)), tuple(map(int, y)), bool(data[i]),
                   logp[j, start:start + n].astype(np.float16),
                   ids[j, start:start + n].astype(np.int16))
    if log and n_done % 20 == 0:
      log(f"teacher top-{k}: {min(lo + batch_size, len(order))}/"
          f"{len(order)} rows")
  return out


def save_rows(path: str, rows: Sequence[Row]) -> None:
  """Writes rows to one ``.npz`` (ragged arrays with offsets)."""
  cat = lambda xs, dt: (np.concatenate([np.asarray(x, dt) for x in xs])
                        if xs else np.zeros((0,), dt))
  lens = lambda xs: np.asarray([len(x) for x in xs], np.int64)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + ".tmp.npz"
  np.savez(tmp, inputs=cat([r.inputs for r in rows], np.int32),
           input_lens=lens([r.inputs for r in rows]),
           targets=cat([r.targets for r in rows], np.int32),
           target_lens=lens([r.targets for r in rows]),
           data=np.asarray([r.data for r in rows], bool),
           teacher_logp=np.concatenate([r.teacher_logp for r in rows]),
           teacher_idx=np.concatenate([r.teacher_idx for r in rows]),
           teacher_lens=lens([r.teacher_idx for r in rows]))
  os.replace(tmp, path)


def load_rows(path: str) -> list[Row]:
  """Reads rows written by :func:`save_rows`."""
  with np.load(path) as f:
    split = lambda a, n: np.split(f[a], np.cumsum(f[n])[:-1])
    inputs = split("inputs", "input_lens")
    targets = split("targets", "target_lens")
    logp = split("teacher_logp", "teacher_lens")
    ids = split("teacher_idx", "teacher_lens")
    data = f["data"]
  return [Row(tuple(map(int, x)), tuple(map(int, y)), bool(d), lp, ix)
          for x, y, d, lp, ix in zip(inputs, targets, data, logp, ids)]


__all__ = ["Row", "batch", "load_rows", "save_rows", "target_start",
           "teacher_rows"]
